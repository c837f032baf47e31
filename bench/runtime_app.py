"""The application the runtime benchmark runs in real processes (trivial tasks)."""

from __future__ import annotations

import os
import sys
import time

import trio

from framework.runtime import Master, MasterContext, Task, Worker

APP = "bench"


class BenchMaster(Master):
    """Submits BENCH_TASKS trivial tasks, waits until all are done, prints the elapsed time.

    ``BENCH_MODE=backlog``: submits them all (``submit_many``, 5,000 a call), prints
    ``SUBMITTED <seconds>`` and holds leadership (the workers drain what they were told to).
    ``BENCH_MODE=latency``: BENCH_TASKS times, one task submitted and waited for, printing
    ``LATENCY <result visible> <idle>``: seconds until its result record can be read (a
    watch on it: the worker's acknowledging transaction committed), and until ``wait_idle``
    returned after that.  Otherwise it prints ``ELAPSED <seconds> CPU <seconds>``: the time
    from its first submit until ``wait_idle`` returned, and the CPU it used meanwhile."""

    app_name = APP

    async def lead(self, ctx: MasterContext) -> None:
        total = int(os.environ.get("BENCH_TASKS", "0"))
        mode = os.environ.get("BENCH_MODE", "")
        if not total:
            await trio.sleep_forever()  # failover runs: just hold leadership
        if mode == "backlog":
            start = time.perf_counter()
            for offset in range(0, total, 5000):
                await ctx.submit_many(
                    "handle", [{"n": i} for i in range(offset, min(offset + 5000, total))])
            print(f"SUBMITTED {time.perf_counter() - start:.6f}", flush=True)
            await trio.sleep_forever()
        if mode == "latency":
            await ctx.wait_idle()
            for n in range(total):
                start = time.perf_counter()
                task = await ctx.submit("handle", {"n": n})
                await ctx.result(task.id, wait=True)
                visible = time.perf_counter()
                await ctx.wait_idle()
                print(f"LATENCY {visible - start:.6f} {time.perf_counter() - start:.6f}",
                      flush=True)
            return
        start, cpu = time.perf_counter(), time.process_time()
        for offset in range(0, total, 500):
            await ctx.submit_many(
                "handle", [{"n": i} for i in range(offset, min(offset + 500, total))])
        await ctx.wait_idle()
        print(f"ELAPSED {time.perf_counter() - start:.6f} CPU {time.process_time() - cpu:.6f}",
              file=sys.stdout, flush=True)


class BenchWorker(Worker):
    """Returns the task's number.  ``BENCH_STOP_AFTER=K``: after K tasks, prints
    ``DRAINED <first> <last>`` (wall-clock times of the first and the K-th task) and stops."""

    app_name = APP
    concurrency = int(os.environ.get("BENCH_CONCURRENCY", "1"))
    status_interval = 5.0
    stop_after = int(os.environ.get("BENCH_STOP_AFTER", "0"))
    handled = 0
    first = 0.0

    async def handle(self, task: Task) -> int:
        self.handled += 1
        if self.handled == 1:
            self.first = time.time()
        if self.handled == self.stop_after:
            print(f"DRAINED {self.first:.6f} {time.time():.6f}", flush=True)
            self.request_stop()
        return task.payload["n"]
