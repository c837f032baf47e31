"""Server-side faults that need no mock."""

from __future__ import annotations

import trio
from kazoo.hosts import collect_hosts

from framework.zk.connection import Connection
from framework.zk.liveness import Liveness
from framework.zk.session import Session
from framework.zk.states import SessionState

#: how long the twin may take to reach the server and close the session
TWIN_TIMEOUT = 10.0


async def expire_session(session: Session, *, hosts: str | None = None) -> None:
    """Make the server expire ``session`` for real (through ``hosts`` instead of the
    session's own, when its link may be frozen).

    A second client joins the same session (same id and password) and closes it: the server
    ends the session, deletes its ephemeral nodes and tells the original client it expired
    when it next talks to the server.  This is the classic technique of ZooKeeper's and
    Curator's own test suites.  A session that has expired already is left as it is.
    """
    session_id, password = session.client_id
    members, _chroot = collect_hosts(hosts or session.hosts)
    answered = trio.Event()
    states: list[SessionState] = []

    def on_state(state: SessionState, _session_id: int | None) -> None:
        states.append(state)
        answered.set()

    tls = session.security.tls
    twin = Connection(members, session_timeout=session.session_timeout,
                      liveness=Liveness(session.session_timeout), on_state=on_state,
                      auth_data=session.security.auth_data(),
                      ssl_context=tls.ssl_context() if tls is not None else None)
    twin.session_id, twin.password = session_id, password
    async with trio.open_nursery() as nursery:
        nursery.start_soon(twin.run)
        try:
            with trio.fail_after(TWIN_TIMEOUT):
                await answered.wait()  # CONNECTED in the session, or LOST: expired already
                if states[0] is SessionState.CONNECTED:
                    await twin.close(TWIN_TIMEOUT)
        finally:
            twin.stop()
