"""Layer 1: the session - ZooKeeper's client protocol from trio, with kazoo's records (requests,
watches, protected creates)."""

from framework.zk.acl import TlsConfig
from framework.zk.paths import (
    MAX_DATA_BYTES,
    MAX_REQUEST_BYTES,
    basename,
    join,
    parent,
    validate_component,
    validate_data,
    validate_name,
    validate_path,
)
from framework.zk.protected import (
    create_protected,
    delete_guid_nodes,
    find_guid,
    new_guid,
    sequence_of,
    sort_sequential,
)
from framework.zk.scopes import cleanup_bound, cleanup_scope, gather, single_body_error
from framework.zk.session import Session, Stat, Transaction
from framework.zk.states import SessionState, StateChange
from framework.zk.trust import Trust
from framework.zk.watches import (
    ChildrenSnapshot,
    DataSnapshot,
    wait_created,
    wait_exists,
    wait_gone,
    watch_children,
    watch_data,
)

__all__ = [
    "TlsConfig",
    "cleanup_bound",
    "cleanup_scope",
    "gather",
    "MAX_DATA_BYTES",
    "MAX_REQUEST_BYTES",
    "validate_component",
    "single_body_error",
    "validate_name",
    "ChildrenSnapshot",
    "DataSnapshot",
    "Session",
    "SessionState",
    "Stat",
    "StateChange",
    "Transaction",
    "Trust",
    "basename",
    "create_protected",
    "delete_guid_nodes",
    "find_guid",
    "join",
    "new_guid",
    "parent",
    "sequence_of",
    "sort_sequential",
    "validate_data",
    "validate_path",
    "wait_created",
    "wait_exists",
    "wait_gone",
    "watch_children",
    "watch_data",
]
