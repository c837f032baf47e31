"""Fault injection for tests and demos: a freezable TCP proxy and real session expiry."""

from framework.testing.faults import expire_session
from framework.testing.proxy import TcpProxy

__all__ = ["TcpProxy", "expire_session"]
