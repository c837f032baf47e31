"""Retention through the records' time index and the queued markers (issue #29): the rules
checked record by record on a real ZooKeeper, whole old slots going, a deposed master
deleting nothing, and a pass whose requests do not depend on the queue's length."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio

from framework import LeadershipLost, Session
from framework.primitives import Election, Term, WorkQueue
from framework.runtime import App, Client, Task, TaskResult, Worker
from framework.runtime.app import ensure_result_buckets
from framework.runtime.results.result_index import (
    SlotKeeper,
    entry_path,
    mark_queued,
    read_mark,
    slot_of,
    write_record,
)
from framework.runtime.results.retention import Limit, Retention

HOUR = 3600.0


class Failing(Worker):
    """Returns the payload, or fails (one delivery: then it is a dead letter) on "fail"."""

    max_attempts = 1
    concurrency = 2

    async def handle(self, task: Task) -> Any:
        if task.payload == "fail":
            raise RuntimeError("planned")
        return task.payload


@asynccontextmanager
async def leading(session: Session, app: App, *, count: int | None = 0,
                  seconds: float | None = None, batch: int = 1000
                  ) -> AsyncIterator[tuple[Retention, Term]]:
    """A retention of ``app`` in a real term of its election."""
    await session.ensure_path(app.masters)
    async with Election(session, app.masters, b"m").leadership() as term:
        queue = WorkQueue(session, app.tasks, dead_letter=app.dead)
        yield Retention(session, app, term, queue, results=Limit(count, seconds),
                        dead=Limit(), failures=Limit(), batch=batch), term


async def index_entries(session: Session, app: App) -> dict[str, int]:
    """Every entry of the time index: key -> slot."""
    found = {}
    for day in await session.children(app.results_log):
        for slot in await session.children(f"{app.results_log}/{day}"):
            for key in await session.children(f"{app.results_log}/{day}/{slot}"):
                found[key] = int(slot)
    return found


async def write_records(session: Session, app: App, keys: list[str]) -> None:
    """Records of ``keys`` as a worker writes them, all in the slot of now."""
    keeper = SlotKeeper(session, app)
    slot = keeper.current(time.time())
    await keeper.made(slot)
    for key in keys:
        record = TaskResult(key, True, "w", 1, key, key=key).encode()
        await write_record(session, app, key, record, slot)


async def submit(session: Session, app: App, payload: Any, key: str | None = None) -> Task:
    """Queue a task as ``Client.submit`` does: the put, then (an explicit key) its marker."""
    task = Task(key or uuid.uuid4().hex, payload, key)
    name = await WorkQueue(session, app.tasks).put(task.encode())
    if key is not None:
        await mark_queued(session, app, [(key, name)])
    return task


async def run_until_idle(session: Session, client: Client, worker: Worker,
                         keys: list[str]) -> None:
    """Run ``worker`` until every one of ``keys`` has a record."""
    async with trio.open_nursery() as nursery:
        nursery.start_soon(worker.run, session)
        for key in keys:
            await client.result(key, wait=True)
        worker.request_stop()


async def test_a_record_comes_with_its_index_entry_and_its_key_with_a_queued_marker(
    session: Session,
) -> None:
    app = App("layout")
    client = Client(session, app)
    with trio.fail_after(30):
        await submit(session, app, "one", key="k1")
        two = await submit(session, app, "two")  # a generated id: no marker
        mark = read_mark((await session.get(app.pending_path("k1")))[0], "")
        assert len(mark.items) == 1
        assert await session.exists(f"{app.tasks}/items/{mark.items[0]}") is not None
        assert await session.children(app.pending) == [app.pending_path("k1").split("/")[-2]]
        worker = Failing(app, name="w")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(worker.run, session)
            assert (await client.result("k1", wait=True)).result == "one"
            assert (await client.result(two.id, wait=True)).result == "two"
            worker.request_stop()
        entries = await index_entries(session, app)
        assert set(entries) == {"k1", two.id}  # one entry per record, in its write's slot
        assert entries["k1"] in (slot_of(time.time()), slot_of(time.time()) - 1,
                                 slot_of(time.time()) - 2)
        assert await session.exists(entry_path(app, entries["k1"], "k1")) is not None
        async with leading(session, app, count=0) as (retention, _term):
            assert await retention.apply() == {"dead": 0, "failures": 0, "results": 2}
        # the record, its entry and its marker went together; a lookup finds nothing
        assert await client.result("k1") is None
        assert await index_entries(session, app) == {}
        assert await session.exists(app.pending_path("k1")) is None


async def test_records_are_kept_while_queued_claimed_or_dead_lettered(
    session: Session,
) -> None:
    app = App("kept")
    client = Client(session, app)
    queue = WorkQueue(session, app.tasks, dead_letter=app.dead)
    with trio.fail_after(60):
        await submit(session, app, "v", key="queued")
        await submit(session, app, "v", key="claimed")
        await submit(session, app, "fail", key="dead")
        await submit(session, app, "v", key="free")
        await run_until_idle(session, client, Failing(app, name="w"),
                             ["queued", "claimed", "dead", "free"])
        # no worker now: "queued" and "claimed" are submitted again
        await submit(session, app, "v", key="queued")
        await submit(session, app, "v", key="claimed")
        async with leading(session, app, count=0) as (retention, _term):
            async with queue.take() as item:
                assert Task.decode(item.data).key in ("queued", "claimed")
                # one of them is claimed (as a running handler's), the other queued
                assert await retention.apply() == {"dead": 0, "failures": 0, "results": 1}
                assert await client.result("free") is None
                for key in ("queued", "claimed", "dead"):
                    assert await client.result(key) is not None, key
            # acknowledged (no record written: this claim is ours, not a worker's)
            assert await retention.apply() == {"dead": 0, "failures": 0, "results": 1}
            left = [k for k in ("queued", "claimed") if await client.result(k) is not None]
            assert len(left) == 1  # the one still queued
            async with queue.take():
                pass
            dead = await client.dead_letters()
            assert [d.key for d in dead] == ["dead"]
            await client.discard(dead[0].name)
            assert await retention.apply() == {"dead": 0, "failures": 0, "results": 2}
            assert await index_entries(session, app) == {}
            for key in ("queued", "claimed", "dead", "free"):
                assert await session.exists(app.pending_path(key)) is None


async def test_age_deletes_whole_old_slots_and_a_rewritten_record_moves(
    session: Session,
) -> None:
    app = App("aged")
    await write_records(session, app, [f"r{n}" for n in range(30)])
    # a record rewritten long after its slot: it was created an hour "before now"
    old = slot_of(time.time() - 2 * HOUR)
    await session.ensure_path(entry_path(app, old, "x").rsplit("/", 1)[0])
    record = TaskResult("late", True, "w", 1, None, key="late").encode()
    await write_record(session, app, "late", record, old)
    async with leading(session, app, count=None, seconds=HOUR) as (retention, _term):
        # now: nothing is an hour old (the rewritten one is as old as its write)
        assert (await retention.apply())["results"] == 0
        assert (await index_entries(session, app))["late"] == slot_of(time.time())
        # two hours later: every slot is over the age; 30 at most per pass
        later = time.time() + 2 * HOUR
        trimmer = retention.results
        assert await trimmer.trim(later, 20, set()) == 20
        assert await trimmer.trim(later, 20, set()) == 11
        assert await index_entries(session, app) == {}
        for day in await session.children(app.results_log):  # the emptied slots went too
            assert await session.children(f"{app.results_log}/{day}") == []


async def test_a_deposed_master_deletes_nothing(session: Session) -> None:
    app = App("deposed")
    await write_records(session, app, ["a", "b", "c"])
    async with leading(session, app, count=0) as (retention, term):
        await session.set(term.node, b"a later term")  # the fence's version moves on
        with pytest.raises(LeadershipLost):
            await retention.apply()
    assert set(await index_entries(session, app)) == {"a", "b", "c"}
    for key in "abc":
        assert await session.exists(app.result_path(key)) is not None


async def requests_of_a_pass(session: Session, app: App, queued: int) -> tuple[int, int]:
    """(requests, records deleted) of one pass over 40 records with count limit 20 while
    ``queued`` tasks (half with an explicit key) wait in the queue."""
    await ensure_result_buckets(session, app)  # as the first worker does
    await write_records(session, app, [f"r{n}" for n in range(40)])
    queue = WorkQueue(session, app.tasks)
    await queue.put_many([Task(f"t{n}", n).encode() for n in range(queued // 2)])
    for n in range(queued // 2):
        await submit(session, app, n, key=f"q{n}")
    calls = [0]
    async with leading(session, app, count=20) as (retention, _term):
        original = session._call

        async def counted(request: Any) -> Any:
            calls[0] += 1
            return await original(request)

        session._call = counted  # type: ignore[method-assign]
        try:
            deleted = (await retention.apply())["results"]
        finally:
            session._call = original  # type: ignore[method-assign]
    return calls[0], deleted


async def test_the_requests_of_a_pass_do_not_depend_on_the_queue(session: Session) -> None:
    with trio.fail_after(120):
        few = await requests_of_a_pass(session, App("few"), 10)
        many = await requests_of_a_pass(session, App("many"), 1000)
    print(f"retention pass: {few[0]} requests with 10 queued, {many[0]} with 1,000")
    assert few == many
    assert few[1] == 20

