"""Where a worker's handler runs: awaited in trio, or a plain ``def`` in a thread or process.

:func:`check_handler` tells, at the worker's start, whether ``handle`` is a plain ``def``
(run in the handler pool) or an ``async def``, and turns every async-ness mistake into a
one-line :class:`~framework.errors.ConfigurationError`.  :class:`ThreadCall` records what a
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
    from framework.runtime.worker import Worker

#: Where a plain-def ``handle`` can run (``Worker.handler_pool``).
HANDLER_POOLS = ("thread", "process")


def check_handler(cls: type[Worker]) -> bool:
    """Whether ``cls.handle`` is a plain ``def`` (run in the handler pool) rather than an
    ``async def``; a mistake in either is a one-line :class:`ConfigurationError` at start."""
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
    handle = getattr(cls, "handle", None)
    if not callable(handle):
        raise errors.ConfigurationError(
            f"{name}.handle must be a method ('async def' or 'def'), got a "
            f"{type(handle).__name__}"
        )
    if inspect.iscoroutinefunction(handle):
        if cls.handler_pool == "process":
            raise errors.ConfigurationError(
                f"{name}.handle is 'async def' but handler_pool is 'process': a process "
                "pool runs a plain 'def handle' (drop the 'async', or the process pool)"
            )
        return False
    if inspect.isasyncgenfunction(handle) or inspect.isgeneratorfunction(handle):
        raise errors.ConfigurationError(
            f"{name}.handle must return its result, not yield (it is a generator)"
        )
    if inspect.iscoroutinefunction(inspect.unwrap(handle)):
        raise errors.ConfigurationError(
            f"{name}.handle is a plain function wrapping an 'async def' (a decorator hides "
            "the coroutine): make the wrapper 'async def' too"
        )
    if cls.handler_pool == "process":
        try:
            pickle.dumps(cls)
        except (pickle.PicklingError, AttributeError, TypeError) as exc:
            raise errors.ConfigurationError(
                f"{name} uses handler_pool = 'process', so it must be importable by name "
                f"(a class at module level): {exc}"
            ) from None
    return True


def returned(cls: type[Worker], value: Any) -> Any:
    """A plain-def handler's value; a coroutine (an async-ness mistake) fails for good."""
    if inspect.isawaitable(value):
        if inspect.iscoroutine(value):
            value.close()  # never awaited: no "coroutine was never awaited" warning
        raise errors.PermanentFailure(
            f"{cls.__name__}.handle is a plain 'def' but returned {type(value).__name__}: "
            "declare it 'async def', or return the result itself"
        )
    return value


def handle_in_process(cls: type[Worker], fields: dict[str, Any], task: Task) -> Any:
    """Run ``cls.handle`` in a pool process, on a bare copy of the worker (no session)."""
    worker = cls.__new__(cls)
    worker.__dict__.update(fields)
    return returned(cls, cls.handle(worker, task))


@attrs.define
class ThreadCall:
    """A handler thread: abandoned (its task failed on time) before it finished?  When it
    returned (monotonic) and with what."""

    finished: bool = False
    abandoned: bool = False
    returned_at: float | None = None
    value: Any = None
    error: BaseException | None = None
