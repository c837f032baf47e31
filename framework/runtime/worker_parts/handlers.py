"""Where a worker's handler runs: awaited in trio, or a plain ``def`` in a thread or process.

:func:`check_handler` tells, at the worker's start, whether any task type is a plain ``def``
(run in the handler pool) rather than an ``async def``, and turns every async-ness mistake
into a one-line :class:`~framework.errors.ConfigurationError`.  :class:`HandlerPool` runs a
task type's method within the task's time limit (a thread past it is abandoned and counted,
a process past it killed); :class:`ThreadCall` records what a handler thread did, so a thread
that returned within its limit keeps its result even if trio picks it up late.
"""

from __future__ import annotations

import inspect
import math
import pickle
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import attrs
import trio

from framework import errors
from framework.logs import get_logger
from framework.runtime.tasks import Task

if TYPE_CHECKING:
    from framework.runtime.task_types import TaskType
    from framework.runtime.worker_parts.hosts import HandlerHost

log = get_logger(__name__)

#: Where a plain-def ``handle`` can run (``Worker.handler_pool``).
HANDLER_POOLS = ("thread", "process")


def check_handler(cls: type[Any], types: dict[str, TaskType]) -> bool:
    """Whether any of ``cls``'s task ``types`` is a plain ``def`` (run in the handler pool);
    a mistake in the worker's async-ness or pool is a one-line :class:`ConfigurationError`
    at start (the types' own mistakes are refused by
    :func:`~framework.runtime.task_types.collect`)."""
    name = cls.__name__
    for method in ("serve_shard", "on_config"):
        if not inspect.iscoroutinefunction(getattr(cls, method, None)):
            raise errors.ConfigurationError(
                f"{name}.{method} must be 'async def' (it is not): the runtime awaits it"
            )
    if cls.handler_pool not in HANDLER_POOLS:
        raise errors.ConfigurationError(
            f"{name}.handler_pool must be 'thread' or 'process', got {cls.handler_pool!r}"
        )
    blocking = [kind for kind in types.values() if kind.blocking]
    if cls.handler_pool == "process" and types and not blocking:
        first = sorted(types.values(), key=lambda kind: kind.name)[0]
        raise errors.ConfigurationError(
            f"{name}.{first.method} is 'async def' but handler_pool is 'process': a process "
            "pool runs plain 'def' handlers (drop the 'async', or the process pool)"
        )
    if cls.handler_pool == "process" and blocking:
        try:
            pickle.dumps(cls)
        except (pickle.PicklingError, AttributeError, TypeError) as exc:
            raise errors.ConfigurationError(
                f"{name} uses handler_pool = 'process', so it must be importable by name "
                f"(a class at module level): {exc}"
            ) from None
    return bool(blocking)


def returned(cls: type[Any], method: str, value: Any) -> Any:
    """A plain-def handler's value; a coroutine (an async-ness mistake) fails for good."""
    if inspect.isawaitable(value):
        if inspect.iscoroutine(value):
            value.close()  # never awaited: no "coroutine was never awaited" warning
        raise errors.PermanentFailure(
            f"{cls.__name__}.{method} is a plain 'def' but returned {type(value).__name__}: "
            "declare it 'async def', or return the result itself"
        )
    return value


def handle_in_process(cls: type[Any], fields: dict[str, Any], method: str,
                      task: Task) -> Any:
    """Run ``cls.<method>`` in a pool process, on a bare copy of the worker (no session)."""
    worker = cls.__new__(cls)
    worker.__dict__.update(fields)
    return returned(cls, method, getattr(cls, method)(worker, task))


@attrs.define
class ThreadCall:
    """A handler thread: abandoned (its task failed on time) before it finished?  When it
    returned (monotonic) and with what."""

    finished: bool = False
    abandoned: bool = False
    returned_at: float | None = None
    value: Any = None
    error: BaseException | None = None


