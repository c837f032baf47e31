"""Applications for tests/test_lifecycle.py, run in real processes via `framework run`."""

from __future__ import annotations

from typing import Any

import trio

from framework.runtime import Master, MasterContext, Task, Worker


class Quick(Master):
    """A job with nothing to do: ``lead`` returns at once (the job is done)."""

    app_name = "lc-quick"

    async def lead(self, ctx: MasterContext) -> None:
        return


class Together(Worker):
    """Each task waits until ``TOGETHER`` tasks run at once in this process, so the tasks
    finish only if the worker runs that many at a time (``--concurrency``)."""

    app_name = "lc-together"
    concurrency = 1
    TOGETHER = 3

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.running = 0
        self.all_in = trio.Event()

    async def handle(self, task: Task) -> Any:
        self.running += 1
        if self.running >= self.TOGETHER:
            self.all_in.set()
        await self.all_in.wait()
        return {"running_at_once": self.TOGETHER}
