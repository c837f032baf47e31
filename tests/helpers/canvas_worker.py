"""A worker running chord members, in a process of its own (kill -9 tests of tests/test_canvas.py).

Usage: ``python canvas_worker.py HOSTS CHROOT APP NAME HANG``.

Task type ``slow_square`` returns its payload squared, except that the first delivery of
payload HANG never returns (a worker stuck in it is killed by the test).  It never holds the
app's duties (the test's own worker drives the canvas).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
os.environ.setdefault("FRAMEWORK_LOG_LEVEL", "warning")


def main() -> None:
    import trio

    from framework import Session
    from framework.runtime import Task, Worker, task

    hosts, chroot, app, name, hang = sys.argv[1:6]

    class Squarer(Worker):
        duties = False
        concurrency = 2
        lease = None  # the stuck task comes back when this process's session expires

        @task
        async def slow_square(self, job: Task) -> int:
            if job.payload == int(hang) and job.attempts == 1:
                print("HANGING", flush=True)
                await trio.sleep_forever()
            return int(job.payload) ** 2

    async def run() -> None:
        async with Session(hosts, chroot=chroot, session_timeout=2.0) as session:
            await Squarer(app, name=name).run(session)

    trio.run(run)


if __name__ == "__main__":
    main()
