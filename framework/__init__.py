"""A distributed-job framework on Apache ZooKeeper, written with trio.

Layers: :mod:`framework.zk` (trio bridge over kazoo), :mod:`framework.zkserver` (a real
ZooKeeper for tests and demos), :mod:`framework.primitives` (the coordination recipes),
:mod:`framework.runtime` (masters and workers); beside them :mod:`framework.blobstore` (data
several hosts share, named by a ``file://`` or ``s3://`` URL).
"""

import importlib
from typing import TYPE_CHECKING, Any

from framework import errors
from framework.errors import (
    BadVersionError,
    ClaimLost,
    ConfigurationError,
    ConnectionLossError,
    DataTooLargeError,
    FrameworkError,
    InvalidPathError,
    LeadershipLost,
    LockLost,
    LockRevoked,
    LockTimeout,
    NoAuthError,
    NodeExistsError,
    NoNodeError,
    NotConnectedError,
    NotEmptyError,
    OwnershipLost,
    PermanentFailure,
    SessionExpiredError,
    SessionInterrupted,
    TransactionFailedError,
    ZooKeeperError,
)

# Everything else is imported on first use (PEP 562), so `import framework.zk` does not
# load the runtime, the server launcher or rich.
_LAZY: dict[str, str] = {
    "tls_server_stream": "framework.linktls",
    "tls_client_stream": "framework.linktls",
    "check_bindable": "framework.addresses",
    "route_address": "framework.addresses",
    "open_listeners": "framework.addresses",
    "choose_endpoint": "framework.addresses",
    "LinkTls": "framework.linktls",
    "Endpoint": "framework.addresses",
    "App": "framework.runtime",
    "Barrier": "framework.primitives",
    "BlobMissing": "framework.blobstore",
    "BlobStore": "framework.blobstore",
    "BlockingClient": "framework.runtime",
    "ChildrenSnapshot": "framework.zk",
    "Client": "framework.runtime",
    "ConfigStore": "framework.primitives",
    "DataSnapshot": "framework.zk",
    "DoubleBarrier": "framework.primitives",
    "Election": "framework.primitives",
    "Group": "framework.primitives",
    "Lock": "framework.primitives",
    "Master": "framework.runtime",
    "MasterContext": "framework.runtime",
    "Membership": "framework.primitives",
    "QueueItem": "framework.primitives",
    "ReadWriteLock": "framework.primitives",
    "Rendezvous": "framework.primitives",
    "RevocableLock": "framework.primitives",
    "Session": "framework.zk",
    "SessionState": "framework.zk",
    "StateChange": "framework.zk",
    "Service": "framework.runtime",
    "StoreUnavailable": "framework.blobstore",
    "Task": "framework.runtime",
    "TaskResult": "framework.runtime",
    "Term": "framework.primitives",
    "Transaction": "framework.zk",
    "TwoPhaseCoordinator": "framework.primitives",
    "TwoPhaseSite": "framework.primitives",
    "WorkQueue": "framework.primitives",
    "Worker": "framework.runtime",
    "ZooKeeperEnsemble": "framework.zkserver",
    "configure_logging": "framework.logs",
    "get_logger": "framework.logs",
    "open_store": "framework.blobstore",
    "single_body_error": "framework.zk.scopes",
    "store_location": "framework.blobstore",
    "task": "framework.runtime",
    "watch_children": "framework.zk",
    "watch_data": "framework.zk",
}

if TYPE_CHECKING:
    from framework.addresses import (
        Endpoint,
        check_bindable,
        choose_endpoint,
        open_listeners,
        route_address,
    )
    from framework.blobstore import (
        BlobMissing,
        BlobStore,
        StoreUnavailable,
        open_store,
        store_location,
    )
    from framework.linktls import (
        LinkTls,
        tls_client_stream,
        tls_server_stream,
    )
    from framework.logs import (
        configure_logging,
        get_logger,
    )
    from framework.primitives import (
        Barrier,
        ConfigStore,
        DoubleBarrier,
        Election,
        Group,
        Lock,
        Membership,
        QueueItem,
        ReadWriteLock,
        Rendezvous,
        RevocableLock,
        Term,
        TwoPhaseCoordinator,
        TwoPhaseSite,
        WorkQueue,
    )
    from framework.runtime import (
        App,
        BlockingClient,
        Client,
        Master,
        MasterContext,
        Service,
        Task,
        TaskResult,
        Worker,
        task,
    )
    from framework.zk import (
        ChildrenSnapshot,
        DataSnapshot,
        Session,
        SessionState,
        StateChange,
        Transaction,
        watch_children,
        watch_data,
    )
    from framework.zk.scopes import (
        single_body_error,
    )
    from framework.zkserver import (
        ZooKeeperEnsemble,
    )


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'framework' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "tls_server_stream",
    "tls_client_stream",
    "check_bindable",
    "route_address",
    "open_listeners",
    "choose_endpoint",
    "LinkTls",
    "Endpoint",
    "App",
    "BadVersionError",
    "Barrier",
    "BlobMissing",
    "BlobStore",
    "BlockingClient",
    "ChildrenSnapshot",
    "ClaimLost",
    "Client",
    "ConfigStore",
    "ConfigurationError",
    "ConnectionLossError",
    "DataSnapshot",
    "DataTooLargeError",
    "DoubleBarrier",
    "Election",
    "FrameworkError",
    "Group",
    "InvalidPathError",
    "LeadershipLost",
    "Lock",
    "LockLost",
    "LockRevoked",
    "LockTimeout",
    "Master",
    "MasterContext",
    "Membership",
    "NoAuthError",
    "NoNodeError",
    "NodeExistsError",
    "NotConnectedError",
    "NotEmptyError",
    "OwnershipLost",
    "PermanentFailure",
    "QueueItem",
    "ReadWriteLock",
    "Rendezvous",
    "RevocableLock",
    "Session",
    "SessionExpiredError",
    "SessionInterrupted",
    "SessionState",
    "StateChange",
    "StoreUnavailable",
    "Task",
    "TaskResult",
    "Term",
    "Transaction",
    "TransactionFailedError",
    "TwoPhaseCoordinator",
    "TwoPhaseSite",
    "WorkQueue",
    "Service",
    "Worker",
    "ZooKeeperEnsemble",
    "ZooKeeperError",
    "configure_logging",
    "errors",
    "get_logger",
    "open_store",
    "single_body_error",
    "store_location",
    "task",
    "watch_children",
    "watch_data",
]
