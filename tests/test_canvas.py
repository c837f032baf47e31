"""Canvas: chain, group and chord, with results passed on, driven by the elected duty holder.

In process first (results passed on, a failing member failing the chord, refusals); then the
driver's processes (``helpers/duty_worker.py``) killed -9 twice and the last one SIGSTOPped
past its session while a chord and a chain are under way: the callback runs exactly once,
with every member's result, and each step once; and the worker process running a member
killed -9: the member runs again elsewhere, the callback once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from framework import errors, records
from framework.primitives import Election
from framework.runtime import (
    App,
    MasterIdentity,
    Task,
    Worker,
    apply_canvas,
    canvas_result,
    chain,
    chord,
    group,
    sig,
    task,
)
from framework.runtime.tasks import read_result
from framework.runtime.worker_parts.duties import duties_path
from framework.runtime.workflows.canvas import CanvasRecord, canvas_root
from framework.testing import Child, python_argv, spawn
from framework.zk import Session, wait_exists, wait_gone, watch_children

HELPERS = Path(__file__).parent / "helpers"


class Calc(Worker):
    """Counts each run of each task id."""

    concurrency = 2
    max_attempts = 2
    backoff_base = 0.01
    pause = 0.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.runs: dict[str, int] = {}
        #: square(n) waits for gates[n] when set (the test decides when members end)
        self.gates: dict[int, trio.Event] | None = None

    def _ran(self, job: Task) -> None:
        self.runs[job.id] = self.runs.get(job.id, 0) + 1

    @task
    async def start(self, job: Task) -> int:
        self._ran(job)
        return int(job.payload)

    @task
    async def add(self, job: Task) -> int:
        self._ran(job)
        await trio.sleep(self.pause)  # work that takes a while, so faults land mid-way
        return int(job.payload["previous"] + job.payload["payload"])

    @task
    async def square(self, job: Task) -> int:
        self._ran(job)
        if self.gates is not None:
            await self.gates[int(job.payload)].wait()
        return int(job.payload) ** 2

    @task
    async def total(self, job: Task) -> dict[str, Any]:
        self._ran(job)
        return {"sum": sum(job.payload["results"]), "label": job.payload["payload"]}

    @task
    async def boom(self, job: Task) -> None:
        self._ran(job)
        raise ValueError(f"boom {job.payload}")

    @task
    async def big(self, job: Task) -> str:
        self._ran(job)
        return "x" * 70_000

    @task
    async def tick(self, job: Task) -> None:  # the helpers' schedule fires it
        return None


async def _serve(session: Session, worker: Worker) -> None:
    await worker.run(session)


async def test_chain_group_and_chord_pass_results_on(session: Session) -> None:
    worker = Calc("calc", name="w1")
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_serve, session, worker)
            await wait_exists(session, "/apps/calc/workers/w1")
            linked = await apply_canvas(session, "calc", chain(
                sig("start", 2), sig("add", 3), sig("add", 4), sig("start", 7, immutable=True)))
            grouped = await apply_canvas(session, "calc", group(
                [sig("square", n) for n in range(4)]))
            chorded = await apply_canvas(session, "calc", chord(
                [sig("square", n) for n in range(5)], sig("total", "squares")),
                canvas_id="sq")
            again = await apply_canvas(session, "calc", chord(
                [sig("square", 9)], sig("total", "other")), canvas_id="sq")
            done = [await canvas_result(session, "calc", cid, wait=True)
                    for cid in (linked, grouped, chorded)]
            worker.request_stop()
    assert again == "sq"
    chained, grouped_record, chorded_record = done
    assert chained is not None and chained.state == "succeeded" and chained.result == 7
    assert worker.runs[f"{linked}-2"] == 1  # 2 + 3 + 4 = 9 was step 2's result
    assert grouped_record is not None and grouped_record.result == [0, 1, 4, 9]
    assert chorded_record is not None and chorded_record.state == "succeeded"
    assert chorded_record.result == {"sum": 30, "label": "squares"}
    assert sorted(chorded_record.joined) == ["0", "1", "2", "3", "4"]
    assert all(count == 1 for count in worker.runs.values()), worker.runs


async def test_a_member_failing_for_good_fails_the_chord_with_its_error(
        session: Session) -> None:
    worker = Calc("calc-fail", name="w1")
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_serve, session, worker)
            await wait_exists(session, "/apps/calc-fail/workers/w1")
            cid = await apply_canvas(session, "calc-fail", chord(
                [sig("square", 1), sig("boom", "x"), sig("square", 2)], sig("total")))
            linked = await apply_canvas(session, "calc-fail", chain(
                sig("start", 1), sig("boom", "y", immutable=True), sig("add", 1)))
            too_big = await apply_canvas(session, "calc-fail", chain(sig("big"), sig("add", 1)))
            record = await canvas_result(session, "calc-fail", cid, wait=True)
            chained = await canvas_result(session, "calc-fail", linked, wait=True)
            oversized = await canvas_result(session, "calc-fail", too_big, wait=True)
            worker.request_stop()
    assert record is not None and record.state == "failed"
    assert record.error == "step 1 (boom): ValueError: boom x"
    assert chained is not None and chained.state == "failed"
    assert chained.error == "step 1 (boom): ValueError: boom y"
    assert f"{cid}-callback" not in worker.runs and f"{linked}-2" not in worker.runs
    assert worker.runs[f"{cid}-1"] == 2  # its type's attempts, then for good
    assert oversized is not None and oversized.state == "failed"
    assert oversized.error is not None and "over the 65,536 a queued task" in oversized.error


class KeptCalc(Calc):
    """Keeps the 2 newest ended canvas records, trimmed every 0.1 s."""

    canvas_retention_count = 2
    retention_interval = 0.1
    concurrency = 3  # two slots wait in the gated group's members


async def _until_listed(session: Session, path: str, count: int) -> list[str]:
    async for snapshot in watch_children(session, path):
        if len(snapshot.children) == count:
            return sorted(snapshot.children)
    raise AssertionError("unreachable")


async def test_ended_canvas_records_are_trimmed_and_running_ones_kept(
        session: Session) -> None:
    worker = KeptCalc("calc-keep", name="w1")
    worker.gates = {n: trio.Event() for n in range(2)}
    root = canvas_root(App("calc-keep"))
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_serve, session, worker)
            await wait_exists(session, "/apps/calc-keep/workers/w1")
            running = await apply_canvas(session, "calc-keep", group(
                [sig("square", n) for n in range(2)]), canvas_id="running")
            ended = []
            for n in range(4):
                ended.append(await apply_canvas(session, "calc-keep", chain(
                    sig("start", n)), canvas_id=f"done-{n}"))
                await canvas_result(session, "calc-keep", ended[-1], wait=True)
            # the two oldest ended records go; the running canvas, older still, stays
            assert await _until_listed(session, root, 3) == ["done-2", "done-3", "running"]
            assert await canvas_result(session, "calc-keep", "done-0") is None
            for gate in worker.gates.values():
                gate.set()
            record = await canvas_result(session, "calc-keep", running, wait=True)
            assert record is not None and record.result == [0, 1]
            # now it has ended, and it ended last: it is one of the two kept
            assert await _until_listed(session, root, 2) == ["done-3", "running"]
            worker.request_stop()


async def test_canvas_mistakes_are_one_line_errors(session: Session) -> None:
    worker = Calc("calc-bad", name="w1")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_serve, session, worker)
        await wait_exists(session, "/apps/calc-bad/workers/w1")
        with pytest.raises(errors.ConfigurationError, match="no task type 'nope'"):
            await apply_canvas(session, "calc-bad", chain(sig("start", 1), sig("nope")))
        worker.request_stop()
    with pytest.raises(errors.ConfigurationError, match="one or more sig"):
        chain()
    with pytest.raises(errors.ConfigurationError, match="no nesting"):
        chain(sig("start"), group(sig("start")))  # type: ignore[arg-type]
    with pytest.raises(errors.ConfigurationError, match="JSON"):
        sig("start", object())
    assert await canvas_result(session, "calc-bad", "missing") is None


# ---------------------------------------------------------------- faults


async def _spawn(*args: object, name: str,
                 task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    async with spawn(python_argv(HELPERS / "duty_worker.py", *args), name=name) as child:
        task_status.started(child)
        await child.wait()


async def _holder(session: Session, app: str) -> tuple[str, str]:
    """The duty holder's name and election node (waiting for one)."""
    while True:
        changed = trio.Event()
        try:
            await session.children(duties_path(_App(app)), watch=session.waker(changed))
        except errors.NoNodeError:  # no worker has started yet
            await wait_exists(session, duties_path(_App(app)))
            continue
        contenders = await Election(session, duties_path(_App(app))).contenders()
        if contenders:
            first = contenders[0]
            return records.decode(first.identifier, MasterIdentity).name, first.node
        await changed.wait()


