"""Layer 2: start a real ZooKeeper (standalone or ensemble) for the CLI, demos and tests."""

from framework.zkserver.launcher import (
    Member,
    Placement,
    ServerStartError,
    ZooKeeperEnsemble,
    find_classpath,
    four_letter,
    free_ports,
    watched_paths,
)

__all__ = [
    "Member",
    "Placement",
    "ServerStartError",
    "ZooKeeperEnsemble",
    "find_classpath",
    "four_letter",
    "free_ports",
    "watched_paths",
]
