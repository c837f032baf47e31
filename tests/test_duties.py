"""Worker-only deployments: an elected worker moves delayed tasks and fires schedules.

Real worker processes (``helpers/duty_worker.py``, a schedule of 0.5 s with CatchUp.ALL)
hold the duties in turn while the holder is killed -9 or paused (SIGSTOP past its session);
a master process that leads takes the duties over and hands them back when killed.  The
test's own worker (``duties = False``) runs the ticks and the delayed tasks and records
each run: every slot from the first fire to the last runs exactly once, and every delayed
task runs once, never before its due time.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import trio

from framework import errors, records
from framework.primitives import Election
from framework.runtime import Client, MasterIdentity, Task, Worker, task
from framework.runtime.scheduling.schedules import ScheduleRecord
from framework.runtime.worker_parts.duties import duties_path
from framework.testing import Child, python_argv, spawn
from framework.zk import Session, wait_exists, wait_gone

HELPERS = Path(__file__).parent / "helpers"
PERIOD = 0.5


class Recorder(Worker):
    """Runs the ticks and the delayed tasks; never holds the duties itself."""

    duties = False
    concurrency = 4

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.ticks: dict[str, int] = {}
        self.delays: dict[str, list[float]] = {}
        self.ran = trio.Event()

    @task
    async def tick(self, job: Task) -> None:
        self.ticks[job.id] = self.ticks.get(job.id, 0) + 1
        self.ran.set()

    @task
    async def late(self, job: Task) -> None:
        self.delays.setdefault(job.payload["n"], []).append(time.time() - job.payload["due"])
        self.ran.set()


async def _spawn(script: str, *args: object, name: str,
                 task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    async with spawn(python_argv(HELPERS / script, *args), name=name) as child:
        task_status.started(child)
        await child.wait()


async def _record(session: Session, app: str, changed: trio.Event) -> ScheduleRecord:
    path = f"/apps/{app}/schedules/ticks"
    await wait_exists(session, path)
    data, _ = await session.get(path, watch=session.waker(changed))
    return records.decode(data, ScheduleRecord)


async def _fires(session: Session, app: str, count: int) -> ScheduleRecord:
    """Wait until the schedule's record counts ``count`` more fires; return it."""
    target: int | None = None
    while True:
        changed = trio.Event()
        record = await _record(session, app, changed)
        target = record.fires + count if target is None else target
        if record.fires >= target:
            return record
        await changed.wait()


async def _holder(session: Session, app: str) -> tuple[str, str]:
    """The duty holder's name and election node (waiting for one)."""
    while True:
        changed = trio.Event()
        line = await session.children(duties_path(_App(app)), watch=session.waker(changed))
        contenders = await Election(session, duties_path(_App(app))).contenders()
        if line and contenders:
            first = contenders[0]
            return records.decode(first.identifier, MasterIdentity).name, first.node
        await changed.wait()


async def _state(session: Session, app: str, worker: str, wanted: str) -> None:
    """Wait until ``worker``'s status says its duties are ``wanted``."""
    path = f"/apps/{app}/workers/{worker}"
    while True:
        changed = trio.Event()
        try:
            data, _ = await session.get(path, watch=session.waker(changed))
        except errors.NoNodeError:  # not (again) a member yet: its session expired
            await wait_exists(session, path)
            continue
        if json.loads(data).get("duties") == wanted:
            return
        await changed.wait()


class _App:
    def __init__(self, name: str) -> None:
        self.base = f"/apps/{name}"


async def _submit_delayed(session: Session, app: str, count: int, spread: float) -> None:
    client = Client(session, app)
    for n in range(count):
        countdown = spread * (n + 1) / count
        await client.submit("late", {"n": str(n), "due": time.time() + countdown},
                            countdown=countdown)


async def _settle(session: Session, app: str, worker: Recorder, delayed: int) -> list[int]:
    """Wait for one more fire, and until every fire recorded and every delayed task ran;
    the ticks' slots (ms) up to the last recorded, in order."""
    final = await _fires(session, app, 1)
    last = final.slot_ns // 1_000_000

    def fired() -> list[int]:
        return sorted(s for s in (int(t.rsplit("-", 1)[1]) for t in worker.ticks) if s <= last)

    while len(fired()) < final.fires or len(worker.delays) < delayed:
        worker.ran = trio.Event()
        await worker.ran.wait()
    assert final.fires == len(fired())
    return fired()


