"""Task types (several named handlers per worker, options per type), the app's catalog
(an unknown name refused at submit), rate limits, and delayed tasks (countdown/eta, moved
by the leader at their time, across a failover), against the real ZooKeeper."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import trio
from rich.console import Console

from framework import ConfigurationError, Session
from framework.cli.render import render_status
from framework.primitives.queue import WorkQueue
from framework.runtime import (
    Client,
    Master,
    MasterContext,
    Outcome,
    Revocation,
    Task,
    Worker,
    task,
)
from framework.runtime.app import App
from framework.runtime.operations.status import AppStatus, Watches, gather_status
from framework.runtime.scheduling.delayed import BUCKET_SECONDS
from framework.runtime.task_types import Catalog, RateLimit, collect
from framework.testing import expire_session
from framework.zk import wait_exists, wait_gone

TIMEOUT = 4.0


class Media(Worker):
    """Three task types: ``handle``, ``resize`` (async) and ``ocr`` (a plain def, one
    attempt only, a rate limit)."""

    concurrency = 4
    backoff_base = 0.01
    max_attempts = 4

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.starts: dict[str, list[float]] = {}

    def _start(self, name: str) -> None:
        self.starts.setdefault(name, []).append(time.time())

    async def handle(self, task: Task) -> Any:
        self._start("handle")
        return {"handled": task.payload}

    @task(priority=-3, time_limit=5)
    async def resize(self, task: Task) -> Any:
        self._start("resize")
        if task.payload.get("fail_until", 0) >= task.attempts:
            raise RuntimeError(f"resize failed on attempt {task.attempts}")
        return {"size": task.payload["size"] // 2, "attempt": task.attempts}

    @task(name="ocr", max_attempts=1, rate_limit="4/s")
    def read_text(self, task: Task) -> Any:
        self._start("ocr")
        if task.payload.get("fail"):
            raise RuntimeError("unreadable")
        return task.payload.get("text", "").upper()


async def serve(nursery: trio.Nursery, hosts: str, chroot: str, worker: Worker) -> Session:
    async def hold(task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        async with Session(hosts, chroot=chroot, session_timeout=TIMEOUT) as session:
            task_status.started(session)
            await worker.run(session)

    return await nursery.start(hold)


@asynccontextmanager
async def serving(hosts: str, chroot: str, worker: Worker) -> AsyncIterator[Session]:
    """``worker`` running (joined its group) and a client session, for the block; the
    worker drains at its end."""
    async with trio.open_nursery() as nursery:
        await serve(nursery, hosts, chroot, worker)
        async with Session(hosts, chroot=chroot) as session:
            await wait_exists(session, f"{worker.app.workers}/{worker.name}")
            yield session
        worker.request_stop()


def test_task_types_are_collected_with_their_options() -> None:
    types = collect(Media, default=Worker.handle)
    assert set(types) == {"handle", "resize", "ocr"}
    assert types["ocr"].method == "read_text" and types["ocr"].blocking
    assert types["ocr"].options.max_attempts == 1
    assert types["ocr"].options.rate_limit == RateLimit(4, 1.0)
    assert not types["resize"].blocking and types["resize"].options.priority == -3


@pytest.mark.parametrize(("options", "message"), [
    ({"rate_limit": "fast"}, "rate_limit must look like"),
    ({"max_attempts": 0}, "max_attempts must be an int >= 1"),
    ({"time_limit": -1}, "time_limit must be positive"),
    ({"priority": 1.5}, "priority must be an int"),
])
def test_bad_task_options_are_one_line_errors(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        task(**options)


def test_two_methods_of_one_name_are_refused() -> None:
    class Twice(Worker):
        @task(name="x")
        async def a(self, task: Task) -> None: ...

        @task(name="x")
        async def b(self, task: Task) -> None: ...

    with pytest.raises(ConfigurationError, match="two methods are task 'x'"):
        Twice("twice")


async def test_each_type_runs_its_handler_with_its_options(zk_hosts: str, chroot: str) -> None:
    worker = Media("media", name="w1")
    with trio.fail_after(60):
        async with serving(zk_hosts, chroot, worker) as session:
            client = Client(session, "media")
            await client.submit("handle", [1, 2], key="h")
            await client.submit("resize", {"size": 640, "fail_until": 1}, key="r")
            await client.submit("ocr", {"text": "hi"}, key="o")
            await client.submit("ocr", {"fail": True}, key="bad")  # one attempt only
            results = {k: await client.result(k, wait=True) for k in ("h", "r", "o", "bad")}
            catalog = await Catalog(session, App("media")).read()
    assert results["h"].result == {"handled": [1, 2]}
    assert results["r"].result == {"size": 320, "attempt": 2}  # retried once, then done
    assert results["o"].result == "HI"
    assert not results["bad"].ok and results["bad"].attempts == 1  # ocr: max_attempts=1
    # every record names its task type, successes and final failures alike
    assert {k: r.name for k, r in results.items()} == {
        "h": "handle", "r": "resize", "o": "ocr", "bad": "ocr"}
    assert set(catalog.types) == {"handle", "resize", "ocr"}
    assert catalog.types["resize"].priority == -3 and catalog.types["ocr"].max_attempts == 1
    assert catalog.types["ocr"].rate_limit == "4/s" and catalog.types["handle"].max_attempts == 4


async def test_an_unknown_task_name_is_refused_at_submit(zk_hosts: str, chroot: str) -> None:
    worker = Media("typo", name="w1")
    with trio.fail_after(60):
        async with serving(zk_hosts, chroot, worker) as session:
            with pytest.raises(ConfigurationError) as refused:
                await Client(session, "typo").submit("resise", {"size": 1})
            # nothing was queued nor delayed (the worker's elected duties may have made
            # the delayed/ directory itself)
            delayed = "/apps/typo/delayed"
            assert await session.exists(delayed) is None or await session.children(delayed) == []
    assert str(refused.value) == ("application 'typo' has no task type 'resise'; its task "
                                  "types: handle, ocr, resize")


class Encoder(Worker):
    """The one class with task type ``transcode``."""

    @task
    async def transcode(self, task: Task) -> str:
        return f"encoded {task.payload}"


async def _status_naming(session: Session, app: str, types: list[str]) -> AppStatus:
    """The app's status once it names ``types`` as having no worker (the workers' status
    documents are published asynchronously: watched until then)."""
    while True:
        watches = Watches()
        status = await gather_status(session, App(app), watches=watches)
        if status.types_without_worker == types:
            return status
        await watches.changed.wait()


async def test_a_task_of_a_type_no_running_worker_has_waits_for_one(
        zk_hosts: str, chroot: str) -> None:
    """``transcode`` is in the catalog (an encoder ran once) but no running worker has it,
    ``transcod`` (a typo submitted before any worker) is in no catalog: the running worker
    never claims their tasks (no delivery counted) and goes on with its own; ``status``
    names both types; an encoder that starts takes its task, at the first delivery; the
    typo's task, revoked, is ended by a worker that lacks its type."""
    with trio.fail_after(60):
        async with Session(zk_hosts, chroot=chroot) as session:
            client = Client(session, "waits", create=True)
            await client.submit("transcod", "typo", key="typo")  # an empty catalog takes it
            encoder = Encoder("waits", name="enc1")
            async with serving(zk_hosts, chroot, encoder):
                pass  # registered its type, then stopped
            await client.submit("transcode", "clip", key="t")
            worker = Media("waits", name="w1")
            async with trio.open_nursery() as nursery:
                await serve(nursery, zk_hosts, chroot, worker)
                await wait_exists(session, "/apps/waits/workers/w1")
                await client.submit("handle", [1], key="h")
                assert (await client.result("h", wait=True)).ok  # type: ignore[union-attr]
                status = await _status_naming(session, "waits", ["transcod", "transcode"])
                names = await WorkQueue(session, "/apps/waits/tasks").item_names()
                deliveries = [(await session.exists(f"/apps/waits/tasks/items/{n}")).version
                              for n in names]  # type: ignore[union-attr]
                assert await client.result("t") is None
                late = Encoder("waits", name="enc2")
                await serve(nursery, zk_hosts, chroot, late)
                record = await client.result("t", wait=True)
                # a revoked task of a type nobody has is taken only to be ended
                assert await client.revoke("typo") is Revocation.REVOKED
                typo = await client.result("typo", wait=True)
                await wait_gone(session, "/apps/waits/revoked/typo")
                worker.request_stop()
                late.request_stop()
    assert "types with no worker  transcod, transcode" in _text(status)
    assert len(names) == 2 and deliveries == [0, 0]  # passed over, never claimed
    assert record is not None and record.ok and record.attempts == 1
    assert record.worker == "enc2" and record.result == "encoded clip"
    assert typo is not None and typo.outcome is Outcome.REVOKED


