"""Fault injection and audits for tests and demos: a freezable TCP proxy, real session
expiry, herd-effect evidence (server watch table, watch fires per session), and hosts in
network namespaces with real partitions (:mod:`framework.testing.netns`), and the one
process harness (:mod:`framework.testing.processes`)."""

from framework.testing.faults import expire_session
from framework.testing.herd import count_watch_fires, watchers_by_path
from framework.testing.netns import VirtualNetwork, netns_available
from framework.testing.processes import Child, Lines, die_with_parent, python_argv, spawn
from framework.testing.proxy import TcpProxy

__all__ = [
    "Child",
    "Lines",
    "TcpProxy",
    "die_with_parent",
    "python_argv",
    "spawn",
    "VirtualNetwork",
    "count_watch_fires",
    "expire_session",
    "netns_available",
    "watchers_by_path",
]
