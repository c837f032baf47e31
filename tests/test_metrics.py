"""Metrics: each process's own Prometheus endpoint (``framework run --metrics-port``), and
the task counts and durations its worker publishes in its status record, which the dashboard
sums (``framework_app_*``).  Real master and worker processes on the real ZooKeeper: the
runtime test application (tests/helpers/rt_app.py) and :class:`Timed` below (``framework run
test_metrics:Timed``)."""

from __future__ import annotations

import os
import re
import sys
import urllib.request
from collections.abc import Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import trio
from prometheus_client.utils import floatToGoString

from framework import Client, Session
from framework.dashboard import Model
from framework.dashboard.feed import Feed
from framework.dashboard.prom import registry_for, render
from framework.metrics import DURATION_BUCKETS
from framework.runtime import App, Task, Worker
from framework.testing import Child, spawn
from framework.zk import wait_exists
from framework.zkserver import free_ports

TESTS = Path(__file__).parent
HELPERS = TESTS / "helpers"
ROOT = TESTS.parent
APP = App("rt")
TASKS = 12
TIMED = App("timed")


class Timed(Worker):
    """Sleeps ``seconds``; ``fail: "once"`` fails its first delivery, ``fail: "always"``
    every one (two deliveries, then a dead letter).  A failing handler holds a secret in a
    local variable (derived at run time: it is in no source line and no payload)."""

    app_name = TIMED.name
    concurrency = 4
    max_attempts = 2
    backoff_base = 0.01

    async def handle(self, task: Task) -> Any:
        payload = task.payload
        api_key = "terces"[::-1] + f"-{payload.get('n')}"  # secret-<n>, made at run time
        if payload.get("fail") == "always" or (payload.get("fail") == "once"
                                               and task.attempts == 1):
            raise ValueError(f"task {payload.get('n')} failed (the key is {len(api_key)} long)")
        await trio.sleep(payload.get("seconds", 0))
        return payload.get("n")


async def _run(stack: AsyncExitStack, target: str, hosts: str, chroot: str, name: str,
               port: int, logs: Path, **env: str) -> Child:
    """``framework run <target> --metrics-port <port>`` as a child, its output in
    ``logs/<name>.log`` (killed when ``stack`` closes)."""
    return await stack.enter_async_context(spawn(
        [sys.executable, "-m", "framework", "run", target, "--zk", hosts,
         "--chroot", chroot, "--name", name, "--session-timeout", "2",
         "--metrics-port", str(port)],
        name=name, log_dir=logs, env=env))


async def _rt(stack: AsyncExitStack, kind: str, hosts: str, chroot: str, name: str, port: int,
              logs: Path) -> Child:
    """``framework run rt_app:<kind>`` (tests/helpers/rt_app.py)."""
    return await _run(stack, f"rt_app:{kind}", hosts, chroot, name, port, logs,
                      PYTHONPATH=f"{HELPERS}{os.pathsep}{ROOT}", RT_TASKS=str(TASKS),
                      RT_TASK_SECONDS="0.01")


def _scrape(port: int) -> dict[str, float]:
    """``name{labels}`` -> value of every sample at ``:port/metrics``."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    samples = {}
    for line in text.splitlines():
        match = re.match(r"^([a-z_]+(?:\{[^}]*\})?) (\S+)$", line)
        if match:
            samples[match[1]] = float(match[2])
    return samples


async def test_master_and_worker_metrics(zk_hosts: str, chroot: str, tmp_path: Path) -> None:
    master_port, worker_port = free_ports(2)
    with trio.fail_after(60):
        async with Session(zk_hosts, chroot=chroot) as session, AsyncExitStack() as stack:
            await _rt(stack, "BatchMaster", zk_hosts, chroot, "m1", master_port, tmp_path)
            await wait_exists(session, APP.rendezvous)  # elected: the term has begun
            master = await trio.to_thread.run_sync(_scrape, master_port)
            assert master['framework_is_leader{app="rt"}'] == 1
            assert master['framework_leader_changes_total{app="rt"}'] == 1
            assert master["framework_session_connected"] == 1
            assert master['framework_session_state_changes_total{state="connected"}'] >= 1

            await _rt(stack, "RecordingWorker", zk_hosts, chroot, "w1", worker_port, tmp_path)
            await wait_exists(session, APP.done)  # every task done and recorded
            worker = await trio.to_thread.run_sync(_scrape, worker_port)
    assert worker['framework_tasks_done_total{app="rt"}'] == TASKS
    assert worker['framework_task_duration_seconds_count{app="rt"}'] == TASKS
    assert worker['framework_tasks_in_flight{app="rt"}'] == 0
    assert worker.get('framework_tasks_failed_total{app="rt"}', 0) == 0
    assert worker["framework_session_connected"] == 1


def _samples(text: str) -> dict[str, float]:
    samples = {}
    for line in text.splitlines():
        if match := re.match(r"^([a-z_]+(?:\{[^}]*\})?) (\S+)$", line):
            samples[match[1]] = float(match[2])
    return samples


def _names(samples: dict[str, float]) -> set[str]:
    """The metric families of ``samples`` (without the histogram and counter suffixes)."""
    return {re.sub(r"(_bucket|_count|_sum|_total|_created)$", "", k.split("{")[0])
            for k in samples}


async def _until(model: Model, done: Callable[[], bool]) -> None:
    """Return once ``done()`` holds for the dashboard's model (woken by its versions)."""
    version = -1
    while not done():
        version = await model.wait_newer(version)


