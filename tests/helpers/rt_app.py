"""A small application for the runtime tests, run in real processes via `framework run`.

Every execution leaves server-side evidence under ``/apps/rt/evidence``:
``exec/<task>`` (ephemeral while the task runs; a second concurrent run of the same task
fails to create it and records ``overlap/<task>-``) and ``log/<task>-`` (one persistent node
per execution, data = worker name).
"""

from __future__ import annotations

import os

import trio

from framework import NodeExistsError
from framework.runtime import Master, MasterContext, Task, Worker

APP = "rt"
EVIDENCE = f"/apps/{APP}/evidence"


class BatchMaster(Master):
    app_name = APP

    async def lead(self, ctx: MasterContext) -> None:
        total = int(os.environ.get("RT_TASKS", "30"))
        marker = f"/apps/{APP}/submitted"
        if await ctx.session.exists(marker) is None:
            for i in range(total):
                await ctx.submit("handle", {"n": i}, key=f"t{i:04d}")
            await ctx.term.commit(lambda txn: txn.create(marker, b"%d" % total))
        await ctx.wait_idle()


class RecordingWorker(Worker):
    app_name = APP
    concurrency = 2
    drain_timeout = 30.0

    async def handle(self, task: Task) -> dict:
        session = self.session
        assert session is not None
        await session.ensure_path(f"{EVIDENCE}/exec")
        await session.ensure_path(f"{EVIDENCE}/overlap")
        try:
            await session.create(f"{EVIDENCE}/exec/{task.id}", self.name.encode(), ephemeral=True)
        except NodeExistsError:
            await session.create(f"{EVIDENCE}/overlap/{task.id}-", self.name.encode(),
                                 sequence=True)
        await session.create(f"{EVIDENCE}/log/{task.id}-", self.name.encode(), sequence=True,
                             makepath=True)
        payload = task.payload or {}
        await trio.sleep(float(payload.get("seconds", os.environ.get("RT_TASK_SECONDS", "0.05"))))
        await session.delete(f"{EVIDENCE}/exec/{task.id}", missing_ok=True)
        return {"n": payload.get("n"), "by": self.name}


class OversizedSubmitMaster(Master):
    """A user mistake inside ``lead``: a task payload over ZooKeeper's 1 MB node limit."""

    app_name = APP

    async def lead(self, ctx: MasterContext) -> None:
        await ctx.submit("handle", {"blob": "x" * 1_100_000})


class PoisonMaster(Master):
    """Three tasks, one of which always fails: the job ends with one dead letter."""

    app_name = "rt-poison"

    async def lead(self, ctx: MasterContext) -> None:
        await ctx.submit_many("handle", [{"fail": False}, {"fail": True}, {"fail": False}],
                              keys=["ok-1", "bad", "ok-2"])
        await ctx.wait_idle()


class PoisonWorker(Worker):
    app_name = "rt-poison"
    max_attempts = 1

    async def handle(self, task: Task) -> str:
        if task.payload["fail"]:
            raise ValueError("poison")
        return "fine"
