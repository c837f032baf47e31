"""The session's own liveness: a connection is dead when no *reply* has come for a read timeout.

kazoo declares a connection dead only when a heartbeat ping goes unanswered, and it sends
pings only when it has sent nothing else for a while: every outgoing request resets its timer.
A client that keeps sending requests into a partition (a busy leader) is therefore never
declared dead by kazoo, and its locks, claims and leadership would outlive the server-side
session.  :class:`Liveness` closes that hole the way ZooKeeper's Java client does:

* **Proof of life.**  Every reply to one of our requests (a ping too, but never a watch event,
  which the server sends without hearing from us) proves the server had heard from us when
  that request was *sent*.  ``proof`` is the send time (``time.monotonic``) of the newest
  answered request; the handshake of a (re)connection proves life from its start.
* **Read timeout.**  ``read_timeout`` is 2/3 of the negotiated session timeout (the Java
  client's value).  When ``proof + read_timeout`` passes with no reply waiting on the socket,
  kazoo's connection thread is made to drop the connection (``ConnectionDropped`` raised from
  its ``select``), so the session becomes SUSPENDED however busy the client is.
* **The guarantee.**  The server cannot expire the session before ``proof + session_timeout``
  (it heard from us no earlier than ``proof``), so a body cancelled by ``trusted_until()`` =
  ``proof + read_timeout`` ends at least ``session_timeout / 3`` before anyone else can be given
  what the session owned (minus the trio scheduling delay of the cancellation).

Everything here runs on kazoo's connection thread except :meth:`trusted_until`, which trio
reads; the shared values are single floats and flags, consistent under the GIL.
"""

from __future__ import annotations

import math
import select
import socket
import time
from typing import Any, Callable

from kazoo.exceptions import ConnectionDropped

#: The read timeout as a fraction of the session timeout (ZooKeeper's Java client).
READ_TIMEOUT_FRACTION = 2.0 / 3.0


class Liveness:
    """Tracks the newest proof that the server heard from us, for one kazoo connection handler.

    Install it with :meth:`install` on a ``KazooClient``'s connection handler before the
    client starts; :class:`~framework.zk.bridge.BridgeHandler` calls :meth:`check_select`
    around each of the connection thread's waits.
    """

    def __init__(self, session_timeout: float) -> None:
        self.read_timeout = session_timeout * READ_TIMEOUT_FRACTION
        #: ``(session id, proof)``, replaced as a whole (read by other threads in one go):
        #: the session the proof is about (``None``: none, or it was lost) and the send time
        #: (monotonic) of the newest request the server answered
        self.proven: tuple[int | None, float] = (None, -math.inf)
        #: True while a connection is established and its replies are being timed
        self.armed = False
        self.dropped_connections = 0  # how often the read timeout dropped a connection
        self._sent: dict[int, float] = {}
        self._connect_started = -math.inf
        self._connection: Any = None
        self._given_up = False

    # ------------------------------------------------------------------ trio side

    @property
    def proof(self) -> float:
        return self.proven[1]

    @property
    def session_id(self) -> int | None:
        return self.proven[0]

    def trusted_until(self) -> float:
        """The monotonic time until which the session is provably alive on the server side,
        less a third of the session timeout as the safety margin."""
        return self.proven[1] + self.read_timeout

    def trusted_until_for(self, session_id: int | None) -> float:
        """:meth:`trusted_until` if ``session_id`` is the proven session, else ``-inf``
        (one read of :attr:`proven`: never another session's proof)."""
        proven_id, proof = self.proven
        if session_id is None or proven_id != session_id:
            return -math.inf
        return proof + self.read_timeout

    # ------------------------------------------------------------------ kazoo side

    def install(self, connection: Any) -> None:
        """Wrap the connection handler's handshake, send and header-read steps."""
        self._connection = connection
        connect, submit, read_header = (
            connection._connect, connection._submit, connection._read_header,
        )

        def timed_connect(*args: Any, **kwargs: Any) -> Any:
            self.armed = False
            self._sent.clear()
            self._connect_started = time.monotonic()
            read_timeout_ms, connect_timeout_ms = connect(*args, **kwargs)
            self.read_timeout = read_timeout_ms / 1000.0  # from the negotiated timeout
            self.armed = True
            return read_timeout_ms, connect_timeout_ms

        def timed_submit(request: Any, timeout: float, xid: int | None = None) -> Any:
            if xid is not None:
                # pings (and auth) reuse one xid: keep the oldest unanswered send time, so a
                # late answer to an earlier ping never proves more than it can
                self._sent.setdefault(xid, time.monotonic())
            return submit(request, timeout, xid)

        def timed_read_header(timeout: float) -> Any:
            header, buffer, offset = read_header(timeout)
            sent = self._sent.pop(header.xid, None)  # watch events were never sent by us
            proven_id, proof = self.proven
            if sent is not None and sent > proof:
                self.proven = (proven_id, sent)
            return header, buffer, offset

        connection._connect = timed_connect
        connection._submit = timed_submit
        connection._read_header = timed_read_header

    def connected(self, session_id: int | None) -> None:
        """The handshake of ``session_id`` succeeded (kazoo reports CONNECTED from inside
        it): the server knew the session when the handshake started."""
        self.proven = (session_id, max(self.proven[1], self._connect_started))

    def lost(self) -> None:
        """kazoo reported LOST: the session is gone, whatever the last proof said."""
        self.proven = (None, self.proven[1])

    def give_up(self) -> None:
        """Closing, and the server does not answer: drop the connection now.

        kazoo's ``stop`` waits for the answer to its close request, or for a connection
        attempt to end, for up to a session timeout; a closing client has no reason to.
        Shuts the server socket down, which wakes the connection thread's ``select`` (a
        handshake waits on that socket alone), and makes that ``select`` raise
        ``ConnectionDropped``, after which kazoo, being stopped, ends its loop."""
        self._given_up = True
        sock = getattr(self._connection, "_socket", None)
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # not connected yet, or already closed: nothing waits on it

    def check_select(
        self,
        poll: Callable[[list[Any], list[Any], list[Any], float | None], tuple[list[Any], ...]],
        rlist: list[Any], wlist: list[Any], xlist: list[Any], timeout: float | None,
    ) -> tuple[list[Any], ...]:
        """``poll`` with the wait capped at the read deadline; past it, with no reply waiting
        on the server socket, raise ``ConnectionDropped`` (kazoo then reconnects)."""
        if self._given_up:
            raise ConnectionDropped("closing: ZooKeeper did not answer in time")
        if not self.armed:
            return poll(rlist, wlist, xlist, timeout)
        deadline = self.trusted_until()
        remaining = max(deadline - time.monotonic(), 0.0)
        capped = remaining if timeout is None else min(timeout, remaining)
        ready = poll(rlist, wlist, xlist, capped)
        if self._given_up:
            raise ConnectionDropped("closing: ZooKeeper did not answer in time")
        if time.monotonic() >= deadline and self.armed and not self._reply_waiting(ready[0]):
            self.armed = False
            self.dropped_connections += 1
            raise ConnectionDropped(
                f"no reply from ZooKeeper for {self.read_timeout:.2f}s "
                "(read timeout: 2/3 of the session timeout)"
            )
        return ready

    def _reply_waiting(self, readable: list[Any]) -> bool:
        sock = getattr(self._connection, "_socket", None)
        if sock is None:
            return False
        if sock in readable:
            return True
        try:
            poller = select.poll()
            poller.register(sock.fileno(), select.POLLIN)
            return bool(poller.poll(0))
        except (OSError, ValueError):
            return False
