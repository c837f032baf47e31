"""What ``framework status APP`` shows: one consistent look at an application in ZooKeeper."""

from __future__ import annotations

import json
import time
from typing import Any

import attrs
from rich.console import Group as RichGroup
from rich.table import Table

from framework import errors
from framework.primitives import Election
from framework.primitives.queue import WorkQueue
from framework.runtime.app import App
from framework.zk import Session


@attrs.frozen
class AppStatus:
    app: str
    exists: bool
    leader: dict[str, Any] | None
    standbys: int
    workers: dict[str, dict[str, Any]]
    queue_depth: int
    running: dict[str, dict[str, Any]]
    assignments: dict[str, str]
    failures: list[dict[str, Any]]
    dead_letters: int
    results: int

    def to_json(self) -> str:
        return json.dumps(attrs.asdict(self), indent=2, default=str)


def _doc(data: bytes) -> dict[str, Any]:
    try:
        value = json.loads(data) if data else {}
    except ValueError:
        return {"raw": data.decode(errors="replace")}
    return value if isinstance(value, dict) else {"value": value}


async def _children(session: Session, path: str) -> list[str]:
    try:
        return sorted(await session.children(path))
    except errors.NoNodeError:
        return []


async def _data(session: Session, path: str) -> dict[str, Any] | None:
    try:
        return _doc((await session.get(path))[0])
    except errors.NoNodeError:
        return None


async def gather_status(session: Session, app: App, *, recent_failures: int = 5) -> AppStatus:
    """Read the application's state (a few dozen reads; fine for a status command)."""
    if await session.exists(app.base) is None:
        return AppStatus(app.name, False, None, 0, {}, 0, {}, {}, [], 0, 0)
    election = Election(session, app.masters)
    contenders = await election.contenders() if await session.exists(app.masters) else []
    leader = _doc(contenders[0].identifier) | {"token": contenders[0].token} if contenders else None
    workers = {}
    for name in await _children(session, app.workers):
        doc = await _data(session, f"{app.workers}/{name}")
        if doc is not None:
            workers[name] = doc
    running = {}
    for task_id in await _children(session, app.running):
        doc = await _data(session, f"{app.running}/{task_id}")
        if doc is not None:
            running[task_id] = doc
    assignments = {}
    for worker in await _children(session, app.assignments):
        for shard in await _children(session, app.assignment_dir(worker)):
            assignments[shard] = worker
    failures = []
    for name in (await _children(session, app.failures))[-recent_failures:]:
        doc = await _data(session, f"{app.failures}/{name}")
        if doc is not None:
            failures.append(doc)
    results = 0
    for bucket in await _children(session, app.results):
        results += len(await _children(session, f"{app.results}/{bucket}"))
    depth = 0
    if await session.exists(app.tasks):
        depth = await WorkQueue(session, app.tasks).size()
    return AppStatus(
        app=app.name,
        exists=True,
        leader=leader,
        standbys=max(len(contenders) - 1, 0),
        workers=workers,
        queue_depth=depth,
        running=running,
        assignments=assignments,
        failures=failures,
        dead_letters=len(await _children(session, app.dead)),
        results=results,
    )


def render_status(status: AppStatus) -> RichGroup | str:
    """A human-readable view (rich tables)."""
    if not status.exists:
        return f"No application {status.app!r} in this ZooKeeper."
    now = time.time()
    leader = status.leader or {}
    summary = Table.grid(padding=(0, 2))
    summary.add_row("application", status.app)
    summary.add_row("leader", f"{leader.get('name', '-')} {leader.get('address', '')}".strip()
                    + (f" (token {leader['token']})" if leader else " (none)"))
    summary.add_row("standby masters", str(status.standbys))
    summary.add_row("queue depth", str(status.queue_depth))
    summary.add_row("running tasks", str(len(status.running)))
    summary.add_row("results", str(status.results))
    summary.add_row("dead letters", str(status.dead_letters))
    workers = Table(title="workers")
    for column in ("name", "address", "state", "load", "done", "failed", "shards", "health",
                   "seen"):
        workers.add_column(column)
    for name, doc in sorted(status.workers.items()):
        health = doc.get("health", {})
        workers.add_row(
            name, str(doc.get("address", "")), str(doc.get("state", "?")),
            f"{doc.get('load', 0):.0%}", str(doc.get("done", 0)), str(doc.get("failed", 0)),
            ",".join(doc.get("shards", [])) or "-",
            "ok" if health.get("ok", True) else json.dumps(health),
            f"{now - doc['at']:.0f}s ago" if "at" in doc else "-",
        )
    parts: list[Any] = [summary, workers]
    if status.assignments:
        shards = Table(title="assignments")
        shards.add_column("shard")
        shards.add_column("worker")
        for shard, worker in sorted(status.assignments.items()):
            shards.add_row(shard, worker)
        parts.append(shards)
    if status.failures:
        failures = Table(title="recent failures")
        for column in ("task", "worker", "attempt", "error"):
            failures.add_column(column)
        for doc in status.failures:
            failures.add_row(str(doc.get("task_id")), str(doc.get("worker")),
                             str(doc.get("attempts")), str(doc.get("error")))
        parts.append(failures)
    return RichGroup(*parts)
