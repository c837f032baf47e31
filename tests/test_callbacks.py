"""Callbacks (``on_success`` / ``on_failure``), ``expires`` and ``soft_time_limit`` against the
real ZooKeeper; a success's callback is queued once even when its worker is killed -9 right
after the handler returned, or after its ack and before the callback's move."""

from __future__ import annotations

import os
import sys
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest
import trio

from framework import Session, errors
from framework.cli import main as cli_main
from framework.primitives.queue import WorkQueue
from framework.runtime import App, Client, Outcome, Task, TaskResult, Worker, task
from framework.runtime.task_types import TaskOptions
from framework.runtime.worker_parts.soft_limit import SoftTimeLimitExceeded
from framework.runtime.workflows import callbacks
from framework.testing import Child, spawn
from framework.testing.stub import StubApp

HELPERS = Path(__file__).parent / "helpers"
ROOT = Path(__file__).parent.parent
TIMEOUT = 30


class Hooks(Worker):
    """``double`` calls back ``noted`` (type option); ``boom`` fails for good and calls back
    ``noted`` on failure; ``tidy`` catches its soft limit, ``stubborn`` does not."""

    backoff_base = 0.01
    max_attempts = 2

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.notes: list[dict[str, Any]] = []
        self.ran: list[str] = []
        self.noted_event = trio.Event()

    @task(on_success="noted")
    async def double(self, task: Task) -> int:
        self.ran.append(task.id)
        return int(task.payload) * 2

    @task(on_failure="noted", max_attempts=1)
    async def boom(self, task: Task) -> None:
        raise ValueError(f"no {task.payload}")

    @task
    async def noted(self, task: Task) -> str:
        self.notes.append(task.payload)
        self.noted_event.set()
        return "noted"

    @task(soft_time_limit=0.2, time_limit=30, max_attempts=1)
    async def tidy(self, task: Task) -> str:
        try:
            await trio.sleep_forever()
        except SoftTimeLimitExceeded:
            await trio.sleep(0.01)  # cleanup may still await
            return "cleaned up"
        return "never"

    @task(soft_time_limit=0.2, time_limit=30, max_attempts=1)
    async def stubborn(self, task: Task) -> None:
        await trio.sleep_forever()


