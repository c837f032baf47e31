"""Run calls concurrently, with the first error raised as itself."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

import trio

from framework import single_body_error

K = TypeVar("K")


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

    with single_body_error():
        async with trio.open_nursery() as nursery:
            for key in dict.fromkeys(keys):
                nursery.start_soon(one, key)
    return results
