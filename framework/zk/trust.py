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
* an event loop that was blocked (not paused) finds its scopes extended first if replies
  proved the session meanwhile; the heartbeat lives in the loop, though, so a loop blocked
  past the read timeout is a pause (:mod:`framework.zk.connection`);
* a scope belongs to one session: once the connection knows that session is gone (LOST, or
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


def _cancelled(scope: trio.CancelScope) -> bool:
    """Whether ``scope`` was cancelled, read without trio's side effect: the public
    ``cancel_called`` *cancels* a scope whose deadline has passed when it is read, which is
    exactly what the keeper must decide first.  (tests/test_pause.py checks that trio still
    has this attribute.)"""
    return bool(getattr(scope, "_cancel_called", False))


@attrs.define
class Trust:
    """One armed scope: its session, its cap, and whether its trust deadline ended it.

    ``expired`` is decided once: when the keeper finds the scope cancelled with its
    deadline behind it, or at :meth:`TrustKeeper.disarm` - before the owner cancels the
    scope itself on the way out, so a body that ended on its own is never reported as
    expired, and a body that was ended by the deadline is never reported as finished, even
    if a newer proof of life arrives while it winds down."""

    session_id: int | None
    cap: float = math.inf
    expired: bool = False
    settled: bool = False  # cancelled (by the deadline or otherwise): never touched again


class TrustKeeper(trio.abc.Instrument):
    """The scopes that must end at one session's trust deadline (see the module doc)."""

    def __init__(self, liveness: Liveness) -> None:
        self._liveness = liveness
        self._armed: dict[trio.CancelScope, Trust] = {}
        self._proven_applied: tuple[int | None, float] = (None, -math.inf)
        self._installed = False
        self._closed = False

    # ------------------------------------------------------------------ trio side

    def deadline(self, session_id: int | None) -> float:
        """The trio time until which ``session_id`` is provably alive (``-inf``: it is not
        the session the connection proves, or there is none)."""
        until = self._liveness.trusted_until_for(session_id)
        if until == -math.inf:
            return until
        return trio.current_time() + (until - time.monotonic())

    def arm(self, scope: trio.CancelScope, session_id: int | None) -> Trust:
        """Keep ``scope``'s deadline at ``session_id``'s trust deadline until :meth:`disarm`.
        A closed keeper arms nothing: the scope's deadline is set in the past."""
        trust = Trust(session_id)
        if self._closed:
            scope.deadline = -math.inf
            trust.expired = trust.settled = True
            return trust
        if not self._installed:
            trio.lowlevel.add_instrument(self)
            self._installed = True
        self._armed[scope] = trust
        self._apply(scope, trust, self.deadline(session_id), trio.current_time())
        return trust

    def cap(self, scope: trio.CancelScope, cap: float) -> None:
        """End ``scope`` at ``cap`` at the latest (``inf`` lifts the cap)."""
        trust = self._armed.get(scope)
        if trust is not None:
            trust.cap = cap
            self._apply(scope, trust, self.deadline(trust.session_id), trio.current_time())

    def disarm(self, scope: trio.CancelScope) -> Trust | None:
        """Stop keeping ``scope``; its :class:`Trust`, ``expired`` decided now if it was not
        yet.  Call it before cancelling the scope on the way out."""
        trust = self._armed.pop(scope, None)
        if trust is not None and not trust.settled:
            self._settle(scope, trust, trio.current_time())
        return trust

    def close(self) -> None:
        """The session is closing: extend nothing any more."""
        self._closed = True
        self._armed.clear()
        if self._installed:
            try:
                trio.lowlevel.remove_instrument(self)
            except KeyError:
                pass
            self._installed = False

    # ------------------------------------------------------------------ instrument

    def after_io_wait(self, timeout: float) -> None:
        try:
            self._refresh()
        except Exception:  # trio would remove the instrument: cancel rather than extend
            for scope in list(self._armed):
                scope.deadline = -math.inf
            raise

    def _refresh(self) -> None:
        if not self._armed:
            return
        liveness = self._liveness
        proven = liveness.proven
        applied = self._proven_applied
        if proven[0] == applied[0] and proven[1] < applied[1] + liveness.read_timeout / PROOF_STEP:
            return  # nothing new enough: deadlines lag the proof by under 1/16 read timeout
        self._proven_applied = proven
        now = trio.current_time()
        deadlines: dict[int | None, float] = {}
        for scope, trust in self._armed.items():
            sid = trust.session_id
            if sid not in deadlines:
                deadlines[sid] = self.deadline(sid)
            self._apply(scope, trust, deadlines[sid], now)

    @staticmethod
    def _settle(scope: trio.CancelScope, trust: Trust, now: float) -> bool:
        """If ``scope`` was cancelled, decide ``expired`` (its deadline behind it) and stop
        touching it; True if settled."""
        if _cancelled(scope):
            trust.settled = True
            trust.expired = scope.deadline <= now
        return trust.settled

    @classmethod
    def _apply(cls, scope: trio.CancelScope, trust: Trust, deadline: float,
               now: float) -> None:
        if trust.settled or cls._settle(scope, trust, now):
            return
        wanted = min(deadline, trust.cap)
        if wanted != scope.deadline:
            scope.deadline = wanted
