"""Running a broker cluster from tests, the demo and the bench.

* :class:`LocalCluster` runs servers and controllers as trio tasks in this process (each with
  its own ZooKeeper session), each in its own cancel scope: fast, for protocol tests.
* :class:`ProcessCluster` runs them as ``python -m framework run ...`` child processes, so they
  can be killed with ``kill -9`` (the kernel also kills them if the parent dies).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import attrs
import trio

from examples.message_broker.controller import BrokerController
from examples.message_broker.ctl import create_topics, wait_placed
from examples.message_broker.layout import BrokerPaths, PrimaryRecord, decode
from examples.message_broker.server import BrokerServer
from framework import errors
from framework.testing import Child, spawn
from framework.zk import Session, wait_exists, wait_gone

ROOT = Path(__file__).resolve().parents[2]


@attrs.define
class LocalCluster:
    """Servers and controllers as tasks of ``nursery`` (see the module doc)."""

    hosts: str
    chroot: str | None
    data_dir: Path
    nursery: trio.Nursery
    session_timeout: float = 4.0
    servers: dict[str, BrokerServer] = attrs.field(factory=dict)
    scopes: dict[str, trio.CancelScope] = attrs.field(factory=dict)

    async def _run(self, component: Any, scope: trio.CancelScope, hosts: str | None = None,
                   task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        with scope:
            async with Session(hosts or self.hosts, chroot=self.chroot,
                               session_timeout=self.session_timeout) as session:
                task_status.started()
                await component.run(session)

    async def start_server(self, name: str, session: Session, *, hosts: str | None = None,
                           **kwargs: Any) -> BrokerServer:
        """Start server ``name`` (its own session on ``hosts``, default the cluster's) and
        return once it is a member of ``nodes/``."""
        server = BrokerServer(name=name, data_dir=self.data_dir, **kwargs)
        self.servers[name] = server
        self.scopes[name] = trio.CancelScope()
        await self.nursery.start(self._run, server, self.scopes[name], hosts)
        await wait_exists(session, f"{BrokerPaths().nodes}/{name}")
        await wait_exists(session, f"{BrokerPaths().app.workers}/{name}")
        return server

    async def start_controller(self, name: str) -> BrokerController:
        controller = BrokerController(name=name)
        self.scopes[name] = trio.CancelScope()
        await self.nursery.start(self._run, controller, self.scopes[name])
        return controller

    async def start_with_topics(self, session: Session, topics: Sequence[str], *,
                                servers: Sequence[str] = ("s1", "s2"),
                                controllers: Sequence[str] = ("c1",),
                                mode: str = "refuse") -> None:
        """Start ``servers`` and ``controllers``, create ``topics`` (``mode``) and return
        once each has a serving primary."""
        for name in servers:
            await self.start_server(name, session)
        for name in controllers:
            await self.start_controller(name)
        await create_topics(session, topics, mode=mode)
        await wait_placed(session, topics)

    def crash(self, name: str) -> None:
        """Cancel a component at once (its session closes: like a clean crash)."""
        self.scopes[name].cancel()


class ProcessCluster:
    """Servers and controllers as child processes (see the module doc), through the
    framework's process harness: each dies with its parent, logs to ``<logs>/<name>.log``
    (appended to when a server restarts under its name); :meth:`stop_all` kills -9 and reaps
    every one still running.  ``prefixes``: per process name, what its command line is run
    under (``ip netns exec HOST``: that process on another host, as in
    ``tests/test_multihost.py``)."""

    def __init__(self, hosts: str, chroot: str | None, data_dir: Path, logs: Path, *,
                 session_timeout: float = 4.0, log_level: str = "info",
                 prefixes: Mapping[str, Sequence[str]] | None = None) -> None:
        self.hosts = hosts
        self.chroot = chroot
        self.data_dir = data_dir
        self.logs = logs
        self.session_timeout = session_timeout
        self.log_level = log_level
        self.prefixes = dict(prefixes or {})
        self.procs: dict[str, Child] = {}
        self._stack = AsyncExitStack()
        logs.mkdir(parents=True, exist_ok=True)

    async def spawn(self, kind: str, name: str, env: dict[str, str] | None = None) -> Child:
        cls = {"server": "BrokerServer", "controller": "BrokerController"}[kind]
        argv = [*self.prefixes.get(name, ()), sys.executable, "-m", "framework", "run",
                f"examples.message_broker.app:{cls}", "--zk", self.hosts, "--name", name,
                "--session-timeout", str(self.session_timeout)]
        if self.chroot:
            argv += ["--chroot", self.chroot]
        environment = {
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
            "FRAMEWORK_LOG_LEVEL": self.log_level,
            "FRAMEWORK_LOG_JSON": "1",
            "BROKER_DATA_DIR": str(self.data_dir),
            **(env or {}),
        }
        child = await self._stack.enter_async_context(
            spawn(argv, name=name, log_dir=self.logs, env=environment, cwd=ROOT))
        self.procs[name] = child
        return child

    async def wait_joined(self, session: Session, name: str) -> None:
        """Return once server ``name`` is a member of ``nodes/`` and of ``workers/`` (where
        the controller's placement sees it)."""
        await wait_exists(session, f"{BrokerPaths().nodes}/{name}")
        await wait_exists(session, f"{BrokerPaths().app.workers}/{name}")

    async def kill9(self, name: str) -> None:
        """kill -9 ``name`` and wait until it is gone."""
        child = self.procs[name]
        child.kill()
        await child.wait()

    async def wait_exit(self, name: str) -> int:
        return await self.procs[name].wait()

    async def stop_all(self) -> None:
        """kill -9 and reap every process still running."""
        await self._stack.aclose()

    def log_tail(self, name: str, lines: int = 10) -> str:
        try:
            text = (self.logs / f"{name}.log").read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


async def primaries(session: Session, topics: list[str]) -> dict[str, str]:
    """topic -> server currently holding its primary znode (topics without one left out)."""
    paths = BrokerPaths()
    out: dict[str, str] = {}
    for topic in topics:
        try:
            out[topic] = decode((await session.get(paths.primary(topic)))[0],
                                PrimaryRecord).server
        except errors.NoNodeError:
            continue
    return out


async def wait_server_gone(session: Session, name: str) -> None:
    await wait_gone(session, f"{BrokerPaths().nodes}/{name}")
