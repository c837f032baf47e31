"""Plain-def (blocking) handlers: a thread pool or a process pool, time limits enforced,
async-ness mistakes refused at start with one line."""

from __future__ import annotations

import functools
import os
import re
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import trio

from framework import ConfigurationError
from framework.runtime import Master, MasterContext, Task, TaskResult, Worker
from tests.test_runtime_correctness import _run as run_job

RELEASE = threading.Event()  # lets the blocked handler thread end with the test


class Tasks(Master):
    """Submits ``specs`` (task id -> (payload, time limit)) one by one, waits until idle,
    keeps the result records; ``check`` runs while it still leads."""

    def __init__(self, app: str, specs: dict[str, tuple[Any, float | None]],
                 check: Any = None) -> None:
        super().__init__(app)
        self.specs = specs
        self.check = check
        self.results: dict[str, TaskResult] = {}

    async def lead(self, ctx: MasterContext) -> None:
        for task_id, (payload, limit) in self.specs.items():
            await ctx.submit("handle", payload, key=task_id, time_limit=limit)
        await ctx.wait_idle()
        for task_id in self.specs:
            result = await ctx.result(task_id)
            assert result is not None
            self.results[task_id] = result
        if self.check is not None:
            self.check()


class Blocking(Worker):
    """A plain-def handler in the thread pool: ``block`` blocks the thread (past any time
    limit), ``coro`` returns a coroutine (an async-ness mistake), else it reports progress
    and returns the thread's name."""

    concurrency = 1
    max_attempts = 1

    def handle(self, task: Task) -> Any:
        if task.payload == "block":
            RELEASE.wait(60)
            return "late"
        if task.payload == "coro":
            return trio.sleep(0)
        # progress from the handler's thread: through the worker's trio loop
        trio.from_thread.run(self.report_progress, task, 1, 2, "half way")
        return threading.current_thread().name


class Crunch(Worker):
    """A plain-def handler in the process pool: ``block`` writes its pid to the file named
    by ``pidfile`` and sleeps, else returns its pid and the config it sees."""

    handler_pool = "process"
    concurrency = 1
    max_attempts = 1

    def handle(self, task: Task) -> Any:
        if "pidfile" in task.payload:
            Path(task.payload["pidfile"]).write_text(str(os.getpid()))
            time.sleep(60)
        return {"pid": os.getpid(), "app": self.app.name}


async def test_a_blocking_thread_handler_is_failed_on_time_and_frees_its_slot(
    zk_hosts: str, chroot: str
) -> None:
    """``block`` (limit 0.5 s) is failed at its limit while its thread stays blocked; the
    slot (concurrency 1) then runs the next task; a coroutine returned by a plain def fails
    the task for good with a clear error."""
    RELEASE.clear()
    worker = Blocking("blk")
    stuck: list[int] = []
    master = Tasks("blk", {"slow": ("block", 0.5), "next": ("x", None), "coro": ("coro", None)},
                   check=lambda: stuck.append(worker.status()["stuck_threads"]))
    try:
        await run_job(zk_hosts, chroot, master, worker)
    finally:
        RELEASE.set()
    slow, nxt, coro = master.results["slow"], master.results["next"], master.results["coro"]
    assert not slow.ok and slow.error == "time limit exceeded"
    took = slow.finished_at - slow.started_at
    print(f"blocked thread handler failed after {took:.3f} s (limit 0.5 s)")
    assert 0.5 <= took < 1.0
    assert nxt.ok and nxt.result != threading.current_thread().name  # ran in a thread
    assert stuck == [1]  # the abandoned thread was still blocked while the job ended
    assert not coro.ok and "returned coroutine" in coro.error and coro.attempts == 1


async def test_a_process_handler_past_its_limit_is_killed(
    zk_hosts: str, chroot: str, tmp_path: Path
) -> None:
    pidfile = tmp_path / "pid"
    master = Tasks("cpu", {"warm": ({}, None), "slow": ({"pidfile": str(pidfile)}, 1.0)})
    await run_job(zk_hosts, chroot, master, Crunch("cpu"))
    warm, slow = master.results["warm"], master.results["slow"]
    assert warm.ok and warm.result["pid"] != os.getpid() and warm.result["app"] == "cpu"
    assert not slow.ok and slow.error == "time limit exceeded"
    took = slow.finished_at - slow.started_at
    print(f"process handler failed after {took:.3f} s (limit 1.0 s)")
    assert 1.0 <= took < 1.5
    pid = int(pidfile.read_text())
    assert pid != os.getpid()
    try:  # killed: gone, or a zombie not reaped yet
        state = Path(f"/proc/{pid}/stat").read_text().split()[2]
    except FileNotFoundError:
        state = "gone"
    assert state in ("gone", "Z")


def test_a_plain_def_handler_is_accepted() -> None:
    assert Blocking("app").takes_tasks and Crunch("app").takes_tasks


async def _async_handle(self: Any, task: Any) -> None:
    return None


def _hidden(fn: Any) -> Any:
    @functools.wraps(fn)
    def wrapper(*args: Any) -> Any:
        return fn(*args)

    return wrapper


@pytest.mark.parametrize(
    ("attrs", "message"),
    [
        ({"handle": _hidden(Worker.handle)}, "plain function wrapping an 'async def'"),
        ({"handle": 42}, "handle must be a method ('async def' or 'def'), got a int"),
        ({"handler_pool": "fork"}, "handler_pool must be 'thread' or 'process', got 'fork'"),
        ({"handle": _async_handle, "handler_pool": "process"},
         "is 'async def' but handler_pool is 'process'"),
        ({"handle": Blocking.handle, "handler_pool": "process"}, "importable by name"),
        ({"on_config": lambda self, config: None}, "on_config must be 'async def'"),
    ],
)
def test_async_mistakes_are_refused_at_start_in_one_line(attrs: dict[str, Any],
                                                          message: str) -> None:
    kind = type("Mistaken", (Worker,), attrs)
    with pytest.raises(ConfigurationError, match=re.escape(message)) as caught:
        kind("app")
    assert "\n" not in str(caught.value)