class _App:
    def __init__(self, name: str) -> None:
        self.base = f"/apps/{name}"


async def _progress(session: Session, app: str, cid: str, beyond: int) -> CanvasRecord:
    """Wait until the chord has counted more than ``beyond`` members (or ended)."""
    path = f"{canvas_root(_App(app))}/{cid}"  # type: ignore[arg-type]
    while True:
        changed = trio.Event()
        data, _ = await session.get(path, watch=session.waker(changed))
        record = records.decode(data, CanvasRecord)
        if len(record.joined) > beyond or record.done:
            return record
        await changed.wait()


async def test_the_callback_runs_once_when_drivers_are_killed_and_paused(
        zk_hosts: str, chroot: str) -> None:
    """Three driver processes.  The chord's members end when the test lets them: the
    driver is killed -9 after the first member is counted, and the second driver is
    SIGSTOPped past its session after the sixth (the third takes over), then resumed; the
    rest end meanwhile.  The chain runs beside it, through the same faults."""
    app, members = "canvas-faults", 12
    worker = Calc(app, name="rec")
    worker.duties = False  # the helpers drive
    worker.concurrency = members + 1
    worker.pause = 0.05
    worker.gates = {n: trio.Event() for n in range(members)}
    with trio.fail_after(90):
        async with Session(zk_hosts, chroot=chroot) as session, \
                trio.open_nursery() as nursery:
            nursery.start_soon(_serve, session, worker)
            await wait_exists(session, f"/apps/{app}/workers/rec")
            children: dict[str, Child] = {}
            for name in ("d1", "d2", "d3"):
                children[name] = await nursery.start(
                    lambda n=name, **kw: _spawn(zk_hosts, chroot, app, n, 30.0, name=n, **kw))
            await _holder(session, app)
            cid = await apply_canvas(session, app, chord(
                [sig("square", n) for n in range(members)], sig("total", "faults")))
            linked = await apply_canvas(session, app, chain(
                sig("start", 0), *[sig("add", 1) for _ in range(6)]))
            released = 0
            for fault, counted in (("kill", 1), ("pause", 6)):
                while released < counted:
                    worker.gates[released].set()
                    released += 1
                record = await _progress(session, app, cid, counted - 1)
                assert not record.done and not record.callback_queued
                holder, node = await _holder(session, app)
                if fault == "kill":
                    children.pop(holder).kill()
                else:
                    children[holder].pause()
                await wait_gone(session, node)  # its session expired
            for gate in worker.gates.values():
                gate.set()
            await _progress(session, app, cid, members - 1)  # counted by the third driver
            children[holder].resume()  # the paused driver: its late writes are refused
            final = await canvas_result(session, app, cid, wait=True)
            chained = await canvas_result(session, app, linked, wait=True)
            worker.request_stop()
            nursery.cancel_scope.cancel()
    assert final is not None and final.state == "succeeded", final
    assert final.result == {"sum": sum(n * n for n in range(members)), "label": "faults"}
    assert worker.runs[f"{cid}-callback"] == 1
    assert chained is not None and chained.result == 6
    assert all(count == 1 for count in worker.runs.values()), worker.runs


