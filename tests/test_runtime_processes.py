"""The runtime with real processes: kill -9 masters and workers, SIGTERM drains."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import trio

from framework import Session
from framework.primitives import Rendezvous
from framework.runtime import App, TaskResult
from framework.zk import wait_exists, wait_gone, watch_children

HELPERS = Path(__file__).parent / "helpers"
ROOT = Path(__file__).parent.parent
APP = App("rt")
EVIDENCE = f"{APP.base}/evidence"  # tests/helpers/rt_app.py: a handler's traces
SESSION_TIMEOUT = 2.0


def spawn(kind: str, hosts: str, chroot: str, name: str, tmp_path: Path,
          **env: str) -> subprocess.Popen:
    log = open(tmp_path / f"{name}.log", "wb")  # noqa: SIM115 - owned by the child
    return subprocess.Popen(
        [sys.executable, "-m", "framework", "run", f"rt_app:{kind}", "--zk", hosts,
         "--chroot", chroot, "--name", name, "--session-timeout", str(SESSION_TIMEOUT)],
        env=os.environ | {"PYTHONPATH": f"{HELPERS}{os.pathsep}{ROOT}",
                          "FRAMEWORK_LOG_LEVEL": "info", **env},
        stdout=log, stderr=subprocess.STDOUT,
    )


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


async def exit_code(proc: subprocess.Popen) -> int:
    return await trio.to_thread.run_sync(proc.wait, abandon_on_cancel=True)  # fail_after works


async def results(session: Session) -> dict[str, TaskResult]:
    found = {}
    for bucket in await session.children(APP.results):
        for key in await session.children(f"{APP.results}/{bucket}"):
            data, _ = await session.get(f"{APP.results}/{bucket}/{key}")
            found[key] = TaskResult.decode(data)
    return found


def stop_all(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()


async def test_kill_9_of_the_active_master_while_tasks_flow(
    zk_hosts: str, chroot: str, tmp_path: Path
) -> None:
    total = 80
    env: dict[str, Any] = {"RT_TASKS": str(total), "RT_TASK_SECONDS": "0.1"}
    procs: list[subprocess.Popen] = []
    try:
        async with Session(zk_hosts, chroot=chroot) as s:
            with trio.fail_after(90):
                first = spawn("BatchMaster", zk_hosts, chroot, "master-a", tmp_path, **env)
                procs.append(first)
                assert await leader_name(s) == "master-a"
                standby = spawn("BatchMaster", zk_hosts, chroot, "master-b", tmp_path, **env)
                procs.append(standby)
                for i in range(3):
                    procs.append(spawn("RecordingWorker", zk_hosts, chroot, f"w{i}", tmp_path,
                                       **env))
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
                assert await exit_code(standby) == 0, "the new master finished the job"
                done = await results(s)
                overlaps = await s.children("/apps/rt/evidence/overlap")
                log = await s.children("/apps/rt/evidence/log")
    finally:
        stop_all(procs)
    assert sorted(done) == [f"t{i:04d}" for i in range(total)]
    assert all(r.ok for r in done.values())
    assert overlaps == [], "no task ran on two workers at the same time"
    assert len(log) >= total  # at-least-once: redeliveries may add executions, never lose one


async def test_kill_9_of_a_worker_mid_task_redoes_its_work(
    zk_hosts: str, chroot: str, tmp_path: Path
) -> None:
    procs: list[subprocess.Popen] = []
    try:
        async with Session(zk_hosts, chroot=chroot) as s:
            with trio.fail_after(60):
                procs.append(spawn("BatchMaster", zk_hosts, chroot, "m", tmp_path,
                                   RT_TASKS="1"))
                stuck = spawn("RecordingWorker", zk_hosts, chroot, "stuck", tmp_path,
                              RT_TASK_SECONDS="600")
                procs.append(stuck)
                await wait_children_at_least(s, "/apps/rt/evidence/log", 1)  # handler running
                data, _ = await s.get(f"{APP.running}/t0000")
                assert json.loads(data)["worker"] == "stuck"
                stuck.kill()
                procs.append(spawn("RecordingWorker", zk_hosts, chroot, "rescuer", tmp_path,
                                   RT_TASK_SECONDS="0.01"))
                assert await exit_code(procs[0]) == 0
                done = await results(s)
                log = [(await s.get(f"/apps/rt/evidence/log/{n}"))[0]
                       for n in sorted(await s.children("/apps/rt/evidence/log"))]
    finally:
        stop_all(procs)
    assert done["t0000"].ok and done["t0000"].worker == "rescuer"
    assert done["t0000"].attempts == 2
    assert log == [b"stuck", b"rescuer"]


async def test_sigterm_drains_in_flight_work_and_leaves(
    zk_hosts: str, chroot: str, tmp_path: Path
) -> None:
    procs: list[subprocess.Popen] = []
    try:
        async with Session(zk_hosts, chroot=chroot) as s:
            with trio.fail_after(60):
                procs.append(spawn("BatchMaster", zk_hosts, chroot, "m", tmp_path,
                                   RT_TASKS="1"))
                worker = spawn("RecordingWorker", zk_hosts, chroot, "w", tmp_path,
                               RT_TASK_SECONDS="1.0")
                procs.append(worker)
                # the handler has started (its evidence), not only the claim: a take whose
                # claim (with the running/ marker) lands as the drain begins hands its item
                # back unstarted, and this test has no other worker to take it
                await s.ensure_path(f"{EVIDENCE}/exec")
                await wait_exists(s, f"{EVIDENCE}/exec/t0000")
                worker.send_signal(signal.SIGTERM)
                assert await exit_code(worker) == 0
                await wait_gone(s, f"{APP.workers}/w")
                assert await exit_code(procs[0]) == 0
                done = await results(s)
    finally:
        stop_all(procs)
    assert done["t0000"].ok and done["t0000"].worker == "w" and done["t0000"].attempts == 1
    assert "worker.draining" in (tmp_path / "w.log").read_text()
