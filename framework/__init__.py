"""A distributed-job framework on Apache ZooKeeper, written with trio.

Layers: :mod:`framework.zk` (trio bridge over kazoo), :mod:`framework.zkserver` (a real
ZooKeeper for tests and demos), :mod:`framework.primitives` (the coordination recipes),
:mod:`framework.runtime` (masters and workers).
"""

from framework import errors
from framework.errors import (
    BadVersionError,
    ConfigurationError,
    ConnectionLossError,
    DataTooLargeError,
    FrameworkError,
    InvalidPathError,
    LeadershipLost,
    NodeExistsError,
    NoNodeError,
    NotConnectedError,
    NotEmptyError,
    SessionExpiredError,
    SessionInterrupted,
    TransactionFailedError,
    ZooKeeperError,
)
from framework.logs import configure_logging, get_logger
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
from framework.zkserver import ZooKeeperEnsemble

__all__ = [
    "BadVersionError",
    "ChildrenSnapshot",
    "ConfigurationError",
    "ConnectionLossError",
    "DataSnapshot",
    "DataTooLargeError",
    "FrameworkError",
    "InvalidPathError",
    "LeadershipLost",
    "NoNodeError",
    "NodeExistsError",
    "NotConnectedError",
    "NotEmptyError",
    "Session",
    "SessionExpiredError",
    "SessionInterrupted",
    "SessionState",
    "StateChange",
    "Transaction",
    "TransactionFailedError",
    "ZooKeeperEnsemble",
    "ZooKeeperError",
    "configure_logging",
    "errors",
    "get_logger",
    "watch_children",
    "watch_data",
]
