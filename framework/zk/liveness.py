"""The session's trust: until when the *leader* provably had not expired the session.

Two questions are kept apart (:mod:`framework.zk.connection` answers the first):

* **Is the connection alive?**  The member we are connected to answers: any packet from it
  (a reply, a ping's reply, a watch event) while we wait for an answer.  A member cut off
  from the leader keeps answering pings and reads until its own sync limit runs out, so
  this says nothing about the session on the leader.
* **Is the session alive?**  Only the leader expires sessions.  A reply to a request that
  went through the leader - a write (create, delete, set, check, multi), ``sync``, close,
  or the handshake (a follower asks the leader to revalidate the session) - proves the
  leader had heard from the session no earlier than that request was *sent*.  ``proof``
  is the time (``time.monotonic``) the newest such answered request was written.

* **Read timeout.**  ``read_timeout`` is 2/3 of the negotiated session timeout (the Java
  client's rule).  The connection keeps the proof fresh: when no write has proven the
  session for a third of the read timeout, it sends a ``sync`` (:mod:`framework.zk.connection`).
* **The guarantee.**  The leader cannot expire the session before ``proof +
  session_timeout``, so a body cancelled by ``trusted_until()`` = ``proof + read_timeout``
  ends at least ``session_timeout / 3`` before anyone else can be given what the session
  owned (minus the trio scheduling delay of the cancellation) - also when the client is on
  a follower that is cut off from the leader and still answers pings.

The connection updates it from the trio thread; other threads (``Session.is_trusted``) read
:attr:`proven`, one tuple replaced as a whole, consistent under the GIL.
"""

from __future__ import annotations

import math

#: The read timeout as a fraction of the session timeout (ZooKeeper's Java client).
READ_TIMEOUT_FRACTION = 2.0 / 3.0
#: A ``sync`` refreshes the proof once it is this fraction of the read timeout old.
PROOF_REFRESH_FRACTION = 1.0 / 3.0


class Liveness:
    """The newest proof that the server heard from one session (see the module doc)."""

    def __init__(self, session_timeout: float) -> None:
        self.read_timeout = session_timeout * READ_TIMEOUT_FRACTION
        #: ``(session id, proof)``, replaced as a whole (read by other threads in one go):
        #: the session the proof is about (``None``: none, or it was lost) and the send time
        #: (monotonic) of the newest request answered through the leader
        self.proven: tuple[int | None, float] = (None, -math.inf)
        self.dropped_connections = 0  # how often the read timeout dropped a connection

    @property
    def proof(self) -> float:
        return self.proven[1]

    @property
    def session_id(self) -> int | None:
        return self.proven[0]

    def refresh_due(self) -> float:
        """The monotonic time at which the proof wants refreshing with a ``sync``."""
        return self.proven[1] + self.read_timeout * PROOF_REFRESH_FRACTION

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

    def proved(self, sent: float) -> None:
        """The leader answered a request sent at ``sent`` (monotonic): a write, a sync, a
        close (never a read or a ping, which any member answers by itself)."""
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
