"""A distributed-job framework on Apache ZooKeeper, written with trio.

Layers: :mod:`framework.zk` (trio bridge over kazoo), :mod:`framework.zkserver` (a real
ZooKeeper for tests and demos), :mod:`framework.primitives` (the coordination recipes),
:mod:`framework.runtime` (masters and workers).
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
    "App": "framework.runtime",
    "Barrier": "framework.primitives",
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
    "single_body_error": "framework.zk.scopes",
    "task": "framework.runtime",
    "watch_children": "framework.zk",
    "watch_data": "framework.zk",
}

if TYPE_CHECKING:
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
    "App",
    "BadVersionError",
    "Barrier",
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
    "single_body_error",
    "task",
    "watch_children",
    "watch_data",
]
