"""The test mode for users' own code, tried on the README's quick-start app.

``StubApp`` (framework.testing.stub) runs the app's handlers in this process without
ZooKeeper; the pytest plugin (framework.testing.pytest_plugin) gives an embedded ZooKeeper
for integration tests.  The app is the README's ``myapp/jobs.py`` block itself, so these
are the tests docs/operations.md shows a user.
"""

from __future__ import annotations

import re
import types
from pathlib import Path
from typing import Any

import pytest
import trio

from framework import errors
from framework.runtime import Task, Worker, chain, chord, group, run_component, sig, task
from framework.testing.inprocess import running
from framework.testing.stub import StubApp, TaskFailed
from framework.zkserver import ZooKeeperEnsemble

pytest_plugins = ["framework.testing.pytest_plugin"]

ROOT = Path(__file__).resolve().parents[1]


def quickstart() -> types.ModuleType:
    """The README's ``myapp/jobs.py``, as a module."""
    text = (ROOT / "README.md").read_text()
    found = re.search(r"<!-- quickstart: myapp/jobs.py -->\s*```\w*\n(.*?)\n```", text, re.S)
    assert found, "README.md has no quick-start block"
    module = types.ModuleType("myapp_jobs")
    exec(compile(found.group(1), "README.md:myapp/jobs.py", "exec"), module.__dict__)
    return module


jobs = quickstart()


# ---------------------------------------------------------------- without ZooKeeper


async def test_the_quickstart_handler_runs_in_process() -> None:
    app = StubApp(jobs.Resizer, config={"size": 128})
    submitted = await app.submit("resize", {"image": 7})
    await app.join()
    record = app.result(submitted.id)
    assert record is not None and record.ok
    assert record.result == {"resized": 7, "size": 128}
    assert record.attempts == 1 and app.pending == 0


async def test_the_quickstart_job_runs_in_process() -> None:
    app = StubApp(jobs.Resizer)
    summary = await app.run_master(jobs.Boss)
    # 1,000 resizes and the final report (schedules do not fire in the stub)
    assert summary == {"results": 1001, "dead_letters": 0}
    assert app.result("img-999").result == {"resized": 999, "size": 128}  # type: ignore[union-attr]
    assert app.result("final-report").result == {"report": {"final": True}}  # type: ignore[union-attr]


async def test_an_unknown_type_and_a_bad_payload_are_refused_at_submit() -> None:
    app = StubApp(jobs.Resizer)
    with pytest.raises(errors.ConfigurationError, match=r"no task type 'thumb'.*report, resize"):
        await app.submit("thumb", {})
    with pytest.raises(errors.ConfigurationError, match="JSON"):
        await app.submit("resize", {"image": object()})


class Flaky(Worker):
    app_name = "flaky"
    max_attempts = 3
    runs: dict[str, int]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.runs = {}

    @task
    async def wobbly(self, job: Task) -> str:
        self.runs[job.id] = self.runs.get(job.id, 0) + 1
        if self.runs[job.id] < job.payload["succeed_on"]:
            raise ValueError(f"try {self.runs[job.id]}")
        return "ok"

    @task(max_attempts=5)
    async def refuse(self, job: Task) -> None:
        raise errors.PermanentFailure("never works")

    @task(time_limit=0.05, max_attempts=1)
    async def slow(self, job: Task) -> None:
        await trio.sleep_forever()

    @task
    def blocking(self, job: Task) -> int:  # a plain def: run in a thread
        return int(job.payload) * 2

    @task
    async def fan_out(self, job: Task) -> int:
        for n in range(job.payload):
            await self.submit("blocking", n, key=f"child-{n}")
        await self.report_progress(job, 1, 1, "queued")
        return job.payload

    @task
    async def bad_result(self, job: Task) -> object:
        return object()

    @task
    async def plus(self, job: Task) -> int:
        given = job.payload
        if isinstance(given, dict):  # a chain's later step: the previous result with it
            return int(given["previous"] + given["payload"])
        return int(given)

    @task
    async def summed(self, job: Task) -> int:
        return sum(job.payload["results"])