class Collector(Worker):
    """Drives the canvas (it holds the duties) and runs the chord's callback only."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.runs: dict[str, int] = {}

    @task
    async def total(self, job: Task) -> int:
        self.runs[job.id] = self.runs.get(job.id, 0) + 1
        return sum(job.payload["results"])


async def _spawn_squarer(*args: object, name: str,
                         task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    async with spawn(python_argv(HELPERS / "canvas_worker.py", *args), name=name) as child:
        task_status.started(child)
        await child.wait()


async def test_a_member_whose_worker_is_killed_runs_again_and_the_callback_once(
        zk_hosts: str, chroot: str) -> None:
    app, members, hang = "canvas-member-kill", 6, 3
    driver = Collector(app, name="driver")
    with trio.fail_after(60):
        async with Session(zk_hosts, chroot=chroot) as session, \
                trio.open_nursery() as nursery:
            nursery.start_soon(_serve, session, driver)
            await wait_exists(session, f"/apps/{app}/workers/driver")
            squarers: dict[str, Child] = {}
            for name in ("s1", "s2"):
                squarers[name] = await nursery.start(
                    lambda n=name, **kw: _spawn_squarer(zk_hosts, chroot, app, n, hang,
                                                        name=n, **kw))
                await wait_exists(session, f"/apps/{app}/workers/{name}")
            cid = await apply_canvas(session, app, chord(
                [sig("slow_square", n) for n in range(members)], sig("total")))
            marker = f"/apps/{app}/running/{cid}-{hang}"
            await wait_exists(session, marker)
            owner = (await session.exists(marker)).ephemeralOwner  # type: ignore[union-attr]
            for name, child in squarers.items():
                member = await session.exists(f"/apps/{app}/workers/{name}")
                if member is not None and member.ephemeralOwner == owner:
                    child.kill()  # kill -9 of the worker stuck in member 3
                    break
            else:
                raise AssertionError("no squarer holds the stuck member")
            final = await canvas_result(session, app, cid, wait=True)
            again = await read_result(session, App(app).result_path(f"{cid}-{hang}"))
            driver.request_stop()
            nursery.cancel_scope.cancel()
    assert final is not None and final.state == "succeeded", final
    assert final.result == sum(n * n for n in range(members))
    assert driver.runs == {f"{cid}-callback": 1}
    assert again is not None and again.ok and again.attempts == 2  # run again elsewhere
