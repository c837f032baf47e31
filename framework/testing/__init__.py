"""Fault injection and audits for tests and demos: a freezable TCP proxy, real session
expiry, herd-effect evidence (server watch table, watch fires per session), and hosts in
network namespaces with real partitions (:mod:`framework.testing.netns`)."""

from framework.testing.faults import expire_session
from framework.testing.herd import count_watch_fires, watchers_by_path
from framework.testing.netns import VirtualNetwork, netns_available
from framework.testing.proxy import TcpProxy

__all__ = [
    "TcpProxy",
    "VirtualNetwork",
    "count_watch_fires",
    "expire_session",
    "netns_available",
    "watchers_by_path",
]
