"""Real processes for the demo, the crash tests and the bench: masters and search nodes run
with ``python -m framework run``, each logging to ``<logs>/<name>.log``, each killed by the
kernel if the parent dies (``PR_SET_PDEATHSIG``)."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from framework.primitives import Election
from framework.runtime import App
from framework.zk import Session

ROOT = Path(__file__).resolve().parents[2]


def _die_with_parent() -> None:  # runs in the child between fork and exec
    with contextlib.suppress(Exception):
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class Cluster:
    """Spawn and kill the processes of one Katta deployment."""

    def __init__(self, hosts: str, chroot: str | None, workdir: Path, *,
                 app: str = "katta", session_timeout: float = 4.0,
                 env: dict[str, str] | None = None) -> None:
        self.hosts = hosts
        self.chroot = chroot
        self.workdir = workdir
        self.logs = workdir / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.app = app
        self.session_timeout = session_timeout
        self.env = {"KATTA_STORE": str(workdir / "store"), "KATTA_SAFE_MODE": "1.0",
                    "KATTA_NODE_GRACE": "1.0", **(env or {})}
        self.procs: dict[str, subprocess.Popen[Any]] = {}

    def _spawn(self, name: str, component: str, env: dict[str, str]) -> None:
        argv = [sys.executable, "-m", "framework", "run", component, "--zk", self.hosts,
                "--app", self.app, "--name", name,
                "--session-timeout", str(self.session_timeout)]
        if self.chroot:
            argv += ["--chroot", self.chroot]
        environment = os.environ | {
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
            "FRAMEWORK_LOG_LEVEL": os.environ.get("KATTA_CHILD_LOG_LEVEL", "info"),
        } | self.env | env
        with open(self.logs / f"{name}.log", "ab") as log:
            self.procs[name] = subprocess.Popen(
                argv, env=environment, cwd=ROOT, stdout=log, stderr=log,
                preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None)

    def start_master(self, name: str) -> None:
        self._spawn(name, "examples.katta_like.master:KattaMaster", {})

    def start_node(self, name: str) -> None:
        self._spawn(name, "examples.katta_like.node:SearchNode",
                    {"KATTA_DATA": str(self.workdir / "nodes" / name)})

    def kill9(self, name: str) -> None:
        proc = self.procs[name]
        proc.send_signal(signal.SIGKILL)
        proc.wait()

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
            proc.wait()

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_all()


async def active_master(session: Session, app: str = "katta") -> str | None:
    """The name of the leading master (from its election node), or None."""
    leader = await Election(session, App(app).masters).leader()
    return None if leader is None else json.loads(leader.identifier)["name"]


async def wait_new_master(session: Session, old: str | None, app: str = "katta") -> str:
    """Wait (watch on the leader only) until a master other than ``old`` leads."""
    async for info in Election(session, App(app).masters).watch_leaders():
        if info is not None:
            name = json.loads(info.identifier)["name"]
            if name != old:
                return name
    raise AssertionError("unreachable")


async def wait_serving(session: Session, node: str, app: str = "katta",
                       at_least: int = 1) -> None:
    """Wait until ``node`` reports serving ``at_least`` shards in its group status."""
    from framework.zk import watch_data

    async for snap in watch_data(session, f"{App(app).workers}/{node}"):
        if snap.data and json.loads(snap.data).get("health", {}).get("serving", 0) >= at_least:
            return
