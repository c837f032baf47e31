"""Real processes for the demo, the crash tests and the bench: masters and search nodes run
with ``python -m framework run`` through the framework's process harness
(:func:`framework.testing.spawn`): each logs to ``<logs>/<name>.log`` and dies with its
parent; leaving the ``async with`` kills -9 and reaps every process still running."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from contextlib import AsyncExitStack
from pathlib import Path

from examples.katta_like.layout import decode_logged, serving_of
from framework.primitives import Election
from framework.runtime import App, MasterIdentity, MemberStatus
from framework.testing import Child, spawn
from framework.zk import Session, watch_data

ROOT = Path(__file__).resolve().parents[2]


class Cluster:
    """Spawn, pause and kill the processes of one Katta deployment (``async with``).
    ``prefixes``: per process name, what its command line is run under (``ip netns exec
    HOST``: that process on another host, see ``tests/test_multihost.py``)."""

    def __init__(self, hosts: str, chroot: str | None, workdir: Path, *,
                 app: str = "katta", session_timeout: float = 4.0,
                 env: dict[str, str] | None = None,
                 prefixes: Mapping[str, Sequence[str]] | None = None) -> None:
        self.hosts = hosts
        self.chroot = chroot
        self.workdir = workdir
        self.logs = workdir / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.app = app
        self.session_timeout = session_timeout
        self.env = {"KATTA_STORE": str(workdir / "store"), "KATTA_SAFE_MODE": "1.0",
                    "KATTA_NODE_GRACE": "1.0", **(env or {})}
        self.prefixes = dict(prefixes or {})
        self.procs: dict[str, Child] = {}
        self._stack = AsyncExitStack()

    async def _spawn(self, name: str, component: str, env: dict[str, str]) -> Child:
        argv = [*self.prefixes.get(name, ()), sys.executable, "-m", "framework", "run",
                component, "--zk", self.hosts,
                "--app", self.app, "--name", name,
                "--session-timeout", str(self.session_timeout)]
        if self.chroot:
            argv += ["--chroot", self.chroot]
        environment = {
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
            "FRAMEWORK_LOG_LEVEL": os.environ.get("KATTA_CHILD_LOG_LEVEL", "info"),
        } | self.env | env
        child = await self._stack.enter_async_context(
            spawn(argv, name=name, log_dir=self.logs, env=environment, cwd=ROOT))
        self.procs[name] = child
        return child

    async def start_master(self, name: str) -> Child:
        return await self._spawn(name, "examples.katta_like.master:KattaMaster", {})

    async def start_node(self, name: str) -> Child:
        return await self._spawn(name, "examples.katta_like.node:SearchNode",
                                 {"KATTA_DATA": str(self.workdir / "nodes" / name)})

    async def kill9(self, name: str) -> None:
        """kill -9 ``name`` and wait until it is gone."""
        child = self.procs[name]
        child.kill()
        await child.wait()

    async def __aenter__(self) -> Cluster:
        await self._stack.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._stack.aclose()


async def active_master(session: Session, app: str = "katta") -> str | None:
    """The name of the leading master (from its election node), or None (also when its
    identity is not a record: a ``katta.bad_record`` event)."""
    masters = App(app).masters
    leader = await Election(session, masters).leader()
    identity = None if leader is None else decode_logged(leader.identifier, MasterIdentity,
                                                         masters)
    return None if identity is None else identity.name


async def wait_new_master(session: Session, old: str | None, app: str = "katta") -> str:
    """Wait (watch on the leader only) until a master other than ``old`` leads."""
    masters = App(app).masters
    async for info in Election(session, masters).watch_leaders():
        identity = None if info is None else decode_logged(info.identifier, MasterIdentity,
                                                           masters)
        if identity is not None and identity.name != old:
            return identity.name
    raise AssertionError("unreachable")


async def wait_serving(session: Session, node: str, app: str = "katta",
                       at_least: int = 1) -> None:
    """Wait until ``node`` reports serving ``at_least`` shards in its group status."""
    path = f"{App(app).workers}/{node}"
    async for snap in watch_data(session, path):
        member = decode_logged(snap.data, MemberStatus, path) if snap.data else None
        if member is not None and serving_of(member) >= at_least:
            return
