"""Configuration published while a job runs, and ``MasterContext.is_running``.

What the level-by-level crawler of the Fetch Service relied on (it left the tree in #26):
a master re-publishing the configuration mid-job reaches every worker (``self.config``,
``on_config``, and the status node through ``status_changed``), a handler running at that
moment reads the new one, and ``is_running`` tells a task in a handler from a finished one.
"""

from __future__ import annotations

import json
from typing import Any

import trio

from framework import Session
from framework.primitives import Group
from framework.runtime import Master, MasterContext, Task, TaskResult, Worker

APP = "cfg"


async def test_a_configuration_published_mid_job_reaches_running_workers(
    zk_hosts: str, chroot: str
) -> None:
    started, release = trio.Event(), trio.Event()

    class Greeter(Worker):
        app_name = APP

        def __init__(self, name: str) -> None:
            super().__init__(name=name)
            self.applied: list[str] = []

        async def on_config(self, config: Any) -> None:
            self.applied.append(config["greeting"])
            self.status_changed()

        def health(self) -> dict[str, Any]:
            return {"ok": True, "greeting": (self.config or {}).get("greeting")}

        async def handle(self, task: Task) -> Any:
            started.set()
            await release.wait()
            return self.config["greeting"]

    class Boss(Master):
        app_name = APP
        running_then: bool | None = None
        running_after: bool | None = None
        result: TaskResult | None = None

        async def lead(self, ctx: MasterContext) -> None:
            await ctx.publish_config({"greeting": "before"})
            await ctx.submit("handle", {}, key="t0")
            await started.wait()
            self.running_then = await ctx.is_running("t0")
            await ctx.publish_config({"greeting": "after"})
            async for members in Group(ctx.session, ctx.app.workers).watch():
                greetings = {json.loads(d or b"{}").get("health", {}).get("greeting")
                             for d in members.values()}
                if len(members) == 2 and greetings == {"after"}:
                    break  # both workers applied it and published their status
            release.set()
            await ctx.wait_idle()
            self.running_after = await ctx.is_running("t0")
            self.result = await ctx.result("t0")

    workers = [Greeter("w0"), Greeter("w1")]
    boss = Boss()
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            for worker in workers:
                nursery.start_soon(_serve, worker, zk_hosts, chroot)
            async with Session(zk_hosts, chroot=chroot, session_timeout=4.0) as s:
                await boss.run(s)
            for worker in workers:
                worker.request_stop()
    assert (boss.running_then, boss.running_after) == (True, False)
    assert boss.result is not None and boss.result.ok
    assert boss.result.result == "after"  # the handler running at the change read the new one
    assert all(w.applied[-1] == "after" and w.config == {"greeting": "after"} for w in workers)


async def _serve(worker: Worker, hosts: str, chroot: str) -> None:
    async with Session(hosts, chroot=chroot, session_timeout=4.0) as s:
        await worker.run(s)