def _text(status: AppStatus) -> str:
    console = Console(width=200, record=True)
    console.print(render_status(status))
    return console.export_text()


class Mailer(Worker):
    concurrency = 2

    @task
    async def email(self, task: Task) -> str:
        return f"sent {task.payload}"


class Renderer(Worker):
    concurrency = 2

    @task
    async def render(self, task: Task) -> str:
        return f"drew {task.payload}"


async def _in_line(session: Session, app: str, count: int) -> None:
    """Return once ``count`` idle consumers wait in the app queue's lines (watched)."""
    root = f"/apps/{app}/tasks/waiting"
    await wait_exists(session, root)
    while True:
        changed = trio.Event()
        wake = session.waker(changed)
        found = 0
        for name in await session.children(root, watch=wake):
            if name.startswith("w-"):
                found += 1
            else:
                found += len(await session.children(f"{root}/{name}", watch=wake))
        if found >= count:
            return
        await changed.wait()


async def test_two_worker_classes_take_only_their_own_types(zk_hosts: str, chroot: str) -> None:
    """Two renderers wait first (the heads of an idle line), then a mailer: ten emails, then
    ten renders, all succeed at their first delivery, each on its own class, with no
    failure recorded.  The mailer waits in a line of its own: in one line with the
    renderers ahead it would not be woken by the emails, which they pass over."""
    gpus = [Renderer("mixed", name=f"gpu{n}") for n in (1, 2)]
    mailer = Mailer("mixed", name="cpu1")
    with trio.fail_after(60):
        async with Session(zk_hosts, chroot=chroot) as session, \
                trio.open_nursery() as nursery:
            for gpu in gpus:
                await serve(nursery, zk_hosts, chroot, gpu)
            await _in_line(session, "mixed", 2)
            await serve(nursery, zk_hosts, chroot, mailer)
            await _in_line(session, "mixed", 3)
            client = Client(session, "mixed", create=True)
            results = {}
            for kind in ("email", "render"):  # emails first: the renderers stay in line
                for n in range(10):
                    await client.submit(kind, n, key=f"{kind[0]}{n}")
                for n in range(10):
                    results[f"{kind[0]}{n}"] = await client.result(f"{kind[0]}{n}", wait=True)
            failures = await session.children("/apps/mixed/failures")
            for worker in (*gpus, mailer):
                worker.request_stop()
    assert failures == []
    for key, record in results.items():
        assert record is not None and record.ok and record.attempts == 1, (key, record)
        assert (record.worker == "cpu1") == key.startswith("e"), (key, record.worker)


