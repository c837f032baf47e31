"""Where a worker's handler runs: awaited in trio, or a plain ``def`` in a thread or process.

:func:`check_handler` tells, at the worker's start, whether any task type is a plain ``def``
(run in the handler pool) rather than an ``async def``, and turns every async-ness mistake
into a one-line :class:`~framework.errors.ConfigurationError`.  :class:`ThreadCall` records what a
handler thread did, so a thread that returned within its time limit keeps its result even if
trio picks it up late, and one abandoned at its limit is counted until it returns.
"""

from __future__ import annotations

import inspect
import pickle
from typing import TYPE_CHECKING, Any

import attrs

from framework import errors
from framework.runtime.tasks import Task

if TYPE_CHECKING:
    from framework.runtime.task_types import TaskType
    from framework.runtime.worker import Worker

#: Where a plain-def ``handle`` can run (``Worker.handler_pool``).
HANDLER_POOLS = ("thread", "process")


def check_handler(cls: type[Worker], types: dict[str, TaskType]) -> bool:
    """Whether any of ``cls``'s task ``types`` is a plain ``def`` (run in the handler pool);
    a mistake in the worker's async-ness or pool is a one-line :class:`ConfigurationError`
    at start (the types' own mistakes are refused by :func:`~.task_types.collect`)."""
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


def returned(cls: type[Worker], method: str, value: Any) -> Any:
    """A plain-def handler's value; a coroutine (an async-ness mistake) fails for good."""
    if inspect.isawaitable(value):
        if inspect.iscoroutine(value):
            value.close()  # never awaited: no "coroutine was never awaited" warning
        raise errors.PermanentFailure(
            f"{cls.__name__}.{method} is a plain 'def' but returned {type(value).__name__}: "
            "declare it 'async def', or return the result itself"
        )
    return value


def handle_in_process(cls: type[Worker], fields: dict[str, Any], method: str,
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
