"""A worker that holds the app's duties and so routes its unrouted tasks, in a process of its
own (the kill -9 test of ``tests/test_queue_routing.py``).

Usage: ``python router_worker.py HOSTS CHROOT APP NAME``.

It has the task type ``render`` of queue ``gpu`` (so it registers that type) but serves only
the queue ``idle``, where nothing is ever put: it runs no task, and what it does for the app
is its duties - among them moving the tasks submitted before ``render``'s queue was known into
``gpu``.
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

    hosts, chroot, app, name = sys.argv[1:5]

    class Router(Worker):
        queues = ("idle",)
        status_interval = 0.05

        @task(queue="gpu")
        async def render(self, job: Task) -> None:
            raise AssertionError("never run here: this worker serves only 'idle'")

    async def run() -> None:
        async with Session(hosts, chroot=chroot, session_timeout=2.0) as session:
            await Router(app, name=name).run(session)

    trio.run(run)


if __name__ == "__main__":
    main()
