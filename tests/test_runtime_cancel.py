"""Cancelling an app (the ``cancel`` znode): workers drain and leave, the active master's
lead is cancelled without writing ``done``, standby masters exit; nothing leads again."""

from __future__ import annotations

from typing import Any

import trio

from framework import Session
from framework.runtime import App, Master, MasterContext, Task, Worker
from framework.zk import wait_exists, watch_children
from tests.test_runtime import TIMEOUT, nursery_session


class Endless(Master):
    """Submits one task per worker, then leads until cancelled."""

    def __init__(self, app: str, name: str) -> None:
        super().__init__(app, name=name)
        self.leading = trio.Event()
        self.lead_cancelled = False

    async def lead(self, ctx: MasterContext) -> None:
        await ctx.submit_many("handle", ["busy", "busy"], keys=["t0", "t1"])
        self.leading.set()
        try:
            await trio.sleep_forever()
        except trio.Cancelled:
            self.lead_cancelled = True
            raise


class Busy(Worker):
    """Handles a task until cancelled (the drain timeout cuts it short)."""

    drain_timeout = 0.2

    async def handle(self, task: Task) -> Any:
        await trio.sleep_forever()


async def test_cancel_stops_workers_and_every_master_without_done(zk_hosts: str,
                                                                    chroot: str) -> None:
    app = App("stopme")
    leader, standby = Endless("stopme", "m1"), Endless("stopme", "m2")
    workers = [Busy("stopme", name="w1"), Busy("stopme", name="w2")]
    ended: list[str] = []
    all_ended = trio.Event()

    async def run(component: Any, session: Session) -> None:
        await component.run(session)
        ended.append(component.name)
        if len(ended) == 4:
            all_ended.set()

    with trio.fail_after(30):
        async with Session(zk_hosts, chroot=chroot, session_timeout=TIMEOUT) as s:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(run, leader, await nursery_session(nursery, zk_hosts, chroot))
                await leader.leading.wait()
                nursery.start_soon(run, standby,
                                   await nursery_session(nursery, zk_hosts, chroot))
                async for snap in watch_children(s, app.masters):
                    if len(snap.children) == 2:  # the standby waits in line
                        break
                for worker in workers:
                    nursery.start_soon(run, worker,
                                       await nursery_session(nursery, zk_hosts, chroot))
                for task_id in ("t0", "t1"):  # both workers are handling a task
                    await wait_exists(s, f"{app.running}/{task_id}")
                cancelled_at = trio.current_time()
                await s.create(app.cancel)
                await all_ended.wait()  # every run returns on its own
                took = trio.current_time() - cancelled_at
                nursery.cancel_scope.cancel()
            assert await s.exists(app.done) is None
            # a master started after the cancel exits without leading
            late = Endless("stopme", "m3")
            await late.run(s)
            assert await s.children(app.masters) == []  # every master resigned
    print(f"cancel: 2 masters and 2 workers stopped in {took:.3f} s")
    assert sorted(ended) == ["m1", "m2", "w1", "w2"]
    assert leader.lead_cancelled and standby.terms_led == 0 and late.terms_led == 0
    assert all(not w.tasks.in_flight for w in workers)
