"""Runtime and queue correctness (issue #16), each case against the real server.

* ``wait_idle`` ends when the last item is dead-lettered without being claimed;
* a lost reply to the ``running/`` marker's create does not dead-letter a task that never ran;
* two items with the same task id: the second waits for the first instead of failing;
* a new master does not run a finished job again.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio

from framework import Session, WorkQueue
from framework.errors import ConfigurationError, ConnectionLossError
from framework.runtime import App, Master, MasterContext, Task, Worker
from framework.runtime.operations import gather_status
from framework.runtime.records import RunningRecord
from framework.runtime.tasks import read_result
from framework.runtime.worker_parts.markers import Marker as _Marker
from framework.testing import TcpProxy, expire_session
from tests.test_runtime import nursery_session

TIMEOUT = 4.0


class Echo(Worker):
    max_attempts = 1
    backoff_base = 0.01
    concurrency = 2

    async def handle(self, task: Task) -> Any:
        await trio.sleep(task.payload.get("sleep", 0))
        return task.payload.get("n")


async def test_wait_idle_ends_when_the_last_item_is_buried_unclaimed(
    zk_hosts: str, chroot: str
) -> None:
    """An item whose previous consumer died holding it has used its last delivery: the next
    consumer buries it without claiming it, which changes nothing under ``running/``
    (``wait_idle`` watches the newest queued item itself)."""
    app = App("buried")
    checked = trio.Event()

    class Waiter(Master):
        async def lead(self, ctx: MasterContext) -> None:
            newest_item = ctx.queue.newest_item

            async def looking(**kw: Any) -> str | None:
                newest = await newest_item(**kw)
                checked.set()  # wait_idle has looked once: the bury happens after this
                return newest

            ctx.queue.newest_item = looking  # type: ignore[method-assign]
            await ctx.wait_idle()

    async with Session(zk_hosts, chroot=chroot, session_timeout=TIMEOUT) as doomed:
        queue = WorkQueue(doomed, app.tasks)
        await queue.put(Task("t0", {"n": 0}).encode())
        took = trio.Event()

        async def take_and_hang() -> None:
            async with queue.take():
                took.set()
                await trio.sleep_forever()

        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(take_and_hang)
                await took.wait()
                await expire_session(doomed)  # the consumer "dies" holding its claim
                nursery.cancel_scope.cancel()

    worker = Echo(app, name="w")
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            async with Session(zk_hosts, chroot=chroot, session_timeout=TIMEOUT) as s:
                async with trio.open_nursery() as inner:
                    inner.start_soon(Waiter(app).run, s)
                    await checked.wait()
                    nursery.start_soon(worker.run, await nursery_session(nursery, zk_hosts,
                                                                         chroot))
                status = await gather_status(s, app)
            worker.request_stop()
            nursery.cancel_scope.cancel()
    assert status.dead_letters == 1 and status.queue_depth == 0


class Jobs(Master):
    def __init__(self, app: App, submit: list[tuple[str, dict[str, Any]]]) -> None:
        super().__init__(app)
        self.submit = submit
        self.results: dict[str, Any] = {}
        self.leads = 0

    async def lead(self, ctx: MasterContext) -> None:
        self.leads += 1
        for task_id, payload in self.submit:
            await ctx.submit("handle", payload, key=task_id)
        await ctx.wait_idle()
        self.results = {task_id: await ctx.result(task_id) for task_id, _ in self.submit}


async def _run(zk_hosts: str, chroot: str, master: Master, worker: Worker) -> Any:
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(worker.run, await nursery_session(nursery, zk_hosts, chroot))
            async with Session(zk_hosts, chroot=chroot, session_timeout=TIMEOUT) as s:
                await master.run(s)
                status = await gather_status(s, master.app)
            worker.request_stop()
            nursery.cancel_scope.cancel()
    return status


async def test_a_lost_reply_to_the_running_marker_does_not_fail_the_task(
    zk_hosts: str, chroot: str
) -> None:
    """The marker's create is applied but its reply lost: the worker finds its own marker
    and runs the task, instead of failing every later delivery on NodeExists."""
    app = App("lostmarker")

    class LosesReply(Echo):
        async def run(self, session: Session) -> None:
            create = session.create
            lost = []

            async def create_losing_reply(path: str, *args: Any, **kw: Any) -> str:
                made = await create(path, *args, **kw)
                if path.startswith(f"{app.running}/") and not lost:
                    lost.append(path)
                    raise ConnectionLossError("reply lost (injected after the create applied)")
                return made

            session.create = create_losing_reply  # type: ignore[method-assign]
            await super().run(session)

    master = Jobs(app, [("t0", {"n": 7})])
    worker = LosesReply(app, name="w")
    worker.max_attempts = 3
    status = await _run(zk_hosts, chroot, master, worker)
    result = master.results["t0"]
    assert result is not None and result.ok and result.result == 7 and result.attempts == 1
    assert status.dead_letters == 0


async def test_two_items_with_one_task_id_run_once_without_a_false_dead_letter(
    zk_hosts: str, chroot: str, captured_logs: list[dict[str, Any]]
) -> None:
    """Both copies are taken at once (two slots): the second waits for the first to end,
    then finds its successful result and is acknowledged, never failed or dead-lettered."""
    app = App("sameid")
    master = Jobs(app, [("same", {"n": 1, "sleep": 0.5}), ("same", {"n": 2, "sleep": 0.5})])
    worker = Echo(app, name="w")
    status = await _run(zk_hosts, chroot, master, worker)
    # the copies really overlapped: one found the other's running/ marker and waited for it
    waited = [e for e in captured_logs if e["event"] == "task.same_id_running"]
    assert len(waited) == 1 and waited[0]["task"] == "same", captured_logs
    assert status.dead_letters == 0 and status.queue_depth == 0
    # claimed in one round, either copy may win the marker: the other never runs
    assert master.results["same"].ok and master.results["same"].result in (1, 2)
    assert worker.tasks_done == 1 and worker.tasks_failed == 0


async def test_a_finished_job_is_not_led_again(zk_hosts: str, chroot: str) -> None:
    """The leader finishes; the standby, elected when it exits, finds the job-done record
    and exits too; so does a master started later.  Nothing is submitted twice."""
    app = App("once")
    first, standby, late = (Jobs(app, [("t0", {"n": 1})]) for _ in range(3))
    worker = Echo(app, name="w")
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(worker.run, await nursery_session(nursery, zk_hosts, chroot))
            async with (
                Session(zk_hosts, chroot=chroot, session_timeout=TIMEOUT) as s1,
                Session(zk_hosts, chroot=chroot, session_timeout=TIMEOUT) as s2,
            ):
                async with trio.open_nursery() as masters:
                    masters.start_soon(first.run, s1)
                    masters.start_soon(standby.run, s2)
                await late.run(s1)
                status = await gather_status(s1, app)
            worker.request_stop()
            nursery.cancel_scope.cancel()
    assert (first.leads + standby.leads, late.leads) == (1, 0)
    assert worker.tasks_done == 1 and status.results == 1


async def test_a_cancelled_worker_stops_while_zookeeper_is_unreachable(
    zk_hosts: str, chroot: str, proxy: TcpProxy
) -> None:
    """Cancelled mid-task with its connection frozen, the worker's clean-ups (hand the item
    back, clear its running marker, publish "stopped") each give up after a bound instead
    of waiting for ZooKeeper for as long as it is unreachable."""
    app = App("unreachable")
    started = trio.Event()

    class Stuck(Worker):
        async def handle(self, task: Task) -> Any:
            started.set()
            await trio.sleep_forever()

    worker = Stuck(app, name="w")
    async with Session(zk_hosts, chroot=chroot) as s:
        await WorkQueue(s, app.tasks).put(Task("t0").encode())
    async with Session(proxy.address, chroot=chroot, session_timeout=2.0) as frozen:
        # bounds: 3 clean-ups of at most session_timeout + 1 s each, and the close
        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(worker.run, frozen)
                await started.wait()
                proxy.freeze()  # never thawed while the worker stops
                nursery.cancel_scope.cancel()


async def test_a_failing_shard_is_served_again_and_the_worker_lives_on(
    zk_hosts: str, chroot: str
) -> None:
    """``serve_shard`` raising neither ends ``Worker.run`` nor stops the worker's other
    shards: the failed shard is served again after a backoff."""
    app = App("shardfail")
    calls: dict[str, int] = {"s0": 0, "s1": 0}
    both_served_again = trio.Event()

    class Fragile(Worker):
        backoff_base = 0.01

        async def serve_shard(self, shard: str, spec: bytes) -> None:
            calls[shard] += 1
            if shard == "s0" and calls["s0"] == 1:
                raise ValueError("the shard's files are not there yet")
            if calls["s0"] == 2 and calls["s1"] >= 1:
                both_served_again.set()
            await trio.sleep_forever()

    class Shards(Master):
        stable_for = 0.1

        async def lead(self, ctx: MasterContext) -> None:
            await ctx.run_shards({"s0": b"", "s1": b""})

    worker = Fragile(app, name="w")
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(worker.run, await nursery_session(nursery, zk_hosts, chroot))
            nursery.start_soon(Shards(app).run, await nursery_session(nursery, zk_hosts,
                                                                      chroot))
            await both_served_again.wait()
            assert calls["s1"] == 1, "the other shard was not disturbed"
            nursery.cancel_scope.cancel()


async def test_submit_many_with_keys_runs_a_resubmitted_job_once(
    zk_hosts: str, chroot: str
) -> None:
    """A leader that submits the same keyed batch twice (as a new leader resubmitting the
    whole job would) gets each task run once; keys must match the payloads."""
    app = App("keyed")

    class Twice(Master):
        async def lead(self, ctx: MasterContext) -> None:
            keys = [f"page-{i}" for i in range(5)]
            await ctx.submit_many("handle", [{"n": i} for i in range(5)], keys=keys)
            await ctx.wait_idle()
            await ctx.submit_many("handle", [{"n": i} for i in range(5)], keys=keys)
            await ctx.wait_idle()
            with pytest.raises(ConfigurationError, match="2 keys for 5 payloads"):
                await ctx.submit_many("handle", [{}] * 5, keys=["a", "b"])
            self.results = [await ctx.result(k) for k in keys]

    master = Twice(app)
    worker = Echo(app, name="w")
    await _run(zk_hosts, chroot, master, worker)
    assert worker.tasks_done == 5
    assert [r.result for r in master.results] == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("raw", [b'{"id": "x", "key": 5}', b'{"id": ""}', b'{"id": "a/b"}'])
async def test_a_malformed_task_is_dead_lettered_and_the_queue_goes_on(
    zk_hosts: str, chroot: str, raw: bytes
) -> None:
    """A task put by hand that the worker cannot even name (its running/ marker or result
    path would be invalid) is claimed without the claim's extras and fails in the slot,
    where deliveries count: it is dead-lettered, and the task behind it runs.  (It used to
    make every claim round fail before anything was sent: the queue stalled on it.)"""
    app = App("malformed")
    worker = Echo(app, name="w")
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            s = await nursery_session(nursery, zk_hosts, chroot)
            queue = WorkQueue(s, app.tasks, dead_letter=app.dead)
            await queue.put(raw)
            await queue.put(Task("good", {"n": 7}).encode())
            nursery.start_soon(worker.run, await nursery_session(nursery, zk_hosts, chroot))
            record = await read_result(s, app.result_path("good"), wait=True)
            assert record is not None and record.ok and record.result == 7
            while True:  # the worker made the layout: wait for the dead letter
                changed = trio.Event()
                if await s.children(app.dead, watch=s.waker(changed)):
                    break
                await changed.wait()
            [dead] = await queue.dead_letters()
            assert dead.data == raw
            nursery.cancel_scope.cancel()


async def test_clearing_a_marker_spares_a_later_delivery_that_took_it_over(
    session: Session,
) -> None:
    """A delivery that lost its claim clears its ``running/`` marker when its block ends;
    if a later delivery took the stale marker over meanwhile, the node there is that
    delivery's own - also at version 0 - and must survive (it used to be deleted by version
    alone).  The delivery's own marker is deleted."""
    app = App("takeover")
    worker = Echo(app, name="w")
    path = f"{app.running}/t1"
    await session.ensure_path(app.running)
    later = _Marker(path, RunningRecord("w2/b-0000000000/i+0-0000000001/2", "w2"))
    await session.create(path, later.encode(), ephemeral=True)
    stale = _Marker(path, RunningRecord("w/b-0000000000/i+0-0000000001/1", "w"))
    await worker.tasks._clear_running(session, [stale])
    assert (await session.get(path))[0] == later.encode()  # the later delivery's, kept
    await worker.tasks._clear_running(session, [later])
    assert await session.exists(path) is None  # its own marker: deleted
