"""The dashboard's picture of every application: one shared model, fed by watches.

:class:`Model` is written only by the feed (:mod:`framework.dashboard.feed`) and read by
every viewer, the ``/metrics`` endpoint and the JSON API.  Viewers never read ZooKeeper: they
wait on :meth:`Model.wait_newer` and take :meth:`Model.snapshot_bytes`, which is encoded once
per version and shared by all of them.
"""

from __future__ import annotations

import json
import time
from collections import deque
from typing import Any

import attrs
import trio

#: Upper bounds (seconds) of the task duration histogram's buckets.
DURATION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)

#: Samples kept for the charts (one per :data:`SAMPLE_INTERVAL`).
HISTORY = 300
SAMPLE_INTERVAL = 1.0

#: Recent failures shown per application.
RECENT_FAILURES = 20
#: Dead letters listed per application (all are counted).
DEAD_LETTERS_SHOWN = 100


def json_doc(data: bytes | None) -> dict[str, Any]:
    """A znode's JSON object (``{}`` for empty data, ``{"raw": ...}`` for anything else)."""
    if not data:
        return {}
    try:
        value = json.loads(data)
    except ValueError:
        return {"raw": data.decode(errors="replace")[:2000]}
    return value if isinstance(value, dict) else {"value": value}


def numbers_of(doc: Any) -> dict[str, float]:
    """The numeric fields of a JSON object (booleans excluded): the counters hook."""
    if not isinstance(doc, dict):
        return {}
    return {k: v for k, v in doc.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)}


def worker_counters(status: dict[str, Any]) -> dict[str, float]:
    """An app's own counters in a worker's status: ``health()["counters"]`` if the worker
    returns such a dict, else the numeric fields of ``health()``."""
    health = status.get("health")
    if not isinstance(health, dict):
        return {}
    explicit = health.get("counters")
    return numbers_of(explicit) if isinstance(explicit, dict) else numbers_of(health)


@attrs.define
class Histogram:
    """Cumulative counts per upper bound, as Prometheus wants them."""

    counts: list[int] = attrs.field(factory=lambda: [0] * (len(DURATION_BUCKETS) + 1))
    total: float = 0.0

    def observe(self, seconds: float) -> None:
        seconds = max(seconds, 0.0)
        for i, bound in enumerate(DURATION_BUCKETS):
            if seconds <= bound:
                self.counts[i] += 1
        self.counts[-1] += 1
        self.total += seconds


@attrs.define
class Totals:
    """Counters derived from what the watches saw (monotonic while the dashboard runs)."""

    done: int = 0
    failed: int = 0
    dead_lettered: int = 0
    leader_changes: int = 0

    @property
    def retried(self) -> int:
        """Failed attempts that did not end in the dead-letter list."""
        return max(self.failed - self.dead_lettered, 0)


