"""Layer 3: ZooKeeper's coordination recipes as trio structured-concurrency objects.

Each recipe owns its path, follows the seed algorithm (sequential-ephemeral contenders with a
GUID, each watching only its predecessor), and says in its docstring what happens on
SUSPENDED and LOST.
"""

from framework.primitives.config import ConfigStore, Versioned
from framework.primitives.election import Election, LeaderInfo, Term
from framework.primitives.membership import Group, Membership
from framework.primitives.rendezvous import Rendezvous

__all__ = [
    "ConfigStore",
    "Election",
    "Group",
    "LeaderInfo",
    "Membership",
    "Rendezvous",
    "Term",
    "Versioned",
]
