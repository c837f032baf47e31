"""Named queues (issue #39 item 3), against the real ZooKeeper: a task type names its queue
(``@task(queue=...)``, a submit may override it), a worker serves the queues it is told
(``Worker(queues=...)``, ``framework run -Q``), each slot races one take per served queue
and never holds more claims than its concurrency; everything that puts a task puts it into
its queue, everything that looks for one looks in every queue."""

from __future__ import annotations

import json
import sys
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest
import trio

from framework import ConfigurationError, Session, WorkQueue
from framework.primitives.queue import QueueItem
from framework.runtime import (
    Client,
    Existing,
    Revocation,
    Task,
    TaskExists,
    TaskResult,
    Worker,
    every,
    task,
)
from framework.runtime.app import App
from framework.runtime.operations import ActionError, gather_status, queue_reports
from framework.testing import spawn
from framework.testing.stub import StubApp
from framework.zk import wait_exists, watch_children, watch_data
from tests.test_cli_ops import cli, zk


async def test_a_refused_claim_goes_back_as_never_delivered(session: Session) -> None:
    queue = WorkQueue(session, "/q", lease=5.0)
    await queue.put(b"one")
    seen: list[int] = []

    def refuse_first(item: QueueItem) -> bool:
        seen.append(item.attempts)
        return len(seen) > 1  # the first claim is handed back, the second admitted

    with trio.fail_after(30):
        async with queue.take(admit=refuse_first) as item:
            assert item.data == b"one"
            # the refused claim was not a delivery: this one is the first
            assert item.attempts == 1
    assert seen == [1, 1]
    assert await queue.size() == 0


# ---------------------------------------------------------------- routing (in-process)

APP = "nq"
TIMEOUT = 4.0


class Kinds(Worker):
    """Three task types, each in its own queue: ``a`` and ``b`` named, ``plain`` in the
    default queue; records what it ran and how many handlers run at once."""

    app_name = APP
    backoff_base = 0.01
    duties = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.ran: list[tuple[str, Any]] = []
        self.running = 0
        self.most = 0
        self.gate: trio.Event | None = None  # set: handlers wait on it
        self.entered = trio.Event()

    async def _run(self, name: str, task: Task) -> Any:
        self.running += 1
        self.most = max(self.most, self.running)
        self.entered.set()
        try:
            if self.gate is not None:
                await self.gate.wait()
            self.ran.append((name, task.payload))
            return {"queue": task.queue_name, "attempts": task.attempts}
        finally:
            self.running -= 1

    @task(queue="a")
    async def alpha(self, task: Task) -> Any:
        return await self._run("alpha", task)

    @task(queue="b")
    async def beta(self, task: Task) -> Any:
        return await self._run("beta", task)

    @task
    async def plain(self, task: Task) -> Any:
        return await self._run("plain", task)