async def test_a_rate_limit_spaces_the_starts_of_its_type(zk_hosts: str, chroot: str) -> None:
    worker = Media("rate", name="w1")
    with trio.fail_after(60):
        async with serving(zk_hosts, chroot, worker) as session:
            client = Client(session, "rate")
            for n in range(8):
                await client.submit("ocr", {"text": str(n)}, key=f"o{n}")
            for n in range(8):
                await client.result(f"o{n}", wait=True)
    starts = sorted(worker.starts["ocr"])
    # 4/s: a burst of 4, then one every 0.25 s: the 8th starts at least 0.9 s after the 1st
    assert len(starts) == 8 and starts[-1] - starts[0] >= 0.9


class Hold(Master):
    """Leads until told to stop; records its contexts."""

    def __init__(self, app: str, contexts: list[MasterContext], **kw: Any) -> None:
        super().__init__(app, **kw)
        self.contexts = contexts
        self.elected = trio.Event()

    async def lead(self, ctx: MasterContext) -> None:
        self.contexts.append(ctx)
        self.elected.set()
        await trio.sleep_forever()


async def test_a_delayed_task_is_queued_at_its_time_and_not_before(zk_hosts: str,
                                                                   chroot: str) -> None:
    contexts: list[MasterContext] = []
    master = Hold("later", contexts)
    worker = Media("later", name="w1")
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await serve(nursery, zk_hosts, chroot, worker)
            async with Session(zk_hosts, chroot=chroot) as session, \
                    trio.open_nursery() as leading:
                leading.start_soon(master.run, session)
                await master.elected.wait()
                client = Client(session, "later")
                submitted = time.time()
                await client.submit("handle", "soon", key="soon", countdown=0.6)
                eta = datetime.now(UTC) + timedelta(seconds=0.8)
                await contexts[0].submit("resize", {"size": 8}, key="at", eta=eta)
                buckets = await session.children("/apps/later/delayed")
                assert await client.result("soon") is None  # waiting, not queued
                soon = await client.result("soon", wait=True)
                queued_late = contexts[0].delayed.latest_lateness
                at = await client.result("at", wait=True)
                for bucket in buckets:  # emptied, then dropped by the mover
                    await wait_gone(session, f"/apps/later/delayed/{bucket}")
                master.request_stop()
            worker.request_stop()
    assert soon is not None and soon.started_at >= submitted + 0.6
    print(f"delayed task queued {queued_late:.3f} s and started "
          f"{soon.started_at - submitted - 0.6:.3f} s after its time")
    assert at is not None and at.started_at >= eta.timestamp()
    assert min(worker.starts["handle"]) >= submitted + 0.6


