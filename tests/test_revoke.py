"""Revoking one task (``Client.revoke``, ``framework revoke``): a queued task never runs, a
running one has its handler cancelled at once; both are recorded as revoked and never
retried (against the real ZooKeeper)."""

from __future__ import annotations

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
            client = Client(session, "rq")
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
            client = Client(session, "rr")
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
        await Client(session, "rc").submit("quick", key="t1")
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
            client = Client(session, "ra")
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
