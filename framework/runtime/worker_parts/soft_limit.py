"""A soft time limit: an exception raised inside an ``async def`` handler, before its hard limit.

Celery's ``soft_time_limit``: at ``soft_time_limit`` seconds the handler's current ``await``
raises :class:`SoftTimeLimitExceeded`, once; the handler may catch it to clean up (its later
awaits run normally) and return or raise.  The hard ``time_limit`` still holds: a handler
still running at it is cancelled (``time limit exceeded``).  An uncaught
:class:`SoftTimeLimitExceeded` is a failure like any other (retried, then given up).

How: :func:`run_with_soft_limit` drives the handler's coroutine itself and forwards each of
its suspensions to trio inside a fresh cancel scope.  The scope open when the soft deadline
passes is cancelled; its ``Cancelled`` is caught here and :class:`SoftTimeLimitExceeded` is
thrown into the handler's coroutine in its place, so the handler never sees that
cancellation and no cancelled scope is left around it.  A cancellation from outside (the hard
limit, a revoke, the worker's drain or lost session) passes through unchanged.  Only the
handler's own task gets the exception (tasks it started in a nursery do not).

Plain ``def`` handlers (threads, the process pool) get no soft limit: Python cannot raise in
another thread or process at an arbitrary point; only their hard ``time_limit`` applies.
"""

from __future__ import annotations

import types
from collections.abc import Awaitable, Callable, Generator
from typing import Any

import outcome
import trio


class SoftTimeLimitExceeded(Exception):
    """Raised inside an ``async def`` handler at its task's soft time limit."""


async def run_with_soft_limit(call: Callable[[], Awaitable[Any]], soft: float | None) -> Any:
    """``await call()``, with :class:`SoftTimeLimitExceeded` raised inside it once ``soft``
    seconds have passed (``None``: just ``await call()``)."""
    if not soft:
        return await call()
    return await _drive(call().__await__(), trio.current_time() + soft)


@types.coroutine
def _drive(inner: Generator[Any, Any, Any], deadline: float) -> Generator[Any, Any, Any]:
    # trio resumes a task by sending it the outcome of its trap (a cancellation is an
    # ``outcome.Error(Cancelled)``): raised inside a fresh scope, it is caught by that scope
    # only if the scope's deadline (the soft limit) caused it
    resumed: Any = None  # the first send starts the coroutine
    fired = False
    while True:
        try:
            trap = inner.send(resumed)
        except StopIteration as done:
            return done.value
        scope = trio.CancelScope(deadline=float("inf") if fired else deadline)
        try:
            with scope:
                resumed = yield trap
                if isinstance(resumed, outcome.Error) and isinstance(resumed.error,
                                                                    trio.Cancelled):
                    raise resumed.error
        except trio.Cancelled as exc:  # not ours: handed to the handler as trio sent it
            resumed = outcome.Error(exc)
        if scope.cancelled_caught:  # the soft limit, delivered once
            fired = True
            resumed = outcome.Error(SoftTimeLimitExceeded(
                "soft time limit exceeded: clean up and return, the hard limit follows"))
