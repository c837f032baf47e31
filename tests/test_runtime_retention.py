"""Retention: the active master bounds results/, dead/ and failures/ without deleting the
record an idempotency check still needs."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
import trio

from framework import ConfigurationError, Session
from framework.runtime import App, Master, MasterContext, Task, Worker
from framework.runtime.results.retention import Limit, _Known
from tests.test_runtime import TIMEOUT, nursery_session

RUNS: Counter[str] = Counter()  # handler calls per task id


class Counting(Worker):
    """Counts its calls; ``fail`` fails (one delivery only: then it is a dead letter)."""

    max_attempts = 1
    concurrency = 4

    async def handle(self, task: Task) -> Any:
        RUNS[task.id] += 1
        if task.payload == "fail":
            raise RuntimeError("planned")
        return task.payload


class Scripted(Master):
    """Runs ``script(ctx)`` as its lead; retention only when the script asks."""

    retention_interval = None
    result_retention_count = 0  # keep no result that may go
    failure_retention_count = 1
    dead_retention_count = None

    def __init__(self, app: str, script: Any, zk_hosts: str, chroot: str) -> None:
        super().__init__(app)
        self.script = script
        self.zk_hosts, self.chroot = zk_hosts, chroot

    async def lead(self, ctx: MasterContext) -> None:
        await self.script(ctx)


async def work_until_idle(ctx: MasterContext, worker: Worker) -> None:
    """Run ``worker`` (its own session) until the queue is idle, then stop it."""
    async with trio.open_nursery() as nursery:
        session = await nursery_session(nursery, ctx.master.zk_hosts, ctx.master.chroot)
        stopped = trio.Event()

        async def work() -> None:
            await worker.run(session)
            stopped.set()

        nursery.start_soon(work)
        await ctx.wait_idle()
        worker.request_stop()
        await stopped.wait()
        nursery.cancel_scope.cancel()


async def children(session: Session, path: str) -> set[str]:
    return set(await session.children(path))


async def index_listings(session: Session, app: App) -> int:
    """The listings a walk of the whole time index makes: its root, each day, each slot."""
    days = await session.children(app.results_log)
    return 1 + len(days) + sum([len(await session.children(f"{app.results_log}/{day}"))
                                for day in days])


async def test_retention_keeps_the_record_of_a_queued_task_and_drops_superseded_dead_letters(
    zk_hosts: str, chroot: str
) -> None:
    RUNS.clear()
    calls: list[int] = []  # ZooKeeper requests per pass
    index: list[int] = []  # listings of the time index in a whole walk

    async def script(ctx: MasterContext) -> None:
        session = ctx.session
        app = ctx.app
        await ctx.submit_many("handle", ["ok"] * 5, keys=[f"k{n}" for n in range(5)])
        await ctx.submit("handle", "fail", key="bad")
        await ctx.submit("handle", "fail", key="bad2")
        await work_until_idle(ctx, Counting(app, name="w1"))
        assert len(await children(session, app.dead)) == 2
        assert len(await children(session, app.failures)) == 2
        # no worker now: a resubmission of k0 stays queued, so its record must stay
        await ctx.submit("handle", "ok", key="k0")
        original = session._call

        async def counted(request: Any) -> Any:
            calls[-1] += 1
            return await original(request)

        session._call = counted  # type: ignore[method-assign]
        calls.append(0)
        deleted = await ctx.apply_retention()
        # the five results but k0's (queued again) and those of bad/bad2 (dead letters)
        assert deleted == {"dead": 0, "failures": 1, "results": 4}
        assert (await ctx.result("k0")).ok
        assert [await ctx.result(f"k{n}") for n in range(1, 5)] == [None] * 4
        assert not (await ctx.result("bad")).ok
        calls.append(0)
        assert await ctx.apply_retention() == {"dead": 0, "failures": 0, "results": 0}
        session._call = original  # type: ignore[method-assign]
        index.append(await index_listings(session, app))
        # "bad" is resubmitted and succeeds: its dead letter goes; the queued k0 is skipped
        await ctx.submit("handle", "now ok", key="bad")
        await work_until_idle(ctx, Counting(app, name="w2"))
        assert (await ctx.result("bad")).ok
        assert await ctx.apply_retention() == {"dead": 1, "failures": 0, "results": 2}
        assert await ctx.result("k0") is None and await ctx.result("bad") is None
        assert not (await ctx.result("bad2")).ok  # its dead letter is still there
        assert len(await children(session, app.dead)) == 1

    with trio.fail_after(60):
        async with Session(zk_hosts, chroot=chroot, session_timeout=TIMEOUT) as s:
            await Scripted("ret", script, zk_hosts, chroot).run(s)
    assert RUNS == {"k0": 1, "k1": 1, "k2": 1, "k3": 1, "k4": 1, "bad": 2, "bad2": 1}
    cold, warm = calls
    print(f"retention pass: {cold} requests cold, {warm} with nothing new")
    # warm: 256 bucket stats (the count of records), failures/ and dead/ listed, the two
    # dead letters' records stat'ed, the time index walked (its root, its day and each of
    # its slots: the three records left are still over the limit; a worker makes the next
    # slot ahead), each of them stat'ed with its key's marker read, and k0's marker's two
    # items looked for (bad's and bad2's are not: a dead letter keeps those); the queue is
    # never listed
    assert warm == 256 + 2 + 2 + index[0] + 3 * 2 + 2


def test_limits_by_count_and_age_pick_the_oldest() -> None:
    records = {f"r{n}": _Known(mtime=1000.0 + n, version=0) for n in range(10)}
    assert Limit(count=7).over(records, now=2000) == ["r0", "r1", "r2"]
    assert Limit(seconds=995).over(records, now=2000) == ["r0", "r1", "r2", "r3", "r4"]
    assert Limit(count=8, seconds=997).over(records, now=2000) == ["r0", "r1", "r2"]
    assert Limit().over(records, now=1e9) == []
    with pytest.raises(ConfigurationError):
        Limit(count=-1)

    class Bad(Master):
        dead_retention_seconds = -5.0

    with pytest.raises(ConfigurationError, match="retention age"):
        Bad("app")


class Periodic(Master):
    """A job of 12 tasks; waits until the runtime's own retention passes (every 0.1 s, at
    most 4 deletions each) brought the results down to 3."""

    retention_interval = 0.1
    retention_batch = 4
    result_retention_count = 3

    async def lead(self, ctx: MasterContext) -> None:
        passes: list[int] = []
        enough = trio.Event()
        apply = ctx.retention.apply

        async def observed() -> dict[str, int]:
            deleted = await apply()
            passes.append(deleted["results"])
            if sum(passes) == 9:
                enough.set()
            return deleted

        ctx.retention.apply = observed  # type: ignore[method-assign]
        await ctx.submit_many("handle", list(range(12)), keys=[f"p{n}" for n in range(12)])
        await ctx.wait_idle()
        await enough.wait()
        self.passes = [n for n in passes if n]
        self.left = [k for k in range(12) if await ctx.result(f"p{k}") is not None]


async def test_the_active_master_applies_retention_in_bounded_batches(
    zk_hosts: str, chroot: str
) -> None:
    master = Periodic("periodic")
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            worker = Counting("periodic", name="w")
            nursery.start_soon(worker.run, await nursery_session(nursery, zk_hosts, chroot))
            async with Session(zk_hosts, chroot=chroot, session_timeout=TIMEOUT) as s:
                await master.run(s)
            worker.request_stop()
            nursery.cancel_scope.cancel()
    assert max(master.passes) <= 4 and sum(master.passes) == 9
    assert len(master.left) == 3
