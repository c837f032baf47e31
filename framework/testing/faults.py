"""Server-side faults that need no mock."""

from __future__ import annotations

import trio
from kazoo.client import KazooClient

from framework.zk.session import Session


def _close_twin(hosts: str, client_id: tuple[int, bytes], timeout: float) -> None:
    twin = KazooClient(hosts=hosts, client_id=client_id, timeout=timeout)
    twin.start(timeout=10)
    twin.stop()
    twin.close()


async def expire_session(session: Session) -> None:
    """Make the server expire ``session`` for real.

    A second client joins the same session (same id and password) and closes it: the server
    ends the session, deletes its ephemeral nodes and tells the original client it expired
    when it next talks to the server.  This is the classic technique of ZooKeeper's and
    Curator's own test suites.
    """
    await trio.to_thread.run_sync(
        _close_twin, session.hosts, session.client_id, session.session_timeout
    )
