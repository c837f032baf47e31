"""The session's own liveness: a connection is dead when no *reply* has come for a read timeout.

A heartbeat that is sent only while the client sends nothing else never fires for a client
that keeps sending requests into a partition (a busy leader); its locks, claims and
leadership would outlive the server-side session.  :class:`Liveness` closes that hole the way
ZooKeeper's Java client does:

* **Proof of life.**  Every reply to one of our requests (a ping too, but never a watch event,
  which the server sends without hearing from us) proves the server had heard from us when
  that request was *sent*.  ``proof`` is the send time (``time.monotonic``) of the newest
  answered request; the handshake of a (re)connection proves life from its start.
* **Read timeout.**  ``read_timeout`` is 2/3 of the negotiated session timeout (the Java
  client's rule).  The connection (:mod:`framework.zk.connection`) drops a connection with no
  proof for a read timeout, so the session becomes SUSPENDED however busy the client is.
* **The guarantee.**  The server cannot expire the session before ``proof + session_timeout``
  (it heard from us no earlier than ``proof``), so a body cancelled by ``trusted_until()`` =
  ``proof + read_timeout`` ends at least ``session_timeout / 3`` before anyone else can be given
  what the session owned (minus the trio scheduling delay of the cancellation).

The connection updates it from the trio thread; other threads (``Session.is_trusted``) read
:attr:`proven`, one tuple replaced as a whole, consistent under the GIL.
"""

from __future__ import annotations

import math

#: The read timeout as a fraction of the session timeout (ZooKeeper's Java client).
READ_TIMEOUT_FRACTION = 2.0 / 3.0


class Liveness:
    """The newest proof that the server heard from one session (see the module doc)."""

    def __init__(self, session_timeout: float) -> None:
        self.read_timeout = session_timeout * READ_TIMEOUT_FRACTION
        #: ``(session id, proof)``, replaced as a whole (read by other threads in one go):
        #: the session the proof is about (``None``: none, or it was lost) and the send time
        #: (monotonic) of the newest request the server answered
        self.proven: tuple[int | None, float] = (None, -math.inf)
        self.dropped_connections = 0  # how often the read timeout dropped a connection

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

    def answered(self, sent: float) -> None:
        """A reply came to a request sent at ``sent`` (monotonic)."""
        proven_id, proof = self.proven
        if sent > proof:
            self.proven = (proven_id, sent)

    def connected(self, session_id: int, started: float, negotiated_timeout: float) -> None:
        """The handshake of ``session_id``, begun at ``started``, succeeded with a session
        timeout of ``negotiated_timeout`` seconds: the server knew the session then."""
        self.read_timeout = negotiated_timeout * READ_TIMEOUT_FRACTION
        self.proven = (session_id, max(self.proven[1], started))

    def lost(self) -> None:
        """The session is gone, whatever the last proof said."""
        self.proven = (None, self.proven[1])
