"""The application the runtime benchmark runs in real processes (trivial tasks)."""

from __future__ import annotations

import os
import sys
import time

import trio

from framework.runtime import Master, MasterContext, Task, Worker

APP = "bench"


class BenchMaster(Master):
    """Submits BENCH_TASKS trivial tasks, waits until all are done, prints the elapsed time."""

    app_name = APP

    async def lead(self, ctx: MasterContext) -> None:
        total = int(os.environ.get("BENCH_TASKS", "0"))
        if not total:
            await trio.sleep_forever()  # failover runs: just hold leadership
        start = time.perf_counter()
        for offset in range(0, total, 500):
            await ctx.submit_many([{"n": i} for i in range(offset, min(offset + 500, total))])
        await ctx.wait_idle()
        print(f"ELAPSED {time.perf_counter() - start:.6f}", file=sys.stdout, flush=True)


class BenchWorker(Worker):
    app_name = APP
    concurrency = int(os.environ.get("BENCH_CONCURRENCY", "1"))
    status_interval = 5.0

    async def handle(self, task: Task) -> int:
        return task.payload["n"]