def _check(worker: Recorder, fired: list[int], delayed: int) -> None:
    step = int(PERIOD * 1000)
    assert all(count == 1 for count in worker.ticks.values()), worker.ticks  # none twice
    assert fired == list(range(fired[0], fired[-1] + step, step))  # none missed (ALL)
    assert sorted(worker.delays) == sorted(str(n) for n in range(delayed))
    assert all(len(runs) == 1 for runs in worker.delays.values()), worker.delays  # once each
    assert all(runs[0] >= 0 for runs in worker.delays.values()), worker.delays  # never early


async def test_duties_survive_kill_9_of_their_holder_and_a_master_takes_them_over(
        zk_hosts: str, chroot: str) -> None:
    app, delayed = "duty-kill", 12
    worker = Recorder(app, name="rec")
    with trio.fail_after(90):
        async with Session(zk_hosts, chroot=chroot) as session, \
                trio.open_nursery() as nursery:
            nursery.start_soon(worker.run, session)
            await wait_exists(session, f"/apps/{app}/workers/rec")
            children: dict[str, Child] = {}
            for name in ("d1", "d2"):
                children[name] = await nursery.start(
                    lambda n=name, **kw: _spawn("duty_worker.py", zk_hosts, chroot, app, n,
                                                PERIOD, name=n, **kw))
            await _fires(session, app, 1)
            await _submit_delayed(session, app, delayed, 3.0)
            await _fires(session, app, 1)
            holder, node = await _holder(session, app)
            children.pop(holder).kill()  # the holder killed -9 right after a fire
            await wait_gone(session, node)
            survivor, _node = await _holder(session, app)
            await _state(session, app, survivor, "held")
            await _fires(session, app, 2)
            # a master that leads takes the duties over; killed -9, it hands them back
            master = await nursery.start(
                lambda **kw: _spawn("periodic_master.py", zk_hosts, chroot, app, "m1",
                                    PERIOD, "all", name="m1", **kw))
            await _state(session, app, survivor, "deferred")
            await _fires(session, app, 2)  # fired by the master now
            master.kill()
            await _state(session, app, survivor, "held")
            fired = await _settle(session, app, worker, delayed)
            worker.request_stop()
            nursery.cancel_scope.cancel()
    _check(worker, fired, delayed)


async def test_a_paused_holder_is_replaced_and_does_nothing_when_it_resumes(
        zk_hosts: str, chroot: str) -> None:
    app, delayed = "duty-pause", 8
    worker = Recorder(app, name="rec")
    with trio.fail_after(60):
        async with Session(zk_hosts, chroot=chroot) as session, \
                trio.open_nursery() as nursery:
            nursery.start_soon(worker.run, session)
            await wait_exists(session, f"/apps/{app}/workers/rec")
            children: dict[str, Child] = {}
            for name in ("d1", "d2"):
                children[name] = await nursery.start(
                    lambda n=name, **kw: _spawn("duty_worker.py", zk_hosts, chroot, app, n,
                                                PERIOD, name=n, **kw))
            await _fires(session, app, 1)
            holder, node = await _holder(session, app)
            await _submit_delayed(session, app, delayed, 3.0)
            children[holder].pause()  # SIGSTOP past its session: the other one takes over
            await wait_gone(session, node)
            other = next(n for n in children if n != holder)
            await _state(session, app, other, "held")
            await _fires(session, app, 2)
            children[holder].resume()  # its late steps are refused by the fence
            await _state(session, app, holder, "standby")
            fired = await _settle(session, app, worker, delayed)
            worker.request_stop()
            nursery.cancel_scope.cancel()
    _check(worker, fired, delayed)


class Keeper(Worker):
    """A worker-only app that keeps one dead letter at most."""

    dead_retention_count = 1
    retention_interval = 0.2
    max_attempts = 1
    status_interval = 0.05

    @task
    async def doomed(self, job: Task) -> None:
        raise errors.PermanentFailure("no")


async def test_the_holder_applies_the_worker_classs_retention(zk_hosts: str,
                                                              chroot: str) -> None:
    app = "duty-retention"
    worker = Keeper(app, name="k1")
    with trio.fail_after(30):
        async with Session(zk_hosts, chroot=chroot) as session, \
                trio.open_nursery() as nursery:
            nursery.start_soon(worker.run, session)
            await _state(session, app, "k1", "held")
            client = Client(session, app)
            for n in range(3):
                await client.submit("doomed", key=f"d{n}")
                await client.result(f"d{n}", wait=True)
            while True:  # three dead letters, trimmed to the newest one
                changed = trio.Event()
                dead = await session.children(f"/apps/{app}/dead",
                                              watch=session.waker(changed))
                if len(dead) <= 1:
                    break
                await changed.wait()
            worker.request_stop()
    assert len(dead) == 1