@attrs.define
class AppModel:
    """Everything the dashboard knows about one application."""

    name: str
    contenders: list[dict[str, Any]] = attrs.field(factory=list)  # line order, leader first
    workers: dict[str, dict[str, Any]] = attrs.field(factory=dict)
    running: dict[str, dict[str, Any]] = attrs.field(factory=dict)
    depth: int = 0
    claimed: int = 0
    failures: list[dict[str, Any]] = attrs.field(factory=list)
    dead: dict[str, dict[str, Any]] = attrs.field(factory=dict)
    config: dict[str, Any] | None = None
    shards: list[str] = attrs.field(factory=list)
    assignments: dict[str, str] = attrs.field(factory=dict)
    done: dict[str, Any] | None = None
    counters: dict[str, Any] = attrs.field(factory=dict)
    totals: Totals = attrs.field(factory=Totals)
    durations: Histogram = attrs.field(factory=Histogram)
    history: deque[tuple[float, int, int, int]] = attrs.field(
        factory=lambda: deque(maxlen=HISTORY))
    _seen_done: dict[str, tuple[int, int]] = attrs.field(factory=dict)

    # ---------------------------------------------------------------- updates

    def set_workers(self, workers: dict[str, dict[str, Any]]) -> None:
        """New group state; ``done``/``failed`` growth of each worker adds to the totals
        (a worker seen again with smaller numbers restarted: its numbers count afresh)."""
        for name, doc in workers.items():
            done, failed = int(doc.get("done", 0) or 0), int(doc.get("failed", 0) or 0)
            old_done, old_failed = self._seen_done.get(name, (0, 0))
            self.totals.done += done - old_done if done >= old_done else done
            self.totals.failed += failed - old_failed if failed >= old_failed else failed
            self._seen_done[name] = (done, failed)
        for gone in set(self._seen_done) - set(workers):
            del self._seen_done[gone]
        self.workers = workers

    def set_running(self, running: dict[str, dict[str, Any]], now: float) -> None:
        """New ``running/`` state; a task seen running and now gone adds its observed
        duration (its marker's start to now) to the histogram."""
        for task_id, doc in self.running.items():
            if task_id not in running and isinstance(doc.get("started"), (int, float)):
                self.durations.observe(now - doc["started"])
        self.running = running

    def set_contenders(self, contenders: list[dict[str, Any]]) -> None:
        old = self.contenders[0]["node"] if self.contenders else None
        new = contenders[0]["node"] if contenders else None
        if old is not None and new is not None and old != new:
            self.totals.leader_changes += 1
        self.contenders = contenders

    def set_dead(self, dead: dict[str, dict[str, Any]], first: bool) -> None:
        if not first:
            self.totals.dead_lettered += len(set(dead) - set(self.dead))
        self.dead = dead

    def sample(self, now: float) -> None:
        self.history.append((now, self.depth, self.totals.done, self.totals.failed))

    # ---------------------------------------------------------------- views

    def series(self) -> dict[str, list[float]]:
        """Chart data: queue depth and tasks/s (done, failed) per sample."""
        times: list[float] = []
        depth: list[float] = []
        done_rate: list[float] = []
        failed_rate: list[float] = []
        previous = None
        for sample in self.history:
            t, d, done, failed = sample
            if previous is not None and t > previous[0]:
                span = t - previous[0]
                times.append(round(t, 3))
                depth.append(d)
                done_rate.append(round(max(done - previous[2], 0) / span, 3))
                failed_rate.append(round(max(failed - previous[3], 0) / span, 3))
            previous = sample
        return {"t": times, "depth": depth, "done_rate": done_rate,
                "failed_rate": failed_rate}

    def to_json(self) -> dict[str, Any]:
        leader = self.contenders[0] if self.contenders else None
        workers = []
        for name, doc in sorted(self.workers.items()):
            running = [dict(task=t, **r) for t, r in sorted(self.running.items())
                       if r.get("worker") == name]
            workers.append({**doc, "name": name, "counters": worker_counters(doc),
                            "tasks": running})
        app_counters: dict[str, float] = {}
        for worker in workers:
            for key, value in worker["counters"].items():
                app_counters[key] = app_counters.get(key, 0) + value
        dead = [dict(name=n, **d) for n, d in sorted(self.dead.items())][:DEAD_LETTERS_SHOWN]
        return {
            "name": self.name,
            "leader": leader,
            "standbys": self.contenders[1:],
            "workers": workers,
            "running": len(self.running),
            "queue": {"depth": self.depth, "claimed": self.claimed},
            "failures": self.failures[-RECENT_FAILURES:][::-1],
            "dead_letters": dead,
            "dead_total": len(self.dead),
            "config": self.config,
            "shards": self.shards,
            "assignments": dict(sorted(self.assignments.items())),
            "done": self.done,
            "counters": self.counters,
            "worker_counters": app_counters,
            "totals": {"done": self.totals.done, "failed": self.totals.failed,
                       "retried": self.totals.retried,
                       "dead_lettered": self.totals.dead_lettered,
                       "leader_changes": self.totals.leader_changes},
            "series": self.series(),
        }


@attrs.define
class Model:
    """All applications, versioned; viewers wait for a newer version (no polling)."""

    allow_actions: bool = False
    apps: dict[str, AppModel] = attrs.field(factory=dict)
    session_state: str = "connecting"
    session_changes: dict[str, int] = attrs.field(factory=dict)
    viewers: int = 0
    version: int = 0
    _changed: trio.Event = attrs.field(factory=trio.Event)
    _encoded: tuple[int, bytes] = (-1, b"")

    def touch(self) -> None:
        """Something changed: wake every viewer."""
        self.version += 1
        self._changed.set()
        self._changed = trio.Event()

    async def wait_newer(self, version: int) -> int:
        """Return the current version once it is past ``version``."""
        while self.version <= version:
            await self._changed.wait()
        return self.version

    def app(self, name: str) -> AppModel:
        if name not in self.apps:
            self.apps[name] = AppModel(name)
        return self.apps[name]

    def session_changed(self, state: str) -> None:
        self.session_state = state
        self.session_changes[state] = self.session_changes.get(state, 0) + 1
        self.touch()

    def to_json(self) -> dict[str, Any]:
        return {
            "at": time.time(),
            "version": self.version,
            "session": self.session_state,
            "allow_actions": self.allow_actions,
            "viewers": self.viewers,
            "apps": [app.to_json() for _, app in sorted(self.apps.items())],
        }

    def snapshot_bytes(self) -> bytes:
        """The JSON state of the current version, encoded once and shared by all viewers."""
        if self._encoded[0] != self.version:
            self._encoded = (self.version, json.dumps(self.to_json(), default=str).encode())
        return self._encoded[1]
