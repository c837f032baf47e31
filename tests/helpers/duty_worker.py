"""A worker that may hold the app's duties, in a process of its own (kill -9 / SIGSTOP tests).

Usage: ``python duty_worker.py HOSTS CHROOT APP NAME SECONDS``.

Its class lists one schedule, ``ticks``: task ``tick`` every SECONDS, ``CatchUp.ALL``.  It
takes only tasks of type ``noop`` (the test's own worker runs the ticks and delayed tasks),
so what this process does for the app is its duties: fire the schedule and move delayed
tasks while it is elected and no master leads.
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
    from framework.runtime import CatchUp, Task, Worker, every, task

    hosts, chroot, app, name, seconds = sys.argv[1:6]

    class Ticker(Worker):
        schedules = [every(float(seconds), "tick", name="ticks", catch_up=CatchUp.ALL)]
        status_interval = 0.05

        @task
        async def noop(self, job: Task) -> None:
            return None

    async def run() -> None:
        async with Session(hosts, chroot=chroot, session_timeout=2.0) as session:
            await Ticker(app, name=name).run(session)

    trio.run(run)


if __name__ == "__main__":
    main()
