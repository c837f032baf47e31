"""Pure parts of the runtime: the assignment plan, names, tasks."""

from __future__ import annotations

from typing import Any

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from framework import ConfigurationError
from framework.runtime import App, Task, new_task
from framework.runtime.placement import plan_assignment

names = st.lists(st.text("abcdefgh", min_size=1, max_size=3), unique=True, max_size=12)


@given(shards=names, workers=names, data=st.data())
def test_plan_is_complete_balanced_and_sticky(shards, workers, data) -> None:
    current = {s: data.draw(st.sampled_from([*workers, "gone"])) for s in shards} if workers else {}
    plan = plan_assignment(shards, workers, current)
    if not workers:
        assert plan == {}
        return
    assert set(plan) == set(shards) and set(plan.values()) <= set(workers)
    loads = [list(plan.values()).count(w) for w in workers]
    assert max(loads) - min(loads) <= 1
    # a shard moves only if its worker is gone or its worker had more than its fair share
    ceiling = -(-len(shards) // len(workers))
    for shard, worker in current.items():
        if worker in workers and list(current.values()).count(worker) <= ceiling - 1:
            assert plan[shard] == worker


def test_plan_moves_only_the_lost_workers_shards() -> None:
    current = {"s1": "a", "s2": "a", "s3": "b", "s4": "b", "s5": "c", "s6": "c"}
    plan = plan_assignment(current, ["a", "b"], current)
    assert {s: plan[s] for s in ("s1", "s2", "s3", "s4")} == {k: current[k] for k in
                                                            ("s1", "s2", "s3", "s4")}
    assert sorted(plan.values()) == ["a", "a", "a", "b", "b", "b"]


@pytest.mark.parametrize("bad", ["", "has space", "a/b", "../x", "x" * 101])
def test_bad_names_give_clear_errors(bad: str) -> None:
    with pytest.raises(ConfigurationError, match="invalid"):
        App(bad)


def test_task_round_trip_and_validation() -> None:
    task = new_task({"url": "http://x"}, task_id="t1", idempotency_key="k1", time_limit=2)
    again = Task.decode(task.encode(), attempts=3)
    assert again == Task("t1", {"url": "http://x"}, "k1", 2, attempts=3) and again.key == "k1"
    with pytest.raises(ConfigurationError, match="JSON"):
        new_task({"bad": object()})
    with pytest.raises(ConfigurationError, match="time_limit"):
        new_task(1, time_limit=0)


async def test_a_persistently_failing_slot_backs_off_instead_of_spinning(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """If taking work keeps failing (e.g. the app's znodes were deleted), the slot waits
    about ``backoff_base * 2**n`` (capped at ``backoff_max``, with jitter) between tries; a
    success resets it."""
    import types
    from contextlib import asynccontextmanager

    import framework.runtime.worker_parts.task_consumer as consumer_module
    from framework import FrameworkError, Worker

    class Idle(Worker):
        app_name = "backoff"
        backoff_base = 0.5
        backoff_max = 3.0

        async def handle(self, task: Task) -> None:
            return None

    worker = Idle(name="w1")
    outcomes = iter(["fail", "fail", "fail", "fail", "fail", "ok", "fail", "stop"])
    waits: list[float] = []

    class FailingQueue:
        @asynccontextmanager
        async def take(self, admit=None):  # type: ignore[no-untyped-def]
            outcome = next(outcomes)
            if outcome == "stop":
                worker._draining = True
            if outcome in ("fail", "stop"):
                raise FrameworkError("tasks znode is gone")
            raise consumer_module._HandedBack()  # a handler failure: not the slot's trouble
            yield

    async def record_sleep(seconds: float) -> None:
        waits.append(seconds)

    monkeypatch.setattr(consumer_module.trio, "sleep", record_sleep)
    served = [types.SimpleNamespace(queue=FailingQueue())]  # the one queue it serves
    await worker.tasks._slot(None, served)  # type: ignore[arg-type]
    ceilings = [0.5, 1.0, 2.0, 3.0, 3.0, 0.5]  # with jitter: between half and all of each
    assert len(waits) == len(ceilings)
    assert all(c / 2 <= w <= c for w, c in zip(waits, ceilings, strict=True)), waits


def test_backoff_doubles_up_to_its_cap_with_jitter() -> None:
    from framework.retry import Backoff

    policy = Backoff(0.1, 2.0)
    for attempt, ceiling in [(1, 0.1), (2, 0.2), (3, 0.4), (6, 2.0), (10_000, 2.0)]:
        delays = {policy.delay(attempt) for _ in range(50)}
        assert all(ceiling / 2 <= d <= ceiling for d in delays)
        assert len(delays) > 1  # spread out, not in lockstep
    assert Backoff(0.1, 2.0, jitter=0).delay(3) == pytest.approx(0.4)
    with pytest.raises(ValueError):
        Backoff(0, 1.0)


def test_lost_ownership_has_one_base_and_says_what_was_lost() -> None:
    """Claims and locks are ownership, not leadership: ``except LeadershipLost`` around a
    master's term must not swallow a task's lost claim, and one ``except OwnershipLost``
    catches all three."""
    from framework import ClaimLost, LeadershipLost, LockLost, OwnershipLost

    for kind, text in ((LeadershipLost, "leadership"), (LockLost, "lock"),
                       (ClaimLost, "queue claim")):
        error = kind("suspended")
        assert isinstance(error, OwnershipLost) and error.reason == "suspended"
        assert str(error) == f"{text} lost: suspended"
    assert not issubclass(ClaimLost, LeadershipLost)
    assert not issubclass(LockLost, LeadershipLost)


def test_importing_the_bridge_loads_no_upper_layer() -> None:
    """``import framework.zk`` (or ``framework``) loads neither the recipes, the runtime nor
    the server launcher: the package root is lazy (PEP 562).  (rich may still come in:
    structlog's console renderer loads it for tracebacks.)"""
    import subprocess
    import sys

    code = ("import sys, framework, framework.zk; "
            "print(sorted(m for m in ('framework.runtime', 'framework.zkserver', "
            "'framework.primitives', 'framework.cli') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "[]"
    code = "import framework; print(framework.Worker.__module__, 'Worker' in dir(framework))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "framework.runtime.worker True"


def test_framework_run_imports_from_the_current_directory(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    from framework.runtime.launch.runner import load_class

    (tmp_path / "myjobs_cwd_probe.py").write_text(
        "from framework.runtime import Worker\n"
        "class Fetcher(Worker):\n"
        "    async def handle(self, task):\n"
        "        return None\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    assert load_class("myjobs_cwd_probe:Fetcher").__name__ == "Fetcher"


def test_importing_the_framework_keeps_the_hosts_logging() -> None:
    """A host application that configured structlog keeps its configuration."""
    import subprocess
    import sys

    code = (
        "import structlog\n"
        "marker = lambda logger, name, event: event\n"
        "structlog.configure(processors=[marker, structlog.processors.KeyValueRenderer()])\n"
        "import framework\n"
        "from framework.logs import get_logger\n"
        "get_logger('x')\n"
        "framework.Session\n"
        "print(structlog.get_config()['processors'][0] is marker)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "True"


def test_json_logs_carry_the_traceback() -> None:
    """``FRAMEWORK_LOG_JSON=1``: an event logged with ``exc_info`` carries the traceback as
    text (it printed ``"exc_info": true`` and dropped it)."""
    import json
    import subprocess
    import sys

    code = (
        "from framework.logs import get_logger\n"
        "try:\n"
        "    raise ValueError('boom')\n"
        "except ValueError as exc:\n"
        "    get_logger('x').warning('task.failed', exc_info=exc)\n"
    )
    err = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env={"FRAMEWORK_LOG_JSON": "1", "PATH": ""}).stderr
    event = json.loads(err.strip().splitlines()[-1])
    assert event["event"] == "task.failed" and "exc_info" not in event
    assert "Traceback" in event["exception"] and "ValueError: boom" in event["exception"]


async def test_a_thread_handler_that_returned_in_time_is_not_failed_by_a_late_pickup() -> None:
    """A plain-def handler returns inside its limit while another task blocks the event
    loop past the limit (a CPU-bound step, a GC pause): its result stands; one that really
    overran fails."""
    import time

    from framework import Worker

    class Timed(Worker):
        app_name = "timed"

        def handle(self, task: Task) -> str:
            time.sleep(task.payload["takes"])
            return "ok"

    worker = Timed(name="w")
    consumer, rules = worker.tasks, worker.rules_for("handle")
    assert rules is not None

    async def blocker() -> None:
        await trio.sleep(0.1)
        time.sleep(0.15)  # the loop is stuck from 0.1 s to 0.25 s, past the 0.2 s limit

    async with trio.open_nursery() as nursery:
        nursery.start_soon(blocker)
        done = await consumer.handlers.call_within(Task("t1", {"takes": 0.12}), rules.kind, 0.2)
    assert done == "ok"
    with pytest.raises(trio.TooSlowError):
        await consumer.handlers.call_within(Task("t2", {"takes": 0.4}), rules.kind, 0.1)


async def test_a_set_up_write_whose_reply_was_lost_is_retried_not_fatal(
        zk_hosts: str, chroot: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A part's prepare (idempotent) that loses a write's reply under load is called again
    once connected: the worker starts instead of exiting with ConnectionLoss."""
    from framework import ConnectionLossError, Session, Worker
    from framework.runtime.worker_parts.task_consumer import TaskConsumer
    from framework.zk import wait_exists

    original = TaskConsumer.prepare
    calls = []

    async def flaky(self: TaskConsumer, session: Session) -> None:
        calls.append(1)
        if len(calls) == 1:
            raise ConnectionLossError("reply lost (test)")
        await original(self, session)

    monkeypatch.setattr(TaskConsumer, "prepare", flaky)

    class Echo(Worker):
        async def handle(self, task: Task) -> Any:
            return task.payload

    worker = Echo("flakyprep", name="w1")
    with trio.fail_after(30):
        async with Session(zk_hosts, chroot=chroot) as session, trio.open_nursery() as nursery:
            nursery.start_soon(worker.run, session)
            await wait_exists(session, "/apps/flakyprep/workers/w1")
            worker.request_stop()
    assert len(calls) == 2
