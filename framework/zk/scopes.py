"""Scope helpers: bounded clean-up, and context managers that run a body in a nursery."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Protocol

import trio


class _HasTimeout(Protocol):
    @property
    def session_timeout(self) -> float: ...

    @property
    def read_timeout(self) -> float: ...

    @property
    def session_id(self) -> int | None: ...

    def trusted_until(self) -> float: ...


def cleanup_bound(session: _HasTimeout) -> float:
    """Seconds a shielded clean-up of a healthy ``session`` may take: one session timeout and
    a second.  If ZooKeeper could not be reached for that long, the server has expired the
    session (or will, the moment it next hears of it), and its ephemeral nodes went with
    it; a persistent node left behind is a leftover each caller documents."""
    return max(session.session_timeout, 1.0) + 1.0


def cleanup_deadline(session: _HasTimeout) -> float:
    """The trio time a shielded clean-up of ``session`` must end by.

    With a session, a second past the moment the server may expire it: its trust deadline
    plus the last third of the (negotiated) session timeout, that is the newest proof of
    life plus a session timeout and a second - at least :data:`CLEANUP_FLOOR` from now, at
    most :func:`cleanup_bound` from now.  Cut off from ZooKeeper the proof of life stays
    where it was, so every clean-up step of one cancellation shares one deadline.  Without
    a session (LOST, before a new one is connected): :func:`cleanup_bound` from now, time
    for a new session to do the clean-up."""
    now = trio.current_time()
    if session.session_id is None:
        return now + cleanup_bound(session)
    expiry = session.trusted_until() + session.read_timeout / 2  # 2/3 + 1/3 of the timeout
    return min(max(expiry + 1.0, now + CLEANUP_FLOOR), now + cleanup_bound(session))


#: Seconds every clean-up may try, even past the session's possible expiry (a request that
#: is already answered costs nothing; a new session may be connecting).
CLEANUP_FLOOR = 0.2


@contextmanager
def cleanup_scope(session: _HasTimeout) -> Iterator[trio.CancelScope]:
    """A clean-up that runs even when its caller is cancelled, but never past
    :func:`cleanup_deadline` (a second Ctrl-C, or ZooKeeper unreachable, cannot hang it).

    Leaving by the deadline is silent: check ``scope.cancelled_caught`` to know.  The one
    shield-with-deadline of the framework: every shielded clean-up goes through it.
    """
    with trio.CancelScope(shield=True) as scope:
        scope.deadline = cleanup_deadline(session)
        yield scope


@contextmanager
def single_body_error() -> Iterator[None]:
    """Re-raise the one error of a nursery unwrapped.

    A context manager that yields inside a nursery would otherwise hand the caller's own
    exception back wrapped in an ``ExceptionGroup`` (trio's strict exception groups), so
    ``except ValueError`` around ``async with election.leadership():`` would miss it.
    Nested groups of one error each are unwrapped too; groups of several errors pass
    through unchanged.
    """
    try:
        yield
    except BaseExceptionGroup as group:
        if len(group.exceptions) != 1:
            raise
        inner = group.exceptions[0]
        while isinstance(inner, BaseExceptionGroup) and len(inner.exceptions) == 1:
            inner = inner.exceptions[0]
        context, suppress = inner.__context__, inner.__suppress_context__
        try:
            raise inner  # the group was only trio's wrapper
        finally:
            inner.__context__, inner.__suppress_context__ = context, suppress


async def gather(*reads: Callable[[], Awaitable[None]]) -> None:
    """Run ``reads`` concurrently; re-raise the first error as itself (not as a group),
    the others cancelled.  The framework's one gather."""
    if len(reads) <= 1:
        for read in reads:
            await read()
        return
    failures: list[BaseException] = []

    async def run(read: Callable[[], Awaitable[None]]) -> None:
        try:
            await read()
        except Exception as exc:
            failures.append(exc)
            nursery.cancel_scope.cancel()

    async with trio.open_nursery() as nursery:
        for read in reads:
            nursery.start_soon(run, read)
    if failures:
        raise failures[0]
