"""Revoking one task (``Client.revoke``, ``framework revoke``): a queued task never runs, a
running one has its handler cancelled at once; both are recorded as revoked and never
retried (against the real ZooKeeper)."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import trio

from framework import Session
from framework.cli import main as cli_main
from framework.runtime import Client, Outcome, Revocation, Task, TaskResult, Worker, task
from framework.zk import wait_exists, wait_gone

TIMEOUT = 4.0


class Slow(Worker):
    """``wait`` blocks until cancelled (a long task); ``quick`` returns at once."""

    concurrency = 2
    backoff_base = 0.01

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.started: dict[str, trio.Event] = {}
        self.cancelled: list[str] = []
        self.runs: list[str] = []

    @task
    async def wait(self, task: Task) -> None:
        self.runs.append(task.id)
        self.started.setdefault(task.id, trio.Event()).set()
        try:
            await trio.sleep_forever()
        except trio.Cancelled:
            self.cancelled.append(task.id)
            raise

    @task
    async def quick(self, task: Task) -> str:
        self.runs.append(task.id)
        return "done"


async def serve(nursery: trio.Nursery, hosts: str, chroot: str, worker: Worker) -> None:
    async def hold(task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        async with Session(hosts, chroot=chroot, session_timeout=TIMEOUT) as session:
            task_status.started()
            await worker.run(session)

    await nursery.start(hold)


async def test_a_queued_task_revoked_never_runs(zk_hosts: str, chroot: str) -> None:
    worker = Slow("rq", name="w1")
    with trio.fail_after(60):
        async with Session(zk_hosts, chroot=chroot) as session:
            client = Client(session, "rq", create=True)
            await client.submit("quick", key="keep")
            await client.submit("quick", key="drop")
            await client.submit("quick", key="later", countdown=0.5)  # delayed, not queued
            assert await client.revoke("drop") is Revocation.REVOKED
            assert await client.revoke("drop") is Revocation.ALREADY
            assert await client.revoke("later") is Revocation.REVOKED
            async with trio.open_nursery() as nursery:
                await serve(nursery, zk_hosts, chroot, worker)
                kept = await client.result("keep", wait=True)
                dropped = await client.result("drop", wait=True)
                await wait_gone(session, "/apps/rq/revoked/drop")  # with the ack
                worker.request_stop()
            assert await client.revoke("keep") is Revocation.FINISHED
    assert kept is not None and kept.outcome is Outcome.SUCCEEDED
    assert dropped is not None and dropped.outcome is Outcome.REVOKED and not dropped.ok
    assert dropped.error == "revoked" and dropped.attempts == 1
    assert "drop" not in worker.runs and "keep" in worker.runs


async def test_a_running_task_revoked_is_cancelled_and_never_retried(
        zk_hosts: str, chroot: str) -> None:
    worker = Slow("rr", name="w1")
    with trio.fail_after(60):
        async with Session(zk_hosts, chroot=chroot) as session, \
                trio.open_nursery() as nursery:
            await serve(nursery, zk_hosts, chroot, worker)
            client = Client(session, "rr", create=True)
            await client.submit("wait", key="long")
            await worker.started.setdefault("long", trio.Event()).wait()
            await wait_exists(session, "/apps/rr/running/long")
            assert await client.revoke("long") is Revocation.REVOKED
            record = await client.result("long", wait=True)
            await client.submit("quick", key="after")  # the worker goes on with others
            assert (await client.result("after", wait=True)).ok  # type: ignore[union-attr]
            assert await session.children("/apps/rr/revoked") == []
            assert await session.exists("/apps/rr/running/long") is None
            assert await Client(session, "rr").dead_letters() == []
            worker.request_stop()
    assert worker.cancelled == ["long"] and worker.runs.count("long") == 1
    assert record is not None and record.outcome is Outcome.REVOKED and record.attempts == 1


async def test_framework_revoke_says_what_it_did(zk_hosts: str, chroot: str,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    async with Session(zk_hosts, chroot=chroot) as session:
        await Client(session, "rc", create=True).submit("quick", key="t1")
    argv = ["revoke", "rc", "t1", "--zk", zk_hosts, "--chroot", chroot]
    code = await trio.to_thread.run_sync(cli_main, argv)
    out = capsys.readouterr().out
    assert code == 0 and "revoked task 't1' of 'rc'" in out
    code = await trio.to_thread.run_sync(cli_main, ["revoke", "nosuch", "t1", *argv[3:]])
    assert code == 2 and "no application 'nosuch'" in capsys.readouterr().err


async def test_a_revoked_key_submitted_again_runs(zk_hosts: str, chroot: str) -> None:
    worker = Slow("ra", name="w1")
    with trio.fail_after(60):
        async with Session(zk_hosts, chroot=chroot) as session:
            client = Client(session, "ra", create=True)
            await client.submit("quick", key="k")
            assert await client.revoke("k") is Revocation.REVOKED
            async with trio.open_nursery() as nursery:
                await serve(nursery, zk_hosts, chroot, worker)
                first = await client.result("k", wait=True)
                await wait_gone(session, "/apps/ra/revoked/k")
                await wait_gone(session, "/apps/ra/running/k")
                await client.submit("quick", key="k")  # on purpose, after the revoke
                again = await outcome_after(session, "k", Outcome.REVOKED)
                worker.request_stop()
    assert first is not None and first.outcome is Outcome.REVOKED
    assert again.outcome is Outcome.SUCCEEDED and worker.runs == ["k"]


async def outcome_after(session: Session, key: str, old: Outcome) -> TaskResult:
    """The result record of ``key`` once its outcome is no longer ``old`` (read with a
    watch each time, so a rewrite between two reads is never missed)."""
    from framework.runtime import App

    path = App("ra").result_path(key)
    while True:
        fired = trio.Event()
        data, _stat = await session.get(path, watch=session.waker(fired))
        record = TaskResult.decode(data)
        if record.outcome is not old:
            return record
        await fired.wait()


class Metered(Worker):
    """``metered``: one start a minute (a second claimed task waits for its token);
    ``stored``: its payload lives in a store whose reads wait until the test says."""

    concurrency = 2
    backoff_base = 0.01

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.runs: list[str] = []

    @task(rate_limit="1/m")
    async def metered(self, task: Task) -> None:
        self.runs.append(task.key)

    @task
    async def stored(self, task: Task) -> None:
        self.runs.append(task.key)


class HeldStore:
    """An in-memory payload store whose ``get`` tells the test it started (``reading``)
    and returns only once ``release`` is set (it runs in a worker thread)."""

    def __init__(self) -> None:
        self.blobs: dict[str, bytes] = {}
        self.reading = trio.Event()
        self.release = threading.Event()

    def put(self, data: bytes) -> str:
        ref = f"blob-{len(self.blobs)}"
        self.blobs[ref] = data
        return ref

    def get(self, ref: str) -> bytes:
        trio.from_thread.run_sync(self.reading.set)
        self.release.wait()
        return self.blobs[ref]

    def delete(self, ref: str) -> None:
        self.blobs.pop(ref, None)


async def _revoked_unstarted(session: Session, client: Client, app: str, key: str) -> TaskResult:
    """Revoke ``key`` (claimed, its handler not started) and return its record."""
    assert await client.revoke(key) is Revocation.REVOKED
    record = await client.result(key, wait=True)
    assert record is not None
    await wait_gone(session, f"/apps/{app}/revoked/{key}")  # cleaned with the ack
    return record


async def test_a_claimed_task_waiting_for_its_rate_limit_token_is_revoked(
        zk_hosts: str, chroot: str) -> None:
    worker = Metered("rl", name="w1")
    with trio.fail_after(30):
        async with Session(zk_hosts, chroot=chroot) as session, \
                trio.open_nursery() as nursery:
            await serve(nursery, zk_hosts, chroot, worker)
            client = Client(session, "rl", create=True)
            await client.submit("metered", key="first")
            assert (await client.result("first", wait=True)).ok  # type: ignore[union-attr]
            await client.submit("metered", key="second")  # claimed, waits ~60 s for a token
            await wait_exists(session, "/apps/rl/running/second")
            record = await _revoked_unstarted(session, client, "rl", "second")
            worker.request_stop()
    assert record.outcome is Outcome.REVOKED and record.error == "revoked"
    assert worker.runs == ["first"]


async def test_a_claimed_task_whose_stored_payload_is_being_read_is_revoked(
        zk_hosts: str, chroot: str) -> None:
    store = HeldStore()
    worker = Metered("ps", name="w1")
    worker.payload_store = store
    with trio.fail_after(30):
        async with Session(zk_hosts, chroot=chroot) as session, \
                trio.open_nursery() as nursery:
            await serve(nursery, zk_hosts, chroot, worker)
            client = Client(session, "ps", create=True, payload_store=store)
            await client.submit("stored", {"text": "x" * 200_000}, key="big")
            await store.reading.wait()  # claimed; its payload is being read
            assert await client.revoke("big") is Revocation.REVOKED
            record: list[TaskResult] = []

            async def revoked() -> None:
                found = await client.result("big", wait=True)
                assert found is not None
                record.append(found)

            async with trio.open_nursery() as waiting:
                waiting.start_soon(revoked)
                await wait_exists(session, "/apps/ps/revoked/big")
                await trio.to_thread.run_sync(store.release.set)
            await wait_gone(session, "/apps/ps/revoked/big")
            worker.request_stop()
    assert record[0].outcome is Outcome.REVOKED and worker.runs == []
