"""Layer 3: ZooKeeper's coordination recipes as trio structured-concurrency objects.

Each recipe owns its path, follows the seed algorithm (sequential-ephemeral contenders with a
GUID, each watching only its predecessor), and says in its docstring what happens on
SUSPENDED and LOST.
"""

from framework.primitives.barrier import Barrier
from framework.primitives.cache import CachedNode, CacheEvent, NodeCache, TreeCache, TreeView
from framework.primitives.config import ConfigStore, Versioned
from framework.primitives.counter import Counter
from framework.primitives.discovery import Registration, ServiceDiscovery, ServiceInstance
from framework.primitives.double_barrier import DoubleBarrier
from framework.primitives.election import Election, LeaderInfo, Term, is_fence_failure
from framework.primitives.lock import Lock, LockHolding, RevocableLock, request_revoke
from framework.primitives.membership import Group, Membership
from framework.primitives.multilock import MultiLock, MultiLockHolding
from framework.primitives.persistent_node import PersistentNode
from framework.primitives.queue import QueueItem, WorkQueue
from framework.primitives.rendezvous import Rendezvous
from framework.primitives.rwlock import ReadWriteLock
from framework.primitives.semaphore import Lease, Semaphore
from framework.primitives.two_phase import Outcome, TwoPhaseCoordinator, TwoPhaseSite

__all__ = [
    "Barrier",
    "CacheEvent",
    "CachedNode",
    "ConfigStore",
    "Counter",
    "DoubleBarrier",
    "Election",
    "Group",
    "LeaderInfo",
    "Lease",
    "Lock",
    "LockHolding",
    "Membership",
    "NodeCache",
    "MultiLock",
    "MultiLockHolding",
    "Outcome",
    "PersistentNode",
    "QueueItem",
    "ReadWriteLock",
    "Registration",
    "Rendezvous",
    "RevocableLock",
    "Semaphore",
    "ServiceDiscovery",
    "ServiceInstance",
    "Term",
    "TwoPhaseCoordinator",
    "TreeCache",
    "TreeView",
    "TwoPhaseSite",
    "Versioned",
    "WorkQueue",
    "is_fence_failure",
    "request_revoke",
]
