"""Server-side faults that need no mock."""

from __future__ import annotations

import threading

import trio
from kazoo.client import KazooClient, KazooState
from kazoo.handlers.threading import KazooTimeoutError

from framework.zk.session import Session


def _close_twin(hosts: str, client_id: tuple[int, bytes], timeout: float) -> None:
    twin = KazooClient(hosts=hosts, client_id=client_id, timeout=timeout)
    expired = threading.Event()

    def watch_state(state: KazooState) -> None:
        if state == KazooState.LOST:
            expired.set()  # the server refused the session: it had expired already

    twin.add_listener(watch_state)
    try:
        twin.start(timeout=10)
    except KazooTimeoutError:
        if not expired.is_set():
            raise
    finally:
        twin.stop()
        twin.close()


async def expire_session(session: Session) -> None:
    """Make the server expire ``session`` for real.

    A second client joins the same session (same id and password) and closes it: the server
    ends the session, deletes its ephemeral nodes and tells the original client it expired
    when it next talks to the server.  This is the classic technique of ZooKeeper's and
    Curator's own test suites.  A session that has expired already is left as it is.
    """
    await trio.to_thread.run_sync(
        _close_twin, session.hosts, session.client_id, session.session_timeout
    )
