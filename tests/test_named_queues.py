"""Named queues (issue #39 item 3), against the real ZooKeeper: a task type names its queue
(``@task(queue=...)``, a submit may override it), a worker serves the queues it is told
(``Worker(queues=...)``, ``framework run -Q``), each slot races one take per served queue
and never holds more claims than its concurrency; everything that puts a task puts it into
its queue, everything that looks for one looks in every queue."""

from __future__ import annotations

from typing import Any

import trio

from framework import Session, WorkQueue
from framework.primitives.queue import QueueItem
from framework.runtime import Client, Task, Worker, task
from framework.runtime.app import App
from framework.zk import wait_exists


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