async def serve(nursery: trio.Nursery, hosts: str, chroot: str, worker: Worker) -> None:
    async def hold(task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        async with Session(hosts, chroot=chroot) as session:
            task_status.started()
            await worker.run(session)

    await nursery.start(hold)


def test_bad_options_are_one_line_errors() -> None:
    for options, message in [({"soft_time_limit": 5, "time_limit": 5}, "below time_limit"),
                             ({"expires": 0}, "expires must be positive"),
                             ({"on_success": "no way"}, "invalid on_success task name"),
                             ({"on_failure": 3}, "on_failure names a task type")]:
        with pytest.raises(errors.ConfigurationError, match=message) as raised:
            TaskOptions(**options)
        assert "\n" not in str(raised.value)


async def test_callbacks_get_the_result_or_the_error(zk_hosts: str, chroot: str) -> None:
    worker = Hooks("cbk", name="w1")
    with trio.fail_after(TIMEOUT):
        async with Session(zk_hosts, chroot=chroot) as session, trio.open_nursery() as nursery:
            client = Client(session, "cbk", create=True)
            await serve(nursery, zk_hosts, chroot, worker)
            await client.submit("double", 21, key="d1")
            ok = await client.result("d1.on_success", wait=True)
            await client.submit("boom", "luck", key="b1")
            failed = await client.result("b1.on_failure.1", wait=True)
            # per submit: its own callback wins over the type's (none at all for boom's)
            await client.submit("double", 1, key="d2", on_success="noted", on_failure="boom")
            await client.result("d2.on_success", wait=True)
            assert await session.children(callbacks.callbacks_path(App("cbk"))) == []
            worker.request_stop()
    assert ok is not None and ok.ok and failed is not None and failed.ok
    by_key = {n["key"]: n for n in worker.notes}
    assert by_key["d1"] == {"task_id": "d1", "key": "d1", "name": "double", "ok": True,
                            "result": 42, "error": None, "payload": 21}
    assert by_key["b1"]["ok"] is False and by_key["b1"]["error"] == "ValueError: no luck"
    assert sorted(by_key) == ["b1", "d1", "d2"] and len(worker.notes) == 3


async def test_an_expired_task_is_recorded_and_never_run(zk_hosts: str, chroot: str) -> None:
    worker = Hooks("exp", name="w1")
    with trio.fail_after(TIMEOUT):
        async with Session(zk_hosts, chroot=chroot) as session, trio.open_nursery() as nursery:
            client = Client(session, "exp", create=True)
            # due ten seconds ago, to start within one: expired before any worker runs
            await client.submit("double", 1, key="late", eta=time.time() - 10, expires=1)
            await client.submit("double", 2, key="fine", expires=600)
            await serve(nursery, zk_hosts, chroot, worker)
            late = await client.result("late", wait=True)
            fine = await client.result("fine", wait=True)
            await client.result("fine.on_success", wait=True)
            # expired: resubmittable, and no callback was queued for it
            assert await client.existing("late.on_success") is None
            await client.submit("double", 3, key="late")
            again = await client.result("late.on_success", wait=True)
            worker.request_stop()
    assert late is not None and late.outcome is Outcome.EXPIRED and late.error == "expired"
    assert fine is not None and fine.ok and again is not None
    assert worker.ran.count("late") == 1 and "fine" in worker.ran


def test_cli_result_of_an_expired_task(zk_hosts: str, chroot: str,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    async def record() -> None:
        async with Session(zk_hosts, chroot=chroot) as session:
            await session.create(App("old").result_path("k"), TaskResult(
                "k", False, "w1", 1, error="expired", key="k",
                outcome=Outcome.EXPIRED).encode(), makepath=True)

    trio.run(record)
    assert cli_main(["result", "old", "k", "--zk", zk_hosts, "--chroot", chroot]) == 1
    assert "expired: not started before its expires time" in capsys.readouterr().err


async def test_a_soft_time_limit_is_raised_inside_the_handler(zk_hosts: str,
                                                              chroot: str) -> None:
    worker = Hooks("soft", name="w1")
    with trio.fail_after(TIMEOUT):
        async with Session(zk_hosts, chroot=chroot) as session, trio.open_nursery() as nursery:
            client = Client(session, "soft", create=True)
            await serve(nursery, zk_hosts, chroot, worker)
            await client.submit("tidy", key="t")
            await client.submit("stubborn", key="s")
            tidy = await client.result("t", wait=True)
            stubborn = await client.result("s", wait=True)
            # per submit, below the type's: an uncaught soft limit is a failure
            worker.request_stop()
    assert tidy is not None and tidy.ok and tidy.result == "cleaned up"
    assert stubborn is not None and stubborn.outcome is Outcome.FAILED
    assert stubborn.error is not None and stubborn.error.startswith("SoftTimeLimitExceeded")


def test_cli_submit_expires(zk_hosts: str, chroot: str, capsys: pytest.CaptureFixture[str]
                            ) -> None:
    base = ["--zk", zk_hosts, "--chroot", chroot]
    assert cli_main(["submit", "clix", "work", "1", "--create", "--key", "k",
                     "--expires", "30", *base]) == 0
    assert capsys.readouterr().out.strip() == "k"

    async def read() -> Task:
        async with Session(zk_hosts, chroot=chroot) as session:
            queue = WorkQueue(session, App("clix").tasks)
            async with queue.take() as item:
                return Task.decode(item.data)

    queued = trio.run(read)
    assert queued.expires is not None and 0 < queued.expires - time.time() <= 30
    with pytest.raises(SystemExit):
        cli_main(["submit", "clix", "work", "--expires", "-1", *base])
    assert "--expires" in capsys.readouterr().err


# ---------------------------------------------------------------- kill -9 of a real worker


async def start(stack: AsyncExitStack, hosts: str, chroot: str, name: str, tmp_path: Path,
                kind: str = "CallbackWorker", **env: str) -> Child:
    return await stack.enter_async_context(spawn(
        [sys.executable, "-m", "framework", "run", f"callback_app:{kind}", "--zk", hosts,
         "--chroot", chroot, "--name", name, "--session-timeout", "2"],
        name=name, log_dir=None if env else tmp_path, pipe_stdout=bool(env),
        env={"PYTHONPATH": f"{HELPERS}{os.pathsep}{ROOT}", "FRAMEWORK_LOG_LEVEL": "warning",
             **env}))


async def until_line(child: Child, prefix: str) -> str:
    while True:
        line = await child.lines.next()
        if line.startswith(prefix):
            return line


@pytest.mark.parametrize("fault", ["returned", "acked-then-next-start", "acked-live-peer"])
async def test_a_callback_is_queued_once_across_a_kill_9(
    zk_hosts: str, chroot: str, tmp_path: Path, fault: str
) -> None:
    """``returned``: killed as its handler returns (before or after the ack: either way
    once); ``acked-...``: killed after the ack committed, before the callback's move: the
    next worker to start moves it, or a live peer when the killed worker's session ends."""
    app = App("cb")
    acked = fault.startswith("acked")
    async with AsyncExitStack() as procs, Session(zk_hosts, chroot=chroot) as session:
        with trio.fail_after(60):
            client = Client(session, "cb", create=True)
            if fault == "acked-live-peer":  # running before the ack: only a departure helps
                await start(procs, zk_hosts, chroot, "peer", tmp_path, "AfterWorker")
            first = await start(procs, zk_hosts, chroot, "first", tmp_path,
                                **{"CB_STALL_MOVE" if acked else "CB_SAY_RETURNED": "1"})
            await client.submit("work", 21, key="w")
            await until_line(first, "ACKED" if acked else "RETURNED")
            first.kill()
            await first.wait()
            if acked:  # the ack and the callback's node committed together
                assert (await client.result("w")) is not None
                assert await session.children(callbacks.callbacks_path(app)) == [
                    "w.on_success"]
            if fault != "acked-live-peer":
                await start(procs, zk_hosts, chroot, "second", tmp_path)
            done = await client.result("w.on_success", wait=True)
            runs = await session.children(f"{app.base}/evidence")
            assert await session.children(callbacks.callbacks_path(app)) == []
            result = await client.result("w")
    assert done is not None and done.ok and len(runs) == 1
    assert result is not None and result.ok and result.result == 42


# ---------------------------------------------------------------- the in-process test mode


async def test_the_stub_honours_callbacks_expires_and_soft_limits() -> None:
    app = StubApp(Hooks, app="stubbed")
    await app.submit("double", 5, key="d")
    await app.submit("boom", "x", key="b")
    await app.submit("double", 1, key="late", eta=time.time() - 10, expires=1)
    await app.submit("tidy", key="t")
    await app.submit("stubborn", key="s")
    await app.join()
    assert app.result("d.on_success") is not None
    assert app.result("b.on_failure.1") is not None
    notes = {n["key"]: n for n in app.worker.notes}  # type: ignore[attr-defined]
    assert notes["d"]["result"] == 10 and notes["b"]["error"] == "ValueError: no x"
    late = app.result("late")
    assert late is not None and late.outcome is Outcome.EXPIRED
    assert app.result("late.on_success") is None
    tidy, stubborn = app.result("t"), app.result("s")
    assert tidy is not None and tidy.result == "cleaned up"
    assert stubborn is not None and (stubborn.error or "").startswith("SoftTimeLimitExceeded")


def test_a_soft_limit_on_a_plain_def_is_a_one_line_error() -> None:
    class Blocking(Worker):
        @task(soft_time_limit=1)
        def crunch(self, task: Task) -> None:
            return None

    with pytest.raises(errors.ConfigurationError, match="needs an 'async def'") as raised:
        Blocking("blk", name="w")
    assert "\n" not in str(raised.value)
