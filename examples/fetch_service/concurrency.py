"""Two small trio helpers: run calls concurrently, and keep one error out of its group."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import trio

K = TypeVar("K")


@contextmanager
def single_error() -> Iterator[None]:
    """Re-raise a nursery's only error as itself, not wrapped in an ``ExceptionGroup``.

    So ``except LeadershipLost`` in the runtime still sees a master's lost term when it was
    detected by a task of one of the master's own nurseries.  Several errors pass unchanged.
    """
    try:
        yield
    except BaseExceptionGroup as group:
        if len(group.exceptions) != 1:
            raise
        inner = group.exceptions[0]
        while isinstance(inner, BaseExceptionGroup) and len(inner.exceptions) == 1:
            inner = inner.exceptions[0]
        raise inner from None


async def map_concurrently(
    keys: Iterable[K], call: Callable[[K], Awaitable[Any]], *, limit: int = 64
) -> dict[K, Any]:
    """``{key: await call(key)}`` with at most ``limit`` calls in flight; the first error
    cancels the others and is raised as itself."""
    limiter = trio.CapacityLimiter(limit)
    results: dict[K, Any] = {}

    async def one(key: K) -> None:
        async with limiter:
            results[key] = await call(key)

    with single_error():
        async with trio.open_nursery() as nursery:
            for key in dict.fromkeys(keys):
                nursery.start_soon(one, key)
    return results
