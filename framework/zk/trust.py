"""Trust deadlines of ownership scopes, kept by trio's scheduler itself.

Every ownership scope (a guarded block, a lock holding, a queue claim, a leadership term)
must end when its session can no longer be proven alive: at ``proof + read_timeout`` (see
:mod:`framework.zk.liveness`).  A process can stop at any instruction (GC, VM migration,
SIGSTOP) and resume long past that moment; the task that watches the session may then run
after the body has taken more steps.  So the deadline is not left to a task: it is the
scope's own trio deadline, which trio's scheduler expires before it runs any task.

:class:`TrustKeeper` is a trio instrument.  After every I/O wait, right before trio expires
deadlines, it moves each armed scope's deadline to the newest proof of life, if a reply has
proven one since the last loop pass (one float comparison per pass otherwise, and at most
:data:`PROOF_STEP` updates per read timeout).  Hence:

* a paused process (every thread stopped, no newer proof) finds its scopes expired and
  cancelled before any of their tasks takes another step;
* an event loop that was merely blocked while kazoo's thread went on receiving replies
  finds its scopes extended first: no false cancellation;
* a scope belongs to one session: once kazoo's thread knows that session is gone (LOST, or
  a new session), the scope's deadline is not extended again.

A scope may also carry a cap (``cap``): the end of a SUSPENDED grace period.
"""

from __future__ import annotations

import math
import time

import attrs
import trio

from framework.zk.liveness import Liveness

#: Deadlines move when the proof has advanced by a sixteenth of the read timeout (under a
#: busy client, every reply advances it: this keeps the updates to a few per read timeout).
PROOF_STEP = 16


@attrs.define
class _Armed:
    session_id: int | None
    cap: float = math.inf


class TrustKeeper(trio.abc.Instrument):
    """The scopes that must end at one session's trust deadline (see the module doc)."""

    def __init__(self, liveness: Liveness) -> None:
        self._liveness = liveness
        self._armed: dict[trio.CancelScope, _Armed] = {}
        self._proof_applied = -math.inf
        self._session_applied: int | None = None
        self._installed = False

    # ------------------------------------------------------------------ trio side

    def deadline(self, session_id: int | None) -> float:
        """The trio time until which ``session_id`` is provably alive (``-inf``: it is not
        the session the connection proves, or there is none)."""
        liveness = self._liveness
        if session_id is None or liveness.session_id != session_id:
            return -math.inf
        return trio.current_time() + (liveness.trusted_until() - time.monotonic())

    def arm(self, scope: trio.CancelScope, session_id: int | None) -> None:
        """Keep ``scope``'s deadline at ``session_id``'s trust deadline until :meth:`disarm`."""
        if not self._installed:
            trio.lowlevel.add_instrument(self)
            self._installed = True
        armed = self._armed[scope] = _Armed(session_id)
        self._apply(scope, armed, self.deadline(session_id))

    def cap(self, scope: trio.CancelScope, cap: float) -> None:
        """End ``scope`` at ``cap`` at the latest (``inf`` lifts the cap)."""
        armed = self._armed.get(scope)
        if armed is not None:
            armed.cap = cap
            self._apply(scope, armed, self.deadline(armed.session_id))

    def disarm(self, scope: trio.CancelScope) -> None:
        self._armed.pop(scope, None)

    def close(self) -> None:
        """The session is closing: extend nothing any more."""
        self._armed.clear()
        if self._installed:
            try:
                trio.lowlevel.remove_instrument(self)
            except KeyError:
                pass
            self._installed = False

    # ------------------------------------------------------------------ instrument

    def after_io_wait(self, timeout: float) -> None:
        liveness = self._liveness
        proof, session_id = liveness.proof, liveness.session_id
        if not self._armed or (session_id == self._session_applied and proof
                               < self._proof_applied + liveness.read_timeout / PROOF_STEP):
            return  # nothing new enough: deadlines lag the proof by under 1/16 read timeout
        self._proof_applied, self._session_applied = proof, session_id
        deadlines: dict[int | None, float] = {}
        for scope, armed in self._armed.items():
            sid = armed.session_id
            if sid not in deadlines:
                deadlines[sid] = self.deadline(sid)
            self._apply(scope, armed, deadlines[sid])

    @staticmethod
    def _apply(scope: trio.CancelScope, armed: _Armed, deadline: float) -> None:
        # not a word about ``scope.cancel_called``: reading it past the deadline cancels
        # the scope (trio's property does), which is exactly what this must decide first;
        # setting the deadline of a cancelled scope changes nothing
        wanted = min(deadline, armed.cap)
        if wanted != scope.deadline:
            scope.deadline = wanted