async def test_delayed_tasks_survive_a_master_failover(zk_hosts: str, chroot: str) -> None:
    """Tasks due while the leader's session expires are queued by the next leader, once."""
    contexts: list[MasterContext] = []
    first, second = Hold("failover", contexts, name="m1"), Hold("failover", contexts,
                                                                name="m2")
    worker = Media("failover", name="w1")
    with trio.fail_after(90):
        async with trio.open_nursery() as nursery:
            await serve(nursery, zk_hosts, chroot, worker)
            async with Session(zk_hosts, chroot=chroot, session_timeout=TIMEOUT) as s1, \
                    Session(zk_hosts, chroot=chroot, session_timeout=TIMEOUT) as s2, \
                    trio.open_nursery() as leading:
                nursery = leading
                nursery.start_soon(first.run, s1)
                await first.elected.wait()
                nursery.start_soon(second.run, s2)
                client = Client(s2, "failover")
                keys = [f"d{n}" for n in range(5)]
                for n, key in enumerate(keys):
                    await client.submit("handle", n, key=key, countdown=0.5 + 0.2 * n)
                # one more due far later, in another minute's bucket
                await client.submit("handle", "late", key="late", countdown=BUCKET_SECONDS + 1,
                                    priority=5)
                await expire_session(s1)  # the first leader is gone; the second moves on
                await second.elected.wait()
                results = [await client.result(k, wait=True) for k in keys]
                late_waiting = [n for b in await s2.children("/apps/failover/delayed")
                                for n in await s2.children(f"/apps/failover/delayed/{b}")]
                first.request_stop()
                second.request_stop()
            worker.request_stop()
    assert all(r is not None and r.ok for r in results)
    assert len(worker.starts["handle"]) == 5  # each ran once
    assert len(late_waiting) == 1


class Strict(Worker):
    """A class allowing 3 deliveries with types that allow fewer."""

    max_attempts = 3
    backoff_base = 0.01

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.runs: dict[str, int] = {}

    @task(max_attempts=2)
    async def report(self, task: Task) -> None:
        self.runs[task.key] = self.runs.get(task.key, 0) + 1
        raise ValueError(f"bad row {task.attempts}")

    @task(max_attempts=1, time_limit=0.2)
    async def slow(self, task: Task) -> None:
        self.runs[task.key] = self.runs.get(task.key, 0) + 1
        await trio.sleep_forever()


async def _dead_letters(session: Session, app: str, count: int) -> list[str]:
    """The names under the app's dead letters once there are ``count`` (a children watch)."""
    path = f"/apps/{app}/dead"
    await wait_exists(session, path)
    while True:
        changed = trio.Event()
        names = await session.children(path, watch=session.waker(changed))
        if len(names) >= count:
            return names
        await changed.wait()


async def test_a_type_below_the_class_attempts_keeps_its_real_error(
        zk_hosts: str, chroot: str) -> None:
    """``@task(max_attempts=2)`` in a class with 3: two deliveries, then the dead letter at
    once, and the result says ValueError (not "delivered 3 times"); the same with a time
    limit and ``max_attempts=1``."""
    worker = Strict("strict", name="w1")
    with trio.fail_after(60):
        async with serving(zk_hosts, chroot, worker) as session:
            client = Client(session, "strict")
            await client.submit("report", {}, key="r")
            await client.submit("slow", {}, key="s")
            dead = await _dead_letters(session, "strict", 2)
            report = await client.result("r")
            slow = await client.result("s")
    assert worker.runs == {"r": 2, "s": 1}
    assert sorted(name.rsplit(".", 1)[1] for name in dead) == ["1", "2"]  # deliveries
    assert report is not None and not report.ok and report.attempts == 2
    assert report.error == "ValueError: bad row 2"
    assert slow is not None and not slow.ok and slow.attempts == 1
    assert slow.error == "time limit exceeded"
