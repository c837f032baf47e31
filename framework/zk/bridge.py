"""The one place where kazoo's threads meet trio.

kazoo completes requests on its own threads.  A completion may touch trio only through
``TrioToken.run_sync_soon`` (never ``trio.from_thread.run_sync``, never anything blocking),
and must tolerate the trio run having finished.  kazoo re-runs *every* linked callback when a
later one is linked to a finished result, so callbacks here are idempotent.

Speed: kazoo normally hands every completion callback to a second thread (its completion
queue).  Our callbacks only call ``run_sync_soon``, which never blocks, so
:class:`BridgeHandler` runs callbacks marked ``direct_safe`` right on the connection thread:
one thread hop less per request.  Every other callback (kazoo's own, watches) still goes
through the completion queue as usual.
"""

from __future__ import annotations

import collections
import functools
from typing import Any, Callable

import trio
from kazoo import exceptions as kz
from kazoo.handlers.threading import AsyncResult, SequentialThreadingHandler
from kazoo.handlers.utils import _NONE

from framework import errors

_KAZOO_TO_FRAMEWORK: dict[type[BaseException], type[errors.ZooKeeperError]] = {
    kz.NoNodeError: errors.NoNodeError,
    kz.NodeExistsError: errors.NodeExistsError,
    kz.BadVersionError: errors.BadVersionError,
    kz.NotEmptyError: errors.NotEmptyError,
    kz.NoChildrenForEphemeralsError: errors.NoChildrenForEphemeralsError,
    kz.ConnectionLoss: errors.ConnectionLossError,
    kz.ConnectionClosedError: errors.NotConnectedError,
    kz.SessionExpiredError: errors.SessionExpiredError,
    kz.RolledBackError: errors.RolledBackError,
}


def translate(exc: BaseException) -> BaseException:
    """Map a kazoo exception to the framework's typed error (others pass through)."""
    for kazoo_type, ours in _KAZOO_TO_FRAMEWORK.items():
        if isinstance(exc, kazoo_type):
            new = ours(str(exc) or kazoo_type.__name__)
            new.__cause__ = exc
            return new
    if isinstance(exc, kz.ZookeeperError):
        new = errors.ZooKeeperError(f"{type(exc).__name__}: {exc}")
        new.__cause__ = exc
        return new
    return exc


class _DirectResult(AsyncResult):
    """An ``AsyncResult`` that runs ``direct_safe`` callbacks on the thread that sets it.

    It also offers a lock-free link and read for the trio side: kazoo's ``rawlink`` and
    ``get_nowait`` take the result's lock, which the connection thread holds while it
    completes requests, so under load every request paid two contended lock handoffs.
    """

    def link_direct(self, callback: Callable[[Any], None]) -> None:
        """Run the idempotent ``callback(self)`` once the result is set (maybe twice).

        Lock-free and race-free under the GIL: ``set`` stores the outcome *before* it walks
        the callbacks, and we append *before* we look at the outcome, so at least one of the
        two sides sees the other.
        """
        self._callbacks.append(callback)
        if self._exception is not _NONE:
            callback(self)

    def outcome(self) -> Any:
        """The value of a result known to be set, or raise its exception (lock-free)."""
        exc = self._exception
        if exc is None:
            return self.value
        if exc is _NONE:
            raise RuntimeError("result read before it was set")
        raise exc

    def _do_callbacks(self) -> None:
        for callback in self._callbacks:
            if getattr(callback, "direct_safe", False):
                callback(self)
            elif self._handler.running:
                self._handler.completion_queue.put(functools.partial(callback, self))
            else:
                callback(self)


class BridgeHandler(SequentialThreadingHandler):
    """kazoo's threading handler, with results that wake trio without an extra thread hop."""

    def async_result(self) -> AsyncResult:
        return _DirectResult(self)


class Completions:
    """Hands callables from kazoo's threads to one trio run, coalescing wakeups.

    ``run_sync_soon`` costs a socket write per call.  Under load many completions arrive
    together, so they are queued here and drained by a single ``run_sync_soon`` per burst.
    Ordering argument: a producer appends *before* it looks at ``_scheduled``; the drain
    clears ``_scheduled`` *before* it empties the queue; so an item is either seen by a drain
    already running or schedules a new one (at worst one drain too many, never one too few).
    """

    def __init__(self, token: trio.lowlevel.TrioToken) -> None:
        self._token = token
        self._queue: collections.deque[Callable[[], None]] = collections.deque()
        self._scheduled = False

    def call_soon(self, fn: Callable[[], None]) -> None:
        """Thread-safe and non-blocking: run ``fn()`` in the trio run soon."""
        self._queue.append(fn)
        if not self._scheduled:
            self._scheduled = True
            try:
                self._token.run_sync_soon(self._drain)
            except trio.RunFinishedError:
                pass

    def _drain(self) -> None:
        self._scheduled = False
        queue = self._queue
        while queue:
            queue.popleft()()


def waker(token: trio.lowlevel.TrioToken, event: trio.Event) -> Callable[..., None]:
    """A thread-safe, idempotent callback that sets ``event`` in the trio run of ``token``."""

    def wake(*_args: Any) -> None:
        try:
            token.run_sync_soon(event.set)
        except trio.RunFinishedError:
            pass

    return wake


async def wait_result(async_result: Any, completions: Completions) -> Any:
    """Wait for a kazoo ``IAsyncResult`` without blocking trio; return its value.

    Raises kazoo's exception for a failed request (callers translate it).  Cancelling this
    wait does not withdraw the request: a write's outcome is unknown after cancellation.
    """
    if async_result.ready():
        await trio.lowlevel.checkpoint()
        return async_result.get_nowait()
    task = trio.lowlevel.current_task()
    finished = False

    def resume() -> None:  # runs in trio; at most once, and never after an abort
        nonlocal finished
        if not finished:
            finished = True
            trio.lowlevel.reschedule(task)

    def on_done(_result: Any) -> None:  # runs on a kazoo thread, maybe twice
        completions.call_soon(resume)

    on_done.direct_safe = True  # type: ignore[attr-defined]

    def abort(_raise_cancel: Any) -> trio.lowlevel.Abort:
        nonlocal finished
        finished = True
        return trio.lowlevel.Abort.SUCCEEDED

    if isinstance(async_result, _DirectResult):
        async_result.link_direct(on_done)
        await trio.lowlevel.wait_task_rescheduled(abort)
        return async_result.outcome()
    async_result.rawlink(on_done)
    await trio.lowlevel.wait_task_rescheduled(abort)
    return async_result.get_nowait()
