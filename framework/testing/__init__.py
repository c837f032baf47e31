"""Fault injection and audits for tests and demos: a freezable TCP proxy, real session
expiry, and herd-effect evidence (server watch table, watch fires per session)."""

from framework.testing.faults import expire_session
from framework.testing.herd import count_watch_fires, watchers_by_path
from framework.testing.proxy import TcpProxy

__all__ = ["TcpProxy", "count_watch_fires", "expire_session", "watchers_by_path"]