async def test_retries_dead_letters_and_time_limits_follow_the_types_options() -> None:
    app = StubApp(Flaky)
    await app.submit("wobbly", {"succeed_on": 3}, key="third-time")
    await app.submit("wobbly", {"succeed_on": 9}, key="never")
    await app.submit("refuse", key="refused")
    await app.submit("slow", key="slow")
    await app.submit("bad_result", key="bad")
    await app.join()
    assert app.result("third-time").ok and app.result("third-time").attempts == 3  # type: ignore[union-attr]
    never = app.result("never")
    assert never is not None and not never.ok and never.attempts == 3
    assert never.error == "ValueError: try 3"
    assert app.result("refused").attempts == 1  # type: ignore[union-attr]
    assert app.result("refused").error == "never works"  # type: ignore[union-attr]
    assert app.result("slow").error == "time limit exceeded"  # type: ignore[union-attr]
    assert "not JSON-serialisable" in app.result("bad").error  # type: ignore[union-attr,operator]
    assert sorted(r.task_id for r in app.dead_letters) == ["bad", "never", "refused", "slow"]
    assert len(app.failures) == 2 + 3 + 1 + 1 + 1


async def test_follow_ups_progress_keys_delays_and_revokes() -> None:
    app = StubApp(Flaky)
    later = await app.submit("blocking", 100, countdown=60)
    parent = await app.submit("fan_out", 3)
    await app.submit("blocking", 1, key="child-1")  # the same key: runs once
    gone = await app.submit("blocking", 5)
    app.revoke(gone.id)
    await app.join()
    assert app.progress[parent.id] == (1, 1, "queued")
    assert [app.result(f"child-{n}").result for n in range(3)] == [0, 2, 4]  # type: ignore[union-attr]
    assert app.result(later.id).result == 200  # type: ignore[union-attr]
    assert app.result(gone.id).outcome.value == "revoked"  # type: ignore[union-attr]
    # the delayed task ran last, after every task due now
    assert list(app.results)[-1] == later.key


async def test_fail_fast_raises_the_handlers_error() -> None:
    app = StubApp(Flaky)
    await app.submit("refuse", key="refused")
    with pytest.raises(TaskFailed, match="refused failed: never works") as caught:
        await app.join(fail_fast=True)
    assert isinstance(caught.value.__cause__, errors.PermanentFailure)


async def test_canvases_run_in_process_as_the_driver_runs_them() -> None:
    app = StubApp(Flaky)
    linked = await app.run_canvas(chain(sig("plus", 1), sig("plus", 2), sig("plus", 3)),
                                  canvas_id="c1")
    assert (linked.state, linked.result) == ("succeeded", 6)
    assert app.result("c1-2").result == 6  # type: ignore[union-attr]
    grouped = await app.run_canvas(group(sig("blocking", 1), sig("blocking", 2)))
    assert grouped.result == [2, 4]
    chorded = await app.run_canvas(chord([sig("blocking", n) for n in (1, 2, 3)],
                                         sig("summed")))
    assert chorded.result == 12
    failed = await app.run_canvas(chord([sig("plus", 1), sig("refuse")], sig("summed")),
                                  canvas_id="c4")
    assert (failed.state, failed.error) == ("failed", "step 1 (refuse): never works")
    assert app.result("c4-callback") is None


# ---------------------------------------------------------------- with ZooKeeper


async def test_the_quickstart_job_on_the_embedded_zookeeper(
        embedded_zookeeper: ZooKeeperEnsemble, zk_chroot: str) -> None:
    hosts = embedded_zookeeper.connect_string
    boss = jobs.Boss()
    async with running(jobs.Resizer(), hosts, chroot=zk_chroot) as resizer:
        with trio.fail_after(60):
            await run_component(boss, hosts, chroot=zk_chroot, session_timeout=4.0)
    assert boss.summary is not None and boss.summary["dead_letters"] == 0
    assert boss.summary["results"] >= 1001  # and the periodic reports fired meanwhile
    assert resizer.tasks_done >= 1001
