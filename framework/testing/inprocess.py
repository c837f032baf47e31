"""Run a ``Master`` or ``Worker`` in the background of a trio test, in this process."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TypeVar

import trio

from framework.runtime import Master, Worker, run_component

__all__ = ["running"]

C = TypeVar("C", Master, Worker)


@asynccontextmanager
async def running(component: C, hosts: str, *, chroot: str | None = None,
                  session_timeout: float = 4.0) -> AsyncIterator[C]:
    """Run ``component`` (a ``Master`` or ``Worker`` instance) in the background for the
    block's duration, connected to ``hosts`` (under ``chroot``); yields it.  At the end of
    the block it is cancelled (a worker's claimed tasks go back to the queue, as after a
    crash), unless it has returned by itself (a master whose ``lead`` returned).  An error
    it raises ends the block with that error."""
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: run_component(component, hosts, chroot=chroot,
                                                 session_timeout=session_timeout))
        yield component
        nursery.cancel_scope.cancel()
