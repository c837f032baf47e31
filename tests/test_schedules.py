"""Periodic jobs fired by the elected master: slots, catch-up policies, and no fire missed
or run twice when the leader is killed -9 at fire time (against the real ZooKeeper)."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
import trio

from framework import ConfigurationError, Session, records
from framework.runtime import CatchUp, Master, MasterContext, Task, Worker, cron, every, task
from framework.runtime.scheduling.schedules import NS, ScheduleRecord
from framework.testing import python_argv, spawn
from framework.zk import wait_exists

HELPER = Path(__file__).parent / "helpers" / "periodic_master.py"


def test_interval_and_cron_slots() -> None:
    ticks = every(10, "tick")
    s = NS
    assert ticks.next_slot(95 * s) == 100 * s and ticks.next_slot(100 * s) == 110 * s
    assert ticks.slots(95 * s, 131 * s, 100) == [100 * s, 110 * s, 120 * s, 130 * s]
    assert ticks.slots(95 * s, 131 * s, 2) == [120 * s, 130 * s]
    nightly = cron("0 3 * * *", "cleanup")
    day = 86_400 * s
    assert nightly.next_slot(0) == 3 * 3600 * s
    assert nightly.slots(0, 2 * day + 4 * 3600 * s, 100) == [3 * 3600 * s, day + 3 * 3600 * s,
                                                            2 * day + 3 * 3600 * s]
    assert ticks.task_id(130 * s) == "tick-every-10s-130000"


#: far-future epochs (seconds): now, 2100, year 2500, near the end of year 9999
EPOCHS = [1_700_000_000, 4_102_444_800, 16_725_225_600, 253_390_000_000]


@pytest.mark.parametrize(("period", "epoch"), [
    (0.1, EPOCHS[0]), (0.3, EPOCHS[1]), (0.7, EPOCHS[2]), (0.9, EPOCHS[3]), (1.1, EPOCHS[2]),
])
def test_a_million_consecutive_interval_slots_are_exact(period: float, epoch: int) -> None:
    """Periods that are not binary fractions: the slot after a slot is the next one (never
    itself), the slot after the instant before a slot is that slot, a run of 10**6 slots
    has one step throughout, and their task ids are distinct."""
    ticks = every(period, "tick")
    step = ticks.period_ns
    assert step == round(period * 1000) * 1_000_000  # the decimal written, exactly
    first = (epoch * NS // step + 1) * step
    run = ticks.slots(first - 1, first + (10**6 - 1) * step, 10**6 + 1)
    assert len(run) == 10**6 and run[0] == first
    assert run == list(range(first, first + 10**6 * step, step))
    assert list(map(ticks.next_slot, run)) == [*run[1:], run[-1] + step]
    assert list(map(ticks.next_slot, [slot - 1 for slot in run])) == run
    assert len(set(map(ticks.task_id, run))) == 10**6


@pytest.mark.parametrize("epoch", EPOCHS)
def test_interval_slots_near_every_epoch_and_cron_slots_far_ahead(epoch: int) -> None:
    for period in (0.1, 0.3, 0.7, 0.9, 1.1, 0.001, 86_400.7):
        ticks = every(period, "tick")
        step = ticks.period_ns
        start = epoch * NS - 5_000 * step
        run = ticks.slots(start, start + 10_000 * step, 20_000)
        assert len(run) == 10_000 and all(b - a == step for a, b in pairwise(run))
        assert all(ticks.next_slot(a) == b for a, b in pairwise(run))
    for expression in ("*/7 * * * *", "0 3 * * *", "59 23 28-31 * *"):
        timed = cron(expression, "tick")
        slots = timed.slots(epoch * NS - 1, epoch * NS + 60 * 86_400 * NS, 200)
        assert slots and all(slot % (60 * NS) == 0 for slot in slots)
        assert all(timed.next_slot(a) == b for a, b in pairwise(slots))
        assert all(timed.next_slot(b - 1) == b for b in slots)


def test_schedule_records_keep_the_exact_slot() -> None:
    slot = every(0.7, "tick").period_ns * 2_428_571_430
    again = records.decode(records.encode(ScheduleRecord.at(slot, 3)), ScheduleRecord)
    assert again.slot_ns == slot and again.fires == 3
    older = records.decode(b'{"slot": 1700000000.7, "fires": 2}', ScheduleRecord)
    assert older.slot_ns == 1_700_000_000_700_000_000  # to the millisecond its ids named


@pytest.mark.parametrize(("make", "message"), [
    (lambda: every(0, "tick"), "positive number of seconds"),
    (lambda: every(0.0004, "tick"), "at least 0.001 seconds"),
    (lambda: cron("61 * * * *", "tick"), "bad cron expression"),
    (lambda: every(1, "bad name"), "invalid"),
    (lambda: every(1, "tick", {"x": object()}), "JSON"),
])
def test_bad_schedules_are_one_line_errors(make: Any, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        make()


def test_two_schedules_of_one_name_are_refused() -> None:
    class Twice(Master):
        schedules = [every(1, "a", name="same"), every(2, "b", name="same")]

        async def lead(self, ctx: MasterContext) -> None: ...

    with pytest.raises(ConfigurationError, match="distinct names"):
        Twice("twice")


class Ticks(Worker):
    """Counts each run of each tick task id."""

    concurrency = 4

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.runs: dict[str, int] = {}
        self.ran = trio.Event()

    @task
    async def tick(self, task: Task) -> None:
        self.runs[task.id] = self.runs.get(task.id, 0) + 1
        self.ran.set()


async def _record(session: Session, path: str,
                  changed: trio.Event) -> tuple[ScheduleRecord, bytes]:
    data, _ = await session.get(path, watch=session.waker(changed))
    return records.decode(data, ScheduleRecord), data


class EveryTenth(Master):
    schedules = [every(0.1, "tick", name="ticks", catch_up=CatchUp.ALL)]

    async def lead(self, ctx: MasterContext) -> None:
        await trio.sleep_forever()


async def test_each_slot_fires_once_and_the_record_counts_distinct_slots(
        zk_hosts: str, chroot: str) -> None:
    """One leader, no fault, a period that is not a binary fraction (0.1 s): every fire is
    a new slot, so the record's fire count equals the distinct slots its tasks ran, from
    the first fire to the last recorded."""
    app, step = "tenths", 100  # ms
    path = f"/apps/{app}/schedules/ticks"
    worker = Ticks(app, name="w1")
    with trio.fail_after(60):
        async with Session(zk_hosts, chroot=chroot) as session, \
                trio.open_nursery() as nursery:
            nursery.start_soon(worker.run, session)
            await wait_exists(session, f"/apps/{app}/workers/w1")
            master = EveryTenth(app, name="m1")
            nursery.start_soon(master.run, session)
            await wait_exists(session, path)
            while True:
                changed = trio.Event()
                record, _ = await _record(session, path, changed)
                if record.fires >= 12:
                    break
                await changed.wait()
            master.request_stop()
            last = record.slot_ns // 1_000_000

            def ran() -> list[int]:
                return sorted(s for s in (int(t.rsplit("-", 1)[1]) for t in worker.runs)
                              if s <= last)

            while not ran() or len(ran()) < (last - ran()[0]) // step + 1:
                worker.ran = trio.Event()
                await worker.ran.wait()
            fired = ran()
            worker.request_stop()
            nursery.cancel_scope.cancel()
    assert fired == list(range(fired[0], last + step, step))  # every slot, each once
    assert all(count == 1 for count in worker.runs.values()), worker.runs
    assert record.fires == len(fired), (record.fires, len(fired))


@pytest.mark.parametrize("catch_up", [CatchUp.ALL, CatchUp.LATEST])
async def test_no_fire_is_missed_and_none_runs_twice_when_the_leader_dies_at_fire_time(
        zk_hosts: str, chroot: str, catch_up: CatchUp) -> None:
    """Two master processes; each time the leader records a fire, it is killed -9 at once
    (three times).  The standby takes over after the session timeout and catches up: with
    ALL every slot from the first to the last fire runs exactly once; with LATEST no slot
    runs twice and the latest missed one runs."""
    app, period = f"ticking-{catch_up.value}", 0.5
    path = f"/apps/{app}/schedules/ticks"
    worker = Ticks(app, name="w1")
    killed = 0
    with trio.fail_after(120):
        async with Session(zk_hosts, chroot=chroot) as session, \
                trio.open_nursery() as nursery:
            nursery.start_soon(worker.run, session)
            await wait_exists(session, f"/apps/{app}/workers/w1")
            masters = {}
            for name in ("m1", "m2", "m3", "m4"):
                masters[name] = await nursery.start(_spawn_master, zk_hosts, chroot, app,
                                                    name, period, catch_up)
            await wait_exists(session, path)
            slots: list[int] = []
            while killed < 3:
                changed = trio.Event()
                record, _ = await _record(session, path, changed)
                await changed.wait()
                record, _ = await _record(session, path, trio.Event())
                slots.append(record.slot_ns)
                # the leader just committed a fire: kill it before it does anything else
                leader = await _leader(session, app)
                masters[leader].kill()
                killed += 1
            # let the last leader fire a few more after its catch-up
            target = slots[-1] + 4 * int(period * NS)
            while True:
                changed = trio.Event()
                record, _ = await _record(session, path, changed)
                if record.slot_ns >= target:
                    break
                await changed.wait()
            final = record
            last = final.slot_ns // 1_000_000

            def up_to_final() -> list[int]:  # slots fired later may still be running
                return sorted(s for s in (int(t.rsplit("-", 1)[1]) for t in worker.runs)
                              if s <= last)

            while len(up_to_final()) < final.fires:  # every fire recorded so far has run
                worker.ran = trio.Event()
                await worker.ran.wait()
            fired = up_to_final()
            worker.request_stop()
            nursery.cancel_scope.cancel()
    assert all(count == 1 for count in worker.runs.values()), worker.runs  # none twice
    step = int(period * 1000)
    if catch_up is CatchUp.ALL:  # no slot missed from the first fire to the last
        assert fired == list(range(fired[0], fired[-1] + step, step))
    else:
        assert len(fired) < (fired[-1] - fired[0]) // step + 1  # downtime coalesced
    assert final.fires == len(fired)


async def _leader(session: Session, app: str) -> str:
    from framework.primitives import Election
    from framework.runtime import MasterIdentity

    contenders = await Election(session, f"/apps/{app}/masters").contenders()
    return records.decode(contenders[0].identifier, MasterIdentity).name


async def _spawn_master(hosts: str, chroot: str, app: str, name: str, period: float,
                        catch_up: CatchUp,
                        task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    async with spawn(python_argv(HELPER, hosts, chroot, app, name, period, catch_up.value),
                     name=name) as child:
        task_status.started(child)
        await child.wait()
