"""Unrouted tasks (issue #39, named queues), against the real ZooKeeper: a task submitted
before any worker registered its type goes to the default queue marked ``unrouted/<id>``, and
the app's duty holder moves it into its type's queue once the catalog names it - once, never
lost, never run twice - whether a worker serving only that queue starts later, a
default-serving worker with the type takes it first, or the holder is killed -9 mid-move."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from framework import ConfigurationError, Session, WorkQueue, errors
from framework.runtime import Client, Task, Worker, task
from framework.runtime.app import App
from framework.runtime.submission import Submitter, TaskExists
from framework.runtime.tasks import new_task
from framework.testing import python_argv, spawn
from framework.zk import wait_exists, wait_gone

HELPERS = Path(__file__).parent / "helpers"
APP = "routing"
TIMEOUT = 4.0


# ---------------------------------------------------------------- the queue's move


async def test_move_takes_only_an_unclaimed_item_into_the_other_queue(
        session: Session) -> None:
    source, target = WorkQueue(session, "/src"), WorkQueue(session, "/dst")
    await source.put(b"a")
    head = await source.put(b"b", priority=-2)
    await session.ensure_path("/marks")
    with trio.fail_after(30):
        async with source.take() as item:  # the head (priority -2) is held now
            assert item.name == head
            assert await source.move(item.name, target) is None  # held: not moved
            other = next(n for n in await source.item_names() if n != head)
            moved = await source.move(other, target,
                                      also=lambda txn: txn.create("/marks/m", b""),
                                      rewrite=lambda data: data + b"!")
            assert moved is not None
        assert await source.size() == 0  # the held one acked, the other moved
        async with target.take() as again:
            assert again.data == b"a!" and again.attempts == 1  # no delivery counted
    assert await session.exists("/marks/m") is not None
    assert await source.move(other, target) is None  # gone
    await source.put(b"x")
    name = (await source.item_names())[0]
    with pytest.raises(errors.TransactionFailedError) as refused:
        await source.move(name, target, also=lambda txn: txn.create("/marks/m", b""))
    assert refused.value.failed_index == 0  # counted from the caller's operations
    assert await source.item_names() == [name] and await target.size() == 0
    with pytest.raises(ConfigurationError):
        await source.move("nonsense", target)
    with pytest.raises(ConfigurationError):
        await source.move(name, source)


# ---------------------------------------------------------------- routing


class Gpu(Worker):
    """Has the type ``render`` of queue ``gpu``; records each run by task id."""

    app_name = APP
    status_interval = 0.05

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.ran: list[str] = []
        self.changed = trio.Event()
        self.gate: trio.Event | None = None
        self.entered = trio.Event()

    @task(queue="gpu")
    async def render(self, job: Task) -> Any:
        self.entered.set()
        if self.gate is not None:
            await self.gate.wait()
        self.ran.append(job.id)
        self.changed.set()
        self.changed = trio.Event()
        return job.queue_name

    async def ran_all(self, count: int) -> None:
        while len(self.ran) < count:
            await self.changed.wait()


class GpuNoDuties(Gpu):
    duties = False


async def serve(nursery: trio.Nursery, hosts: str, chroot: str, worker: Worker) -> None:
    async def hold(task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        async with Session(hosts, chroot=chroot, session_timeout=TIMEOUT) as session:
            task_status.started()
            await worker.run(session)

    await nursery.start(hold)


async def _unrouted(session: Session) -> list[str]:
    try:
        return await session.children(App(APP).unrouted)
    except errors.NoNodeError:
        return []


async def _depth(session: Session, queue: str) -> int:
    return await WorkQueue(session, App(APP).queue_path(queue)).size()


async def test_a_task_submitted_before_any_worker_runs_once_in_its_named_queue(
        session: Session, zk_hosts: str, chroot: str) -> None:
    app = App(APP)
    client = Client(session, APP, create=True)
    early = await client.submit("render", 1)  # no catalog yet: default queue, marked
    pinned = await client.submit("render", 2, queue="default")  # explicit: never touched
    other = await client.submit("render", 3, queue="other")
    assert await _unrouted(session) == [early.id]
    assert await _depth(session, "default") == 2
    late = Submitter(session, app, WorkQueue(session, app.tasks))
    assert await late._type_of("render") is None  # this submitter read an empty catalog
    worker = Gpu(name="g", queues=["gpu"])
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await serve(nursery, zk_hosts, chroot, worker)
            record = await client.result(early.id, wait=True)
            assert record is not None and record.ok and record.result == "gpu"
            await wait_gone(session, app.unrouted_path(early.id))
            # the race: its put lands after the worker registered and the router swept
            task = new_task(4, name="render")
            await late._put_unrouted(task, task.encode(), 0)
            record = await client.result(task.id, wait=True)
            assert record is not None and record.ok and record.result == "gpu"
            await wait_gone(session, app.unrouted_path(task.id))
            nursery.cancel_scope.cancel()
    assert sorted(worker.ran) == sorted([early.id, task.id])  # each once
    assert await _unrouted(session) == []
    assert await _depth(session, "default") == 1  # the pinned one, untouched
    assert await _depth(session, "other") == 1
    assert await client.result(pinned.id) is None and await client.result(other.id) is None


async def test_a_default_serving_worker_with_the_type_that_took_it_first_keeps_it(
        session: Session, zk_hosts: str, chroot: str) -> None:
    app = App(APP)
    client = Client(session, APP, create=True)
    early = await client.submit("render", 1, key="k1")
    first = GpuNoDuties(name="first", queues=["default"])
    first.gate = trio.Event()
    router = Gpu(name="router", queues=["gpu"])
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await serve(nursery, zk_hosts, chroot, first)
            await first.entered.wait()  # it holds the task in the default queue
            await serve(nursery, zk_hosts, chroot, router)  # holds the duties: routes
            await wait_gone(session, app.unrouted_path(early.id))  # held: left, marker gone
            first.gate.set()
            record = await client.result("k1", wait=True)
            assert record is not None and record.ok and record.worker == "first"
            assert record.result == "default"
            nursery.cancel_scope.cancel()
    assert first.ran == ["k1"] and router.ran == []
    assert await _depth(session, "default") == 0 and await _depth(session, "gpu") == 0


async def test_a_keyed_task_moved_by_a_holder_that_died_stays_queued_for_its_key(
        session: Session, zk_hosts: str, chroot: str) -> None:
    app = App(APP)
    client = Client(session, APP, create=True)
    await client.submit("render", 1, key="k9")  # unrouted; pending/ names its default item
    # what a holder killed between its move and the pending/ marker's update leaves: the move
    default, gpu = WorkQueue(session, app.tasks), WorkQueue(session, app.queue_path("gpu"))
    item = (await default.item_names())[0]
    assert await default.move(item, gpu, rewrite=lambda data: attrs.evolve(
        Task.decode(data), queue="gpu").encode()) is not None
    found = await client.existing("k9")  # by its unrouted/ marker
    assert found is not None and found.state == "queued"
    with pytest.raises(TaskExists):
        await client.submit("render", 2, key="k9")
    holder = Gpu(name="h", queues=["other"])  # routes; never runs a gpu task
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await serve(nursery, zk_hosts, chroot, holder)
            await wait_gone(session, app.unrouted_path("k9"))  # swept: pending/ re-pointed
            found = await client.existing("k9")
            assert found is not None and found.state == "queued"
            nursery.cancel_scope.cancel()
    assert holder.ran == [] and await _depth(session, "gpu") == 1


class Plain(Worker):
    """Has only the type ``plain`` (default queue): the catalog it registers does not list
    ``render``."""

    app_name = APP

    @task
    async def plain(self, job: Task) -> None:
        return None


async def test_a_delayed_task_submitted_before_any_worker_is_routed_when_due(
        session: Session, zk_hosts: str, chroot: str) -> None:
    app = App(APP)
    client = Client(session, APP, create=True)
    # both delayed while the catalog is empty: no queue known, none named
    soon = await client.submit("render", 1, countdown=0.5)
    later = await client.submit("render", 2, countdown=2.0)
    pinned = await client.submit("render", 3, countdown=0.5, queue="default")
    plain = Plain(name="p", queues=["default"])  # the duty holder first: it moves them
    gpu = Gpu(name="g", queues=["gpu"])
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await serve(nursery, zk_hosts, chroot, plain)
            # due while the catalog lists only `plain`: queued by default, marked
            await wait_exists(session, app.unrouted_path(soon.id))
            await serve(nursery, zk_hosts, chroot, gpu)
            # `later` is due after render is registered (routed by the mover at once) or,
            # on a slow machine, before (marked, then moved): in `gpu` either way
            await gpu.ran_all(2)
            await wait_gone(session, app.unrouted_path(soon.id))
            nursery.cancel_scope.cancel()
    assert sorted(gpu.ran) == sorted([soon.id, later.id])  # each once
    assert await _unrouted(session) == []
    assert await _depth(session, "default") == 1  # the pinned one, never routed
    assert await client.result(pinned.id) is None


async def _spawn(*args: object, name: str,
                 task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    async with spawn(python_argv(HELPERS / "router_worker.py", *args), name=name) as child:
        task_status.started(child)
        await child.wait()


async def test_kill_9_of_the_router_mid_move_loses_nothing_and_runs_each_once(
        session: Session, zk_hosts: str, chroot: str) -> None:
    app, count = App(APP), 40
    client = Client(session, APP, create=True)
    tasks = [await client.submit("render", n) for n in range(count)]
    assert len(await _unrouted(session)) == count
    recorder = GpuNoDuties(name="rec", queues=["gpu"])  # runs them; never routes
    with trio.fail_after(90):
        async with trio.open_nursery() as nursery:
            await serve(nursery, zk_hosts, chroot, recorder)
            await wait_exists(session, app.types)
            holder = await nursery.start(
                lambda **kw: _spawn(zk_hosts, chroot, APP, "r1", name="r1", **kw))
            while True:  # until its first move (a marker deleted), then kill -9
                changed = trio.Event()
                left = await session.children(app.unrouted, watch=session.waker(changed))
                if len(left) < count:
                    break
                await changed.wait()
            holder.kill()
            moved_before = count - len(left)
            await nursery.start(
                lambda **kw: _spawn(zk_hosts, chroot, APP, "r2", name="r2", **kw))
            await recorder.ran_all(count)
            while await _unrouted(session):
                changed = trio.Event()
                if await session.children(app.unrouted, watch=session.waker(changed)):
                    await changed.wait()
            nursery.cancel_scope.cancel()
    assert moved_before < count
    assert sorted(recorder.ran) == sorted(t.id for t in tasks)  # each once, none lost
    assert await _depth(session, "default") == 0 and await _depth(session, "gpu") == 0


async def test_submit_many_before_any_worker_marks_each_task(session: Session) -> None:
    app = App(APP)
    submitter = Submitter(session, app, WorkQueue(session, app.tasks))
    tasks = await submitter.submit_many("render", [1, 2, 3], keys=["a", "b", "c"])
    named = await submitter.submit_many("render", [4], queue="gpu")  # explicit: unmarked
    assert sorted(await _unrouted(session)) == ["a", "b", "c"]
    assert [t.queue for t in tasks] == [None] * 3 and named[0].queue == "gpu"
    assert await _depth(session, "default") == 3 and await _depth(session, "gpu") == 1
