"""The master/worker runtime in one process: tasks, retries, dead letters, limits, shards."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
import trio

from framework import LeadershipLost, PermanentFailure, Session
from framework.runtime import App, Master, MasterContext, Task, TaskResult, Worker
from framework.runtime.operations import gather_status
from framework.runtime.records import MemberState
from framework.testing import expire_session
from framework.zk import wait_exists, wait_gone

TIMEOUT = 4.0


class Jobs(Master):
    """Submits the given payloads, waits until the workers are idle, returns the results."""

    def __init__(self, app: str, payloads: list[Any], **kw: Any) -> None:
        super().__init__(app, **kw)
        self.payloads = payloads
        self.results: dict[str, TaskResult | None] = {}

    async def lead(self, ctx: MasterContext) -> None:
        tasks = [await ctx.submit("handle", p, key=f"t{i}", time_limit=p.get("limit"))
                 for i, p in enumerate(self.payloads)]
        await ctx.wait_idle()
        self.results = {t.id: await ctx.result(t.id) for t in tasks}


class Flaky(Worker):
    """``fail``: fail that many deliveries; ``sleep``: seconds; ``progress``: report it."""

    max_attempts = 3
    backoff_base = 0.01
    concurrency = 2

    async def handle(self, task: Task) -> Any:
        payload = task.payload
        if task.attempts <= payload.get("fail", 0):
            raise RuntimeError(f"planned failure {task.attempts}")
        if payload.get("progress"):
            await self.report_progress(task, 1, 2, "half way")
        if payload.get("block"):  # a blocking call the time limit cannot interrupt
            await trio.to_thread.run_sync(time.sleep, payload["block"])
        await trio.sleep(payload.get("sleep", 0))
        return payload.get("n")


async def run_app(hosts: str, chroot: str, master: Master, workers: list[Worker]) -> None:
    async with trio.open_nursery() as nursery:
        for worker in workers:
            session = await nursery_session(nursery, hosts, chroot)
            nursery.start_soon(worker.run, session)
        async with Session(hosts, chroot=chroot, session_timeout=TIMEOUT) as s:
            await master.run(s)
        for worker in workers:
            worker.request_stop()


async def nursery_session(nursery: trio.Nursery, hosts: str, chroot: str) -> Session:
    async def hold(task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        async with Session(hosts, chroot=chroot, session_timeout=TIMEOUT) as s:
            task_status.started(s)
            await trio.sleep_forever()

    return await nursery.start(hold)


async def test_tasks_retries_dead_letters_and_time_limits(zk_hosts: str, chroot: str) -> None:
    payloads = [{"n": i} for i in range(20)] + [
        {"n": "flaky", "fail": 2},        # succeeds on its third delivery
        {"n": "doomed", "fail": 99},      # dead-lettered after max_attempts
        {"n": "slow", "sleep": 30, "limit": 0.2},  # time limit: fails every time
        {"n": "progress", "progress": True},
        {"n": "blocked", "block": 0.5, "limit": 0.1},  # returns late: a failure all the same
    ]
    master = Jobs("jobs", payloads)
    workers = [Flaky("jobs", name="w1"), Flaky("jobs", name="w2")]
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            sessions = [await nursery_session(nursery, zk_hosts, chroot) for _ in workers]
            for worker, s in zip(workers, sessions, strict=True):
                nursery.start_soon(worker.run, s)
            async with Session(zk_hosts, chroot=chroot, session_timeout=TIMEOUT) as s:
                await master.run(s)
                status = await gather_status(s, App("jobs"), recent_failures=20)
            for worker in workers:
                worker.request_stop()
            nursery.cancel_scope.cancel()
    results = master.results
    assert all(results[f"t{i}"].ok and results[f"t{i}"].result == i for i in range(20))
    assert results["t20"].ok and results["t20"].attempts == 3
    assert not results["t21"].ok and "planned failure 3" in results["t21"].error
    # a failure keeps its traceback (the handler's frame included) and its key
    doomed = results["t21"].traceback
    assert doomed and "in handle" in doomed and "RuntimeError: planned failure 3" in doomed
    assert results["t21"].key == "t21" and results["t20"].key == "t20"
    assert not results["t22"].ok and results["t22"].error == "time limit exceeded"
    assert results["t23"].ok
    assert not results["t24"].ok and results["t24"].error == "time limit exceeded"
    assert status.dead_letters == 3 and status.queue_depth == 0 and status.results == 25
    assert {f.task_id for f in status.failures} >= {"t21", "t22", "t24"}
    assert sum(w.tasks_done for w in workers) == 22


class Unstorable(Worker):
    """Returns what cannot be stored, or says retrying cannot help."""

    max_attempts = 5
    backoff_base = 0.01

    async def handle(self, task: Task) -> Any:
        kind = task.payload["kind"]
        if kind == "big":
            return "x" * 1_100_000
        if kind == "object":
            return object()
        if kind == "permanent":
            raise PermanentFailure("the input is malformed")
        return kind


async def test_unstorable_results_fail_the_task_for_good(zk_hosts: str, chroot: str) -> None:
    """A result over the znode limit or not JSON, or a PermanentFailure, is a recorded final
    failure on the first delivery (never retried, never stored as success), dead-lettered."""
    master = Jobs("unstorable", [{"kind": k} for k in ("big", "object", "permanent", "fine")])
    worker = Unstorable("unstorable", name="w")
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(worker.run, await nursery_session(nursery, zk_hosts, chroot))
            async with Session(zk_hosts, chroot=chroot, session_timeout=TIMEOUT) as s:
                await master.run(s)
                status = await gather_status(s, App("unstorable"))
            worker.request_stop()
            nursery.cancel_scope.cancel()
    big, obj, permanent, fine = (master.results[f"t{i}"] for i in range(4))
    assert not big.ok and big.attempts == 1 and "over the" in big.error and "limit" in big.error
    assert not obj.ok and obj.attempts == 1 and "not JSON-serialisable" in obj.error
    assert not permanent.ok and permanent.attempts == 1
    assert permanent.error == "the input is malformed"
    assert fine.ok and fine.result == "fine"
    assert status.dead_letters == 3 and status.queue_depth == 0
    assert {f.task_id for f in status.failures} == {"t0", "t1", "t2"}
    assert worker.tasks_failed == 3 and worker.tasks_done == 1


async def test_duplicate_delivery_is_skipped_by_idempotency_key(zk_hosts: str,
                                                                chroot: str) -> None:
    class Twice(Master):
        async def lead(self, ctx: MasterContext) -> None:
            await ctx.submit("handle", {"n": 1}, key="same")
            await ctx.wait_idle()
            await ctx.submit("handle", {"n": 2}, key="same")
            await ctx.wait_idle()
            self.record = await ctx.result("same")

    master = Twice("idem")
    worker = Flaky("idem", name="w")
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(worker.run, await nursery_session(nursery, zk_hosts, chroot))
            async with Session(zk_hosts, chroot=chroot) as s:
                await master.run(s)
            worker.request_stop()
            nursery.cancel_scope.cancel()
    assert master.record.task_id == "same" and master.record.result == 1
    assert worker.tasks_done == 1


async def test_deposed_master_write_is_refused(zk_hosts: str, chroot: str) -> None:
    contexts: list[MasterContext] = []
    elected = [trio.Event(), trio.Event()]

    class Stubborn(Master):
        async def lead(self, ctx: MasterContext) -> None:
            contexts.append(ctx)
            elected[len(contexts) - 1].set()
            await trio.sleep_forever()

    master = Stubborn("depose")
    with trio.fail_after(30):
        async with Session(zk_hosts, chroot=chroot, session_timeout=TIMEOUT) as s:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(master.run, s)
                await elected[0].wait()
                await expire_session(s)  # first term ends: the body is cancelled
                await elected[1].wait()  # and the master leads again in its new session
                with pytest.raises(LeadershipLost):
                    await contexts[0].publish_config({"v": "stale"})
                assert await s.exists("/apps/depose/config/ready") is None
                assert await contexts[1].publish_config({"v": "fresh"}) >= 1
                # submits are fenced too: a deposed master queues nothing
                with pytest.raises(LeadershipLost):
                    await contexts[0].submit("handle", {"n": "stale"})
                with pytest.raises(LeadershipLost):
                    await contexts[0].submit_many("handle", [{"n": i} for i in range(3)])
                assert await contexts[0].queue.size() == 0
                await contexts[1].submit("handle", {"n": "fresh"})
                # 3 batches:
                await contexts[1].submit_many("handle", [{"n": i} for i in range(1100)])
                assert await contexts[1].queue.size() == 1101
                with pytest.raises(LeadershipLost):  # pipelined batches: all refused
                    await contexts[0].submit_many("handle", [{"n": i} for i in range(1100)])
                assert await contexts[1].queue.size() == 1101
                nursery.cancel_scope.cancel()
    assert master.terms_led == 2


async def test_push_mode_drops_shards_on_expiry_and_moves_them_off_a_lost_worker(
    zk_hosts: str, chroot: str
) -> None:
    serving: dict[str, set[str]] = {"a": set(), "b": set()}
    changed = trio.Event()

    class Shard(Worker):
        async def serve_shard(self, shard: str, spec: bytes) -> None:
            nonlocal changed
            assert spec == shard.encode()
            serving[self.name].add(shard)
            changed.set()
            try:
                await trio.sleep_forever()
            finally:
                serving[self.name].discard(shard)
                changed.set()

    async def until(condition: Any) -> None:
        nonlocal changed
        while not condition():
            await changed.wait()
            changed = trio.Event()

    class Shards(Master):
        stable_for = 0.3

        async def lead(self, ctx: MasterContext) -> None:
            await ctx.run_shards({f"s{i}": f"s{i}".encode() for i in range(4)})

    with trio.fail_after(40):
        async with trio.open_nursery() as nursery:
            a, b = Shard("shards", name="a"), Shard("shards", name="b")
            session_a = await nursery_session(nursery, zk_hosts, chroot)
            a_scope = trio.CancelScope()
            nursery.start_soon(_run_in, a_scope, a, session_a)
            nursery.start_soon(b.run, await nursery_session(nursery, zk_hosts, chroot))
            master_session = await nursery_session(nursery, zk_hosts, chroot)
            nursery.start_soon(Shards("shards").run, master_session)
            await until(lambda: len(serving["a"]) == 2 and len(serving["b"]) == 2)
            # a's session expires: it must stop serving at once, then rejoins and resumes
            await expire_session(session_a)
            await until(lambda: not serving["a"])
            await until(lambda: len(serving["a"]) == 2)
            # a goes away for good: after the safe-mode period b serves everything
            a_scope.cancel()
            await until(lambda: len(serving["b"]) == 4 and not serving["a"])
            await wait_gone(master_session, "/apps/shards/workers/a")
            nursery.cancel_scope.cancel()


async def _run_in(scope: trio.CancelScope, worker: Worker, session: Session) -> None:
    with scope:
        await worker.run(session)


async def test_status_reports_workers_and_leader(zk_hosts: str, chroot: str) -> None:
    class Idle(Master):
        async def lead(self, ctx: MasterContext) -> None:
            await trio.sleep_forever()

    class W(Worker):
        async def handle(self, task: Task) -> None:
            return None

    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            s = await nursery_session(nursery, zk_hosts, chroot)
            nursery.start_soon(Idle("st", name="m1", address="10.0.0.1:99").run, s)
            nursery.start_soon(W("st", name="w1").run, s)
            await wait_exists(s, "/apps/st/rendezvous")
            await wait_exists(s, "/apps/st/workers/w1")
            status = await gather_status(s, App("st"))
            nursery.cancel_scope.cancel()
    assert status.leader is not None
    assert status.leader.name == "m1" and status.leader.address == "10.0.0.1:99"
    assert set(status.workers) == {"w1"} and status.workers["w1"].state is MemberState.RUNNING
    json.loads(status.to_json())


@pytest.mark.parametrize("name", ["bad name", "a/b"])
def test_bad_worker_name_is_a_clear_error(name: str) -> None:
    from framework import ConfigurationError

    with pytest.raises(ConfigurationError):
        Flaky("app", name=name)