async def serve(nursery: trio.Nursery, hosts: str, chroot: str, worker: Worker) -> Session:
    async def hold(task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        async with Session(hosts, chroot=chroot, session_timeout=TIMEOUT) as session:
            task_status.started(session)
            await worker.run(session)

    return await nursery.start(hold)


async def _registered(client: Client) -> None:
    """Until the app's catalog lists the workers' types (a watch on the node)."""
    while not await client.task_types():
        await wait_exists(client.session, App(APP).types)


async def _depth(session: Session, queue: str) -> int:
    return await WorkQueue(session, App(APP).queue_path(queue)).size()


async def test_a_worker_serving_only_a_never_takes_a_task_of_b(
        session: Session, zk_hosts: str, chroot: str) -> None:
    only_a = Kinds(name="only-a", queues=["a"])
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await serve(nursery, zk_hosts, chroot, only_a)
            client = Client(session, APP)
            await _registered(client)
            b1 = await client.submit("beta", 1)
            # a submit may send a type's task elsewhere: beta into queue a runs here
            b2 = await client.submit("beta", 2, queue="a")
            a1 = await client.submit("alpha", 3)
            for done in (b2, a1):
                record = await client.result(done.id, wait=True)
                assert record is not None and record.ok
                assert record.result == {"queue": "a", "attempts": 1}
            assert await client.result(b1.id) is None
            assert await _depth(session, "b") == 1  # it waits for a worker serving b
            assert await _depth(session, "default") == 0
            # a worker serving a and b takes both kinds
            both = Kinds(name="both", queues="a,b")
            await serve(nursery, zk_hosts, chroot, both)
            record = await client.result(b1.id, wait=True)
            assert record is not None and record.ok and record.worker == "both"
            assert record.result == {"queue": "b", "attempts": 1}
            nursery.cancel_scope.cancel()
    assert sorted(only_a.ran) == [("alpha", 3), ("beta", 2)]
    assert both.ran == [("beta", 1)]


async def test_one_slot_two_queues_never_holds_two_claims(
        session: Session, zk_hosts: str, chroot: str) -> None:
    """Concurrency 1, items in both queues: one handler at a time, never two tasks held;
    every lost race handed back uncounted (each task ran once, at attempt 1)."""
    client = Client(session, APP, create=True)
    worker = Kinds(name="w", queues=("a", "b"))
    worker.gate = trio.Event()
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await serve(nursery, zk_hosts, chroot, worker)
            await _registered(client)
            tasks = []
            for n in range(10):
                tasks.append(await client.submit("alpha", n))
                tasks.append(await client.submit("beta", n))
            await worker.entered.wait()
            # the first handler holds its task: the claims of both queues settle at one
            app = App(APP)
            queues = [WorkQueue(session, app.queue_path(q)) for q in ("a", "b")]
            while True:
                changed = trio.Event()
                claimed = [await q.counts(changed=changed) for q in queues]
                if sum(c.claimed or 0 for c in claimed) == 1:
                    break
                await changed.wait()
            assert worker.running == 1
            worker.gate.set()
            records = [await client.result(t.id, wait=True) for t in tasks]
            nursery.cancel_scope.cancel()
    assert worker.most == 1
    assert all(r is not None and r.ok and r.attempts == 1 for r in records)
    assert sorted(name for name, _ in worker.ran) == ["alpha"] * 10 + ["beta"] * 10


async def test_priorities_hold_within_a_queue(
        session: Session, zk_hosts: str, chroot: str) -> None:
    client = Client(session, APP, create=True)
    worker = Kinds(name="w", queues=["a"])
    worker.gate = trio.Event()
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await serve(nursery, zk_hosts, chroot, worker)
            await _registered(client)  # the submitters learn alpha's queue from the catalog
            first = await client.submit("alpha", "first")
            await worker.entered.wait()  # held: what follows queues up behind it
            tasks = [await client.submit("alpha", n, priority=p)
                     for n, p in enumerate([5, 0, -3, 0, 9, -3])]
            await client.submit("beta", "other queue", priority=-100)  # not served here
            worker.gate.set()
            for t in [first, *tasks]:
                await client.result(t.id, wait=True)
            nursery.cancel_scope.cancel()
    # lowest priority value first, then submission order
    assert [payload for _name, payload in worker.ran] == ["first", 2, 5, 1, 3, 0, 4]


class Routed(Kinds):
    """Kinds whose alpha calls back beta, with a schedule of beta (worker-only duties)."""

    duties = True
    schedules = [every(0.3, "beta", {"tick": True}, name="tick")]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.ticked = trio.Event()
        self.called_back = trio.Event()
        self.seen: list[tuple[Any, str]] = []  # (payload, queue) of each beta

    @task(queue="b")
    async def beta(self, task: Task) -> Any:
        payload = task.payload
        self.seen.append((payload, task.queue_name))
        if isinstance(payload, dict) and payload.get("tick"):
            self.ticked.set()
        elif isinstance(payload, dict) and payload.get("name") == "alpha":
            self.called_back.set()
        return await self._run("beta", task)


async def test_delayed_periodic_and_callback_tasks_land_in_their_queue(
        session: Session, zk_hosts: str, chroot: str) -> None:
    worker = Routed(name="w", queues=["a", "b"], app=APP)
    client = Client(session, APP, create=True)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await serve(nursery, zk_hosts, chroot, worker)
            await _registered(client)
            later = await client.submit("alpha", "later", countdown=0.5)
            record = await client.result(later.id, wait=True)
            assert record is not None and record.result == {"queue": "a", "attempts": 1}
            await worker.ticked.wait()  # the schedule's task: into beta's queue, b
            await client.submit("alpha", "calls back", on_success="beta")
            await worker.called_back.wait()  # the callback: into its type's queue, b
            nursery.cancel_scope.cancel()
    assert {queue for _payload, queue in worker.seen} == {"b"}
    assert later.queue == "a"  # what the delayed mover read to put it into queue a


async def test_lookups_revoke_purge_and_status_see_every_queue(
        session: Session, zk_hosts: str, chroot: str) -> None:
    """Nobody serves b: its tasks wait there, and every reader finds them."""
    client = Client(session, APP, create=True)
    worker = Kinds(name="only-a", queues=["a"])
    app = App(APP)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await serve(nursery, zk_hosts, chroot, worker)
            await _registered(client)
            keyed = await client.submit("beta", 1, key="keyed")
            unkeyed = await client.submit("beta", 2)  # found by reading queue b's items
            third = await client.submit("beta", 3)
            assert (await client.existing("keyed")) == Existing("keyed", "queued")
            with pytest.raises(TaskExists):
                await client.submit("beta", 1, key="keyed")
            assert await client.revoke(unkeyed.id) is Revocation.REVOKED
            status = await gather_status(session, app)
            assert status.queues == {"default": 0, "a": 0, "b": 3}
            assert status.queue_depth == 3
            # b holds tasks, and the type plain routes to default: nobody serves either
            assert status.queues_without_worker == ["default", "b"]
            reports = {r.name: r for r in await queue_reports(session, app)}
            assert (reports["b"].queued, reports["b"].workers) == (3, [])
            assert reports["a"].workers == ["only-a"]
            assert reports["b"].types == {"beta": 3}
            with pytest.raises(ActionError, match="only-a"):
                await client.purge_queue("a")  # served: refused
            assert await client.purge_queue("b", by="test") == 3
            assert await _depth(session, "b") == 0
            assert await client.existing("keyed") is None  # its item is gone
            nursery.cancel_scope.cancel()
    assert keyed.queue == third.queue == "b" and worker.ran == []


class Failing(Worker):
    """Fails its one attempt for good: a dead letter of the queue it was taken from."""

    app_name = APP
    duties = False
    max_attempts = 1
    queues = ("c",)

    cured = False

    async def handle(self, task: Task) -> Any:
        if not self.cured:
            raise ValueError("no")
        return task.queue_name


async def test_a_dead_letter_is_requeued_into_its_own_queue(
        session: Session, zk_hosts: str, chroot: str) -> None:
    client = Client(session, APP, create=True)
    worker = Failing(name="w")
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await serve(nursery, zk_hosts, chroot, worker)
            await _registered(client)
            failed = await client.submit("handle", "fail", queue="c")
            record = await client.result(failed.id, wait=True)
            assert record is not None and not record.ok
            async for snap in watch_children(session, App(APP).dead):
                if snap.children:
                    break
            [letter] = await client.dead_letters()
            worker.cured = True
            await client.requeue(letter.name)
            async for data in watch_data(session, App(APP).result_path(failed.id)):
                done = TaskResult.decode(data.data) if data.data else None
                if done is not None and done.ok:  # rewritten when it ran again
                    break
            assert done.result == "c" and done.attempts == 1
            nursery.cancel_scope.cancel()


# ---------------------------------------------------------------- processes (framework run -Q)

ROOT = Path(__file__).parent.parent


class Twin(Worker):
    """``framework run tests.test_named_queues:Twin -Q a,b``: alpha (queue a) returns at
    once; beta (queue b) holds its first delivery forever (until its process is killed)."""

    app_name = APP
    duties = False
    concurrency = 2  # one slot held by beta, the other free for alpha

    @task(queue="a")
    async def alpha(self, task: Task) -> Any:
        return {"queue": task.queue_name, "attempts": task.attempts, "by": self.name}

    @task(queue="b")
    async def beta(self, task: Task) -> Any:
        if task.attempts == 1:
            await trio.sleep_forever()
        return {"queue": task.queue_name, "attempts": task.attempts, "by": self.name}


async def test_kill_9_of_a_worker_serving_two_queues_redelivers_in_its_own_queue(
        session: Session, zk_hosts: str, chroot: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    app = App(APP)
    client = Client(session, APP, create=True)
    with trio.fail_after(90):
        async with AsyncExitStack() as stack:
            twin = await stack.enter_async_context(spawn(
                [sys.executable, "-m", "framework", "run", "tests.test_named_queues:Twin",
                 *zk(zk_hosts, chroot), "--name", "twin", "-Q", "a,b",
                 "--session-timeout", "2"],
                name="twin", log_dir=tmp_path, env={"PYTHONPATH": str(ROOT)}))
            await _registered(client)
            held = await client.submit("beta", "held", key="held")
            quick = await client.submit("alpha", "quick")
            record = await client.result(quick.id, wait=True)
            assert record is not None and record.result == {
                "queue": "a", "attempts": 1, "by": "twin"}
            await wait_exists(session, f"{app.running}/held")  # twin holds it, from b
            # the command line names each queue and who serves it
            code, out, err = await cli(capsys, "inspect", APP, "queues", "--json",
                                       *zk(zk_hosts, chroot))
            assert code == 0, err
            served = {q["name"]: (q["queued"], q["workers"]) for q in json.loads(out)}
            assert served == {"default": (0, []), "a": (0, ["twin"]), "b": (1, ["twin"])}
            await client.submit("alpha", "nobody", queue="c")
            code, out, err = await cli(capsys, "status", APP, *zk(zk_hosts, chroot))
            assert code == 0, err
            assert "queues no worker serves" in out and "c (their tasks wait" in out
            twin.kill()  # kill -9 mid-task
            await stack.enter_async_context(spawn(
                [sys.executable, "-m", "framework", "run", "tests.test_named_queues:Twin",
                 *zk(zk_hosts, chroot), "--name", "b-only", "--queues", "b",
                 "--session-timeout", "2"],
                name="b-only", log_dir=tmp_path, env={"PYTHONPATH": str(ROOT)}))
            # redelivered in its own queue once twin's session ended: a second attempt
            async for snap in watch_data(session, app.result_path(held.key)):
                if snap.data:
                    break
            record = await client.result(held.key)
    assert record is not None and record.ok
    assert record.result == {"queue": "b", "attempts": 2, "by": "b-only"}
    assert await _depth(session, "a") == 0 and await _depth(session, "b") == 0
    assert await _depth(session, "c") == 1  # still waiting: nobody serves c


# ---------------------------------------------------------------- names, the stub, the CLI


def test_a_bad_queue_name_is_one_line() -> None:
    for bad in ("gpu/0", "", "a,,b", 7):
        with pytest.raises(ConfigurationError) as raised:
            Kinds(name="w", queues=bad)  # type: ignore[arg-type]
        assert "\n" not in str(raised.value) and "queue" in str(raised.value)
    with pytest.raises(ConfigurationError, match="queue name"):
        task(queue="no space")
    assert Kinds(name="w", queues=" a , b,a").queues == ("a", "b")
    assert Kinds(name="w").queues == ("default",)


async def test_the_stub_runs_only_the_queues_its_worker_serves() -> None:
    stub = StubApp(Kinds(APP, name="stub", queues=["a"]))
    served = await stub.submit("alpha", 1)
    waits = await stub.submit("beta", 2)
    moved = await stub.submit("beta", 3, queue="a")  # a submit's queue wins
    await stub.join()
    assert stub.result(served.id) is not None and stub.result(moved.id) is not None
    assert stub.result(waits.id) is None and stub.unserved == [waits] and stub.pending == 1


async def test_submit_and_purge_a_queue_from_the_command_line(
        session: Session, zk_hosts: str, chroot: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    for n in range(2):
        code, out, err = await cli(capsys, "submit", APP, "alpha", str(n), "--queue", "c",
                                   "--create", *zk(zk_hosts, chroot))
        assert code == 0, err
    assert await _depth(session, "c") == 2 and await _depth(session, "default") == 0
    code, out, err = await cli(capsys, "submit", APP, "alpha", "--queue", "c/d",
                               *zk(zk_hosts, chroot))
    assert code != 0 and err.count("\n") == 1 and "queue name" in err
    code, out, err = await cli(capsys, "purge", APP, "--queue", "c", *zk(zk_hosts, chroot))
    assert code == 0, err
    assert "deleted 2 task(s) waiting in queue 'c'" in out
    assert await _depth(session, "c") == 0


def test_the_dashboard_model_and_metrics_show_each_queue() -> None:
    from framework.dashboard.model import Model
    from framework.dashboard.prom import registry_for, render

    model = Model()
    view = model.app("media")
    view.queues = {"default": (1, 0), "gpu": (3, 1)}
    view.workers = {"w1": {"state": "running", "types": ["render"], "queues": ["gpu"]},
                    "w2": {"state": "running", "types": ["mail"]},  # default only
                    "m": {"state": "running", "kind": "master"}}  # takes no tasks
    assert (view.depth, view.claimed) == (4, 1)
    assert view.queue_rows() == [
        {"name": "default", "depth": 1, "claimed": 0, "workers": ["w2"]},
        {"name": "gpu", "depth": 3, "claimed": 1, "workers": ["w1"]}]
    exported = render(registry_for(model))
    assert b'framework_app_queue_depth{app="media",queue="gpu"} 3.0' in exported
    assert b'framework_app_queue_depth{app="media",queue="default"} 1.0' in exported
