"""The runtime with real processes: kill -9 masters and workers, SIGTERM drains."""

from __future__ import annotations

import json
import os
import sys
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import trio

from framework import Session
from framework.primitives import Rendezvous
from framework.runtime import App, TaskResult
from framework.testing import Child, spawn
from framework.zk import wait_exists, wait_gone, watch_children

HELPERS = Path(__file__).parent / "helpers"
ROOT = Path(__file__).parent.parent
APP = App("rt")
EVIDENCE = f"{APP.base}/evidence"  # tests/helpers/rt_app.py: a handler's traces
SESSION_TIMEOUT = 2.0


async def start(stack: AsyncExitStack, kind: str, hosts: str, chroot: str, name: str,
                tmp_path: Path, **env: str) -> Child:
    """``framework run rt_app:<kind>`` as a child (killed when ``stack`` closes)."""
    return await stack.enter_async_context(spawn(
        [sys.executable, "-m", "framework", "run", f"rt_app:{kind}", "--zk", hosts,
         "--chroot", chroot, "--name", name, "--session-timeout", str(SESSION_TIMEOUT)],
        name=name, log_dir=tmp_path,
        env={"PYTHONPATH": f"{HELPERS}{os.pathsep}{ROOT}", "FRAMEWORK_LOG_LEVEL": "info",
             **env}))


async def leader_name(session: Session, not_: str | None = None) -> str:
    async for data in Rendezvous(session, APP.rendezvous).watch():
        if data:
            name = json.loads(data)["name"]
            if name != not_:
                return name
    raise AssertionError("unreachable")


async def wait_children_at_least(session: Session, path: str, count: int) -> None:
    await session.ensure_path(path)
    async for snap in watch_children(session, path):
        if len(snap.children) >= count:
            return


async def results(session: Session) -> dict[str, TaskResult]:
    found = {}
    for bucket in await session.children(APP.results):
        for key in await session.children(f"{APP.results}/{bucket}"):
            data, _ = await session.get(f"{APP.results}/{bucket}/{key}")
            found[key] = TaskResult.decode(data)
    return found


async def test_kill_9_of_the_active_master_while_tasks_flow(
    zk_hosts: str, chroot: str, tmp_path: Path
) -> None:
    total = 80
    env: dict[str, Any] = {"RT_TASKS": str(total), "RT_TASK_SECONDS": "0.1"}
    async with AsyncExitStack() as procs, Session(zk_hosts, chroot=chroot) as s:
        with trio.fail_after(90):
            first = await start(procs, "BatchMaster", zk_hosts, chroot, "master-a",
                                tmp_path, **env)
            assert await leader_name(s) == "master-a"
            standby = await start(procs, "BatchMaster", zk_hosts, chroot, "master-b",
                                  tmp_path, **env)
            for i in range(3):
                await start(procs, "RecordingWorker", zk_hosts, chroot, f"w{i}", tmp_path,
                            **env)
            await wait_children_at_least(s, "/apps/rt/evidence/log", 10)
            await wait_exists(s, "/apps/rt/submitted")
            # both masters are in line before the kill
            await wait_children_at_least(s, APP.masters, 2)
            first.kill()
            killed_at = time.monotonic()
            assert await leader_name(s, not_="master-a") == "master-b"
            failover = time.monotonic() - killed_at
            print(f"failover after kill -9: {failover:.2f}s "
                  f"(session timeout {SESSION_TIMEOUT}s)")
            assert await standby.wait() == 0, "the new master finished the job"
            done = await results(s)
            overlaps = await s.children("/apps/rt/evidence/overlap")
            log = await s.children("/apps/rt/evidence/log")
    assert sorted(done) == [f"t{i:04d}" for i in range(total)]
    assert all(r.ok for r in done.values())
    assert overlaps == [], "no task ran on two workers at the same time"
    assert len(log) >= total  # at-least-once: redeliveries may add executions, never lose one


async def test_kill_9_of_a_worker_mid_task_redoes_its_work(
    zk_hosts: str, chroot: str, tmp_path: Path
) -> None:
    async with AsyncExitStack() as procs, Session(zk_hosts, chroot=chroot) as s:
        with trio.fail_after(60):
            master = await start(procs, "BatchMaster", zk_hosts, chroot, "m", tmp_path,
                                 RT_TASKS="1")
            stuck = await start(procs, "RecordingWorker", zk_hosts, chroot, "stuck",
                                tmp_path, RT_TASK_SECONDS="600")
            await wait_children_at_least(s, "/apps/rt/evidence/log", 1)  # handler running
            data, _ = await s.get(f"{APP.running}/t0000")
            assert json.loads(data)["worker"] == "stuck"
            stuck.kill()
            await start(procs, "RecordingWorker", zk_hosts, chroot, "rescuer", tmp_path,
                        RT_TASK_SECONDS="0.01")
            assert await master.wait() == 0
            done = await results(s)
            log = [(await s.get(f"/apps/rt/evidence/log/{n}"))[0]
                   for n in sorted(await s.children("/apps/rt/evidence/log"))]
    assert done["t0000"].ok and done["t0000"].worker == "rescuer"
    assert done["t0000"].attempts == 2
    assert log == [b"stuck", b"rescuer"]


async def test_sigterm_drains_in_flight_work_and_leaves(
    zk_hosts: str, chroot: str, tmp_path: Path
) -> None:
    async with AsyncExitStack() as procs, Session(zk_hosts, chroot=chroot) as s:
        with trio.fail_after(60):
            master = await start(procs, "BatchMaster", zk_hosts, chroot, "m", tmp_path,
                                 RT_TASKS="1")
            worker = await start(procs, "RecordingWorker", zk_hosts, chroot, "w",
                                 tmp_path, RT_TASK_SECONDS="1.0")
            # the handler has started (its evidence), not only the claim: a take whose
            # claim (with the running/ marker) lands as the drain begins hands its item
            # back unstarted, and this test has no other worker to take it
            await s.ensure_path(f"{EVIDENCE}/exec")
            await wait_exists(s, f"{EVIDENCE}/exec/t0000")
            worker.terminate()
            assert await worker.wait() == 0
            await wait_gone(s, f"{APP.workers}/w")
            assert await master.wait() == 0
            done = await results(s)
    assert done["t0000"].ok and done["t0000"].worker == "w" and done["t0000"].attempts == 1
    assert "worker.draining" in worker.log()
