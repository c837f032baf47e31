"""Periodic jobs fired by the elected master: slots, catch-up policies, and no fire missed
or run twice when the leader is killed -9 at fire time (against the real ZooKeeper)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from framework import ConfigurationError, Session, records
from framework.runtime import CatchUp, Master, MasterContext, Task, Worker, cron, every, task
from framework.runtime.schedules import ScheduleRecord
from framework.testing import python_argv, spawn
from framework.zk import wait_exists

HELPER = Path(__file__).parent / "helpers" / "periodic_master.py"


def test_interval_and_cron_slots() -> None:
    ticks = every(10, "tick")
    assert ticks.next_slot(95.0) == 100.0 and ticks.next_slot(100.0) == 110.0
    assert ticks.slots(95.0, 131.0, 100) == [100.0, 110.0, 120.0, 130.0]
    assert ticks.slots(95.0, 131.0, 2) == [120.0, 130.0]
    nightly = cron("0 3 * * *", "cleanup")
    day = 86_400.0
    assert nightly.next_slot(0.0) == 3 * 3600.0
    assert nightly.slots(0.0, 2 * day + 4 * 3600.0, 100) == [3 * 3600.0, day + 3 * 3600.0,
                                                            2 * day + 3 * 3600.0]


@pytest.mark.parametrize(("make", "message"), [
    (lambda: every(0, "tick"), "positive number of seconds"),
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
            slots: list[float] = []
            while killed < 3:
                changed = trio.Event()
                record, _ = await _record(session, path, changed)
                await changed.wait()
                record, _ = await _record(session, path, trio.Event())
                slots.append(record.slot)
                # the leader just committed a fire: kill it before it does anything else
                leader = await _leader(session, app)
                masters[leader].kill()
                killed += 1
            # let the last leader fire a few more after its catch-up
            target = slots[-1] + 4 * period
            while True:
                changed = trio.Event()
                record, _ = await _record(session, path, changed)
                if record.slot >= target:
                    break
                await changed.wait()
            final = record
            last = int(final.slot * 1000)

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