async def _timed(stack: AsyncExitStack, hosts: str, chroot: str, name: str, port: int,
                 logs: Path) -> Child:
    """``framework run test_metrics:Timed``."""
    return await _run(stack, "test_metrics:Timed", hosts, chroot, name, port, logs,
                      PYTHONPATH=f"{TESTS}{os.pathsep}{ROOT}", FRAMEWORK_LOG_LEVEL="info")


async def test_dashboard_sums_what_the_workers_timed(zk_hosts: str, chroot: str,
                                                      tmp_path: Path) -> None:
    """Every task attempt is in the dashboard's histogram, in the bucket the worker that ran
    it timed it in: the dashboard's buckets are the sums of the workers' own endpoints'.  A
    worker restarted under the same name counts from zero and the totals still only grow.
    The failing handler's local secret is not in the worker's log."""
    fast, slow = 150, 6
    done = fast + slow + 3          # 3 tasks fail once, then succeed
    attempts = done + 3 + 2         # ... and one fails twice (a dead letter)
    model = Model()
    ports = free_ports(2)
    with trio.fail_after(120):
        async with Session(zk_hosts, chroot=chroot) as session, AsyncExitStack() as stack, \
                trio.open_nursery() as nursery:
            nursery.start_soon(Feed(session, model).run)
            client = Client(session, TIMED.name, create=True)
            await client.submit("handle", {"n": -1})  # the app exists before the workers watch it
            workers = [await _timed(stack, zk_hosts, chroot, name, port, tmp_path)
                       for name, port in zip(("w1", "w2"), ports, strict=True)]
            payloads: list[dict[str, Any]] = (
                [{"n": i} for i in range(fast - 1)] + [{"n": "slow", "seconds": 0.3}] * slow
                + [{"n": "retried", "fail": "once"}] * 3 + [{"n": "dead", "fail": "always"}])
            for payload in payloads:
                await client.submit("handle", payload)
            app = model.app(TIMED.name)
            await _until(model, lambda: app.totals.done == done and app.totals.failed == 5)
            totals = app.totals
            assert (totals.retried, totals.dead_lettered) == (4, 1)
            assert totals.durations.count == attempts
            assert totals.durations.bounds == DURATION_BUCKETS
            # the slow ones took at least 0.3 s where they ran: above the 0.25 bucket
            assert totals.durations.counts[DURATION_BUCKETS.index(0.25)] <= attempts - slow

            own = [await trio.to_thread.run_sync(_scrape, port) for port in ports]
            dashboard = _samples(render(registry_for(model)).decode())
            for bound in [*(floatToGoString(b) for b in DURATION_BUCKETS), "+Inf"]:
                label = f'{{app="{TIMED.name}",le="{bound}"}}'
                summed = sum(s.get(f"framework_task_duration_seconds_bucket{label}", 0)
                             for s in own)
                assert dashboard[f"framework_app_task_duration_seconds_bucket{label}"] == \
                    summed, bound
            ours = f'{{app="{TIMED.name}"}}'
            assert dashboard[f"framework_app_tasks_done_total{ours}"] == done
            assert sum(s[f"framework_tasks_done_total{ours}"] for s in own) == done
            # no name on both endpoints: summing a name across them never counts twice
            assert not _names(dashboard) & set().union(*(_names(s) for s in own))

            # w1 stops (gracefully) and comes back under the same name: its counts start
            # again from zero, the dashboard's totals go on growing
            workers[0].terminate()
            await workers[0].wait()
            await _timed(stack, zk_hosts, chroot, "w1", ports[0], tmp_path / "again")
            for i in range(20):
                await client.submit("handle", {"n": 1000 + i})
            await _until(model, lambda: app.totals.done == done + 20)
            assert app.totals.durations.count == attempts + 20
            # a task longer than the status interval, the last one: its count is published
            # too (nothing else would make the worker publish again)
            await client.submit("handle", {"n": "long", "seconds": 1.5})
            await _until(model, lambda: app.totals.done == done + 21)
            nursery.cancel_scope.cancel()
    logs = "".join(w.log() for w in workers)
    assert "task.failed" in logs and "failed (the key is" in logs
    assert "secret-dead" not in logs and "secret-retried" not in logs
