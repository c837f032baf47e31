"""A small app for the callback tests, run in real processes via ``framework run``.

``work`` returns its payload doubled; its ``on_success`` callback ``after`` leaves one node
per execution under ``/apps/cb/evidence`` (so a test counts how often it ran).  Fault points,
by environment: ``CB_SAY_RETURNED=1``: ``work`` prints ``RETURNED <id>`` (flushed) as it
returns, for a kill -9 right after the handler returned; ``CB_STALL_MOVE=1``: the worker
prints ``ACKED <node>`` instead of moving a callback into the queue, then waits forever (a
kill -9 lands after the ack, before the move).
"""

from __future__ import annotations

import os
import sys

import trio

from framework.runtime import Task, Worker, task
from framework.runtime.workflows import callbacks

APP = "cb"
EVIDENCE = f"/apps/{APP}/evidence"

if os.environ.get("CB_STALL_MOVE") == "1":
    async def _stalled_move(session: object, app: object, queue: object, path: str) -> bool:
        print(f"ACKED {path}", flush=True)
        await trio.sleep_forever()
        return False

    callbacks.move = _stalled_move  # type: ignore[assignment]


class CallbackWorker(Worker):
    app_name = APP
    concurrency = 1

    @task(on_success="after")
    async def work(self, task: Task) -> int:
        if os.environ.get("CB_SAY_RETURNED") == "1":
            print(f"RETURNED {task.id}", flush=True)
            sys.stdout.flush()
        return int(task.payload) * 2

    @task
    async def after(self, task: Task) -> None:
        session = self.session
        assert session is not None
        await session.create(f"{EVIDENCE}/{task.payload['key']}-", str(task.payload).encode(),
                             sequence=True, makepath=True)


class AfterWorker(CallbackWorker):
    """Only the callback's type: it never takes ``work`` (a live peer of the app)."""

    work = None  # type: ignore[assignment]
