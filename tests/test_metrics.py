"""Per-process Prometheus metrics (``framework run --metrics-port``), scraped from real
master and worker processes of the runtime test application (tests/helpers/rt_app.py)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import trio

from framework import Session
from framework.runtime import App
from framework.zk import wait_exists
from framework.zkserver import free_ports

HELPERS = Path(__file__).parent / "helpers"
ROOT = Path(__file__).parent.parent
APP = App("rt")
TASKS = 12


def _spawn(kind: str, hosts: str, chroot: str, name: str, port: int,
           log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "framework", "run", f"rt_app:{kind}", "--zk", hosts,
         "--chroot", chroot, "--name", name, "--session-timeout", "2",
         "--metrics-port", str(port)],
        env=os.environ | {"PYTHONPATH": f"{HELPERS}{os.pathsep}{ROOT}",
                          "RT_TASKS": str(TASKS), "RT_TASK_SECONDS": "0.01"},
        stdout=log.open("wb"), stderr=subprocess.STDOUT,
    )


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



async def test_master_and_worker_metrics(zk_hosts: str, chroot: str, tmp_path: Path,
                                         procs: list[subprocess.Popen]) -> None:
    master_port, worker_port = free_ports(2)
    with trio.fail_after(60):
        async with Session(zk_hosts, chroot=chroot) as session:
            procs.append(_spawn("BatchMaster", zk_hosts, chroot, "m1", master_port,
                                tmp_path / "m1.log"))
            await wait_exists(session, APP.rendezvous)  # elected: the term has begun
            master = await trio.to_thread.run_sync(_scrape, master_port)
            assert master['framework_is_leader{app="rt"}'] == 1
            assert master['framework_leader_changes_total{app="rt"}'] == 1
            assert master["framework_session_connected"] == 1
            assert master['framework_session_state_changes_total{state="connected"}'] >= 1

            procs.append(_spawn("RecordingWorker", zk_hosts, chroot, "w1", worker_port,
                                tmp_path / "w1.log"))
            await wait_exists(session, APP.done)  # every task done and recorded
            worker = await trio.to_thread.run_sync(_scrape, worker_port)
    assert worker['framework_tasks_done_total{app="rt"}'] == TASKS
    assert worker['framework_task_duration_seconds_count{app="rt"}'] == TASKS
    assert worker['framework_tasks_in_flight{app="rt"}'] == 0
    assert worker.get('framework_tasks_failed_total{app="rt"}', 0) == 0
    assert worker["framework_session_connected"] == 1