class HandlerPool:
    """Where a worker's handlers run: awaited in trio, or a plain ``def`` in a thread (or
    process, ``handler_pool = "process"``) pool, within the task's time limit.
    ``stuck_threads`` counts handler threads abandoned at their limit and still running."""

    def __init__(self, worker: HandlerHost) -> None:
        self.worker = worker
        self.stuck_threads = 0
        self._threads_lock = threading.Lock()
        self._pool_limiter = trio.CapacityLimiter(math.inf)
        self._processes: Any = None  # the trio-parallel context of a process pool

    @asynccontextmanager
    async def open(self) -> AsyncIterator[None]:
        """The pool plain-def handlers run in, for as long as the worker runs.  Its
        limiter is unbounded: the slots bound the calls, and an abandoned thread keeps its
        token until it returns."""
        self._pool_limiter = trio.CapacityLimiter(math.inf)
        if not (self.worker.handle_blocks and self.worker.handler_pool == "process"):
            yield
            return
        import trio_parallel  # only a process pool needs it

        async with trio_parallel.open_worker_context(grace_period=1.0) as context:
            self._processes = context
            try:
                yield
            finally:
                self._processes = None

    async def call_within(self, task: Task, kind: TaskType, limit: float | None) -> Any:
        """``kind``'s method on ``task`` within ``limit`` seconds, or
        :class:`trio.TooSlowError`.

        A handler that did not stop at its limit (an ``async def`` blocked in a thread it
        does not abandon, or one that swallowed the cancellation) fails all the same once it
        returns: its result is never recorded as a success."""
        call = ThreadCall()
        if not limit:
            return await self._call(task, kind, call)
        deadline = trio.current_time() + limit
        ends_by = time.monotonic() + limit
        with trio.CancelScope(deadline=deadline) as limited:
            value = await self._call(task, kind, call)
        if call.returned_at is not None and call.returned_at <= ends_by:
            # a thread that returned in time, picked up late (a busy event loop)
            if call.error is not None:
                raise call.error
            return call.value
        if limited.cancelled_caught:
            raise trio.TooSlowError
        ended = time.monotonic() if call.returned_at is None else call.returned_at
        overran = ended - ends_by
        if overran > 0:
            log.warning("task.time_limit_ignored", task=task.id, worker=self.worker.name,
                        limit=limit, overran=round(overran, 3))
            raise trio.TooSlowError
        return value

    async def _call(self, task: Task, kind: TaskType, call: ThreadCall) -> Any:
        """The task type's method on ``task``: awaited, or a plain ``def`` run in the
        thread or process pool (a thread records in ``call`` when it returned, and what)."""
        method = getattr(self.worker, kind.method)
        if not kind.blocking:
            return await method(task)
        if self._processes is not None:
            worker = self.worker
            fields = {"app": worker.app, "name": worker.name, "address": worker.address,
                      "config": worker.config}
            # cancelled (time limit, drain timeout): the process is killed
            return await self._processes.run_sync(handle_in_process, type(self.worker), fields,
                                                  kind.method, task, kill_on_cancel=True,
                                                  limiter=self._pool_limiter)

        def run() -> Any:
            try:
                call.value = returned(type(self.worker), kind.method, method(task))
                return call.value
            except BaseException as exc:
                call.error = exc
                raise
            finally:
                with self._threads_lock:
                    call.finished = True
                    call.returned_at = time.monotonic()
                    if call.abandoned:
                        self.stuck_threads -= 1

        try:
            return await trio.to_thread.run_sync(run, abandon_on_cancel=True,
                                                 limiter=self._pool_limiter)
        except trio.Cancelled:
            # a thread cannot be killed: it runs on, its result will be dropped
            with self._threads_lock:
                if not call.finished:
                    call.abandoned = True
                    self.stuck_threads += 1
            if call.abandoned:
                log.warning("task.thread_abandoned", task=task.id, worker=self.worker.name,
                            stuck_threads=self.stuck_threads)
            raise

