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

from framework import records
from framework.metrics import TaskStats
from framework.runtime.operations import AppState, schedule_rows
from framework.runtime.records import MemberStatus
from framework.runtime.scheduling import Schedule, ScheduleRecord

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
    """An app's own counters in a member's status: ``health()["counters"]`` if the worker
    returns such a dict, else the numeric fields of ``health()``; with the record's own
    ``counters`` (a member that writes its status itself, like a broker server) over
    them."""
    health = status.get("health")
    own = numbers_of(status.get("counters"))
    if not isinstance(health, dict):
        return own
    explicit = health.get("counters")
    return (numbers_of(explicit) if isinstance(explicit, dict) else numbers_of(health)) | own


#: Members whose last counts are remembered after they left (a member that joins again in a
#: new session, same process, must not count its tasks twice); the oldest are forgotten.
GONE_MEMBERS_KEPT = 10_000

#: Order of the applications: running ones first, those with no live process last.
STATE_ORDER = {"active": 0, "no leader": 1, "cancelled": 2, "done": 3, "stale": 4}


def member_stats(doc: dict[str, Any]) -> tuple[tuple[str, int], TaskStats]:
    """A ``workers/`` member's process identity (host, pid) and its task counts; a record
    that does not decode counts nothing."""
    try:
        status = records.structure(doc, MemberStatus)
    except records.CorruptRecord:
        return ("", 0), TaskStats()
    return (status.host, status.pid), status.task_stats()


@attrs.define
class AppModel:
    """Everything the dashboard knows about one application."""

    name: str
    contenders: list[dict[str, Any]] = attrs.field(factory=list)  # line order, leader first
    workers: dict[str, dict[str, Any]] = attrs.field(factory=dict)
    running: dict[str, dict[str, Any]] = attrs.field(factory=dict)
    #: each queue's (depth, claimed items), by name (``default`` and the named queues)
    queues: dict[str, tuple[int, int]] = attrs.field(factory=dict)
    failures: list[dict[str, Any]] = attrs.field(factory=list)
    dead: dict[str, dict[str, Any]] = attrs.field(factory=dict)
    results: int | None = None  # the app's result records (None: not counted yet)
    config: dict[str, Any] | None = None
    shards: list[str] = attrs.field(factory=list)
    assignments: dict[str, str] = attrs.field(factory=dict)
    done: dict[str, Any] | None = None
    cancelled: dict[str, Any] | None = None
    counters: dict[str, Any] = attrs.field(factory=dict)
    totals: TaskStats = attrs.field(factory=TaskStats)
    leader_changes: int = 0
    #: the task list: recent result records, newest first (framework.dashboard.tasks_feed)
    recent: list[dict[str, Any]] = attrs.field(factory=list)
    running_types: dict[str, str] = attrs.field(factory=dict)  # running task id -> type
    delayed: list[dict[str, Any]] = attrs.field(factory=list)  # the soonest delayed tasks
    delayed_total: int = 0
    schedule_records: dict[str, dict[str, Any]] = attrs.field(factory=dict)
    #: the schedules' definitions (``dashboard --schedules MODULE:CLASS``): next fires
    schedule_defs: list[Schedule] = attrs.field(factory=list)
    revoked: set[str] = attrs.field(factory=set)  # ids revoked (``revoked/``)
    history: deque[tuple[float, int, int, int]] = attrs.field(
        factory=lambda: deque(maxlen=HISTORY))
    _seen: dict[str, tuple[tuple[str, int], TaskStats]] = attrs.field(factory=dict)

    # ---------------------------------------------------------------- updates

    @property
    def depth(self) -> int:
        """Items in all its queues (claimed ones included)."""
        return sum(depth for depth, _claimed in self.queues.values())

    @property
    def claimed(self) -> int:
        """Items claimed by a worker, in all its queues."""
        return sum(claimed for _depth, claimed in self.queues.values())

    def queue_rows(self) -> list[dict[str, Any]]:
        """One row per queue, ``default`` first: its depth, claims, and the running workers
        that take tasks from it (their status documents' ``queues``; a worker that
        publishes none serves the default queue)."""
        rows = []
        for name in sorted(self.queues, key=lambda n: (n != "default", n)):
            depth, claimed = self.queues[name]
            serving = sorted(w for w, doc in self.workers.items()
                             if doc.get("state") == "running" and doc.get("types")
                             and name in (doc.get("queues") or ["default"]))
            rows.append({"name": name, "depth": depth, "claimed": claimed,
                         "workers": serving})
        return rows

    def set_workers(self, workers: dict[str, dict[str, Any]]) -> None:
        """New group state.  The task counts and durations each member publishes (its
        :class:`~framework.metrics.TaskStats`) add their growth to :attr:`totals`, which
        therefore only grow: a member seen for the first time adds all it has, one whose
        process changed (host, pid) or whose counts went down (a restart) adds its new
        counts whole, and one that left keeps what it had added."""
        for name, doc in workers.items():
            identity, stats = member_stats(doc)
            seen = self._seen.pop(name, None)  # re-inserted: the dict stays in seen order
            self.totals.add(stats)
            if seen is not None and seen[0] == identity and not stats.shrank_from(seen[1]):
                self.totals.add(seen[1], -1)
            self._seen[name] = (identity, stats)
        gone = len(self._seen) - len(workers) - GONE_MEMBERS_KEPT
        for name in [n for n in self._seen if n not in workers][:max(gone, 0)]:
            del self._seen[name]
        self.workers = workers

    def set_running(self, running: dict[str, dict[str, Any]]) -> None:
        self.running = running

    def set_contenders(self, contenders: list[dict[str, Any]]) -> None:
        old = self.contenders[0]["node"] if self.contenders else None
        new = contenders[0]["node"] if contenders else None
        if old is not None and new is not None and old != new:
            self.leader_changes += 1
        self.contenders = contenders

    def set_dead(self, dead: dict[str, dict[str, Any]]) -> None:
        self.dead = dead

    def sample(self, now: float) -> None:
        self.history.append((now, self.depth, self.totals.done, self.totals.failed))

    # ---------------------------------------------------------------- views

    @property
    def state(self) -> str:
        """:class:`~framework.runtime.operations.AppState`'s value, or ``stale``: neither done
        nor cancelled, and no live process (no master in the election, no member)."""
        state = AppState.of(cancelled=self.cancelled is not None, done=self.done is not None,
                            led=bool(self.contenders))
        if state is AppState.NO_LEADER and not self.contenders and not self.workers:
            return "stale"
        return state.value

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

    def schedules(self, now: float) -> list[dict[str, Any]]:
        """Each schedule: its last slot, fires, and next fire when its definition is known."""
        found = {}
        for name, doc in self.schedule_records.items():
            try:
                found[name] = records.structure(doc, ScheduleRecord)
            except records.CorruptRecord:
                continue
        rows = schedule_rows(found, self.schedule_defs, int(now * 1e9))
        return [records.unstructure(row) for row in rows]

    def duty_holder(self) -> str | None:
        """The member holding the app's duties (worker-only deployments), if one says so."""
        return next((name for name, doc in sorted(self.workers.items())
                     if doc.get("duties") in ("held", "deferred")), None)

    def to_json(self) -> dict[str, Any]:
        leader = self.contenders[0] if self.contenders else None
        workers = []
        for name, doc in sorted(self.workers.items()):
            running = [dict(task=t, **r, type=self.running_types.get(t),
                            revoked=t in self.revoked)
                       for t, r in sorted(self.running.items()) if r.get("worker") == name]
            workers.append({"kind": "worker", **doc, "name": name,
                            "counters": worker_counters(doc), "tasks": running})
        app_counters: dict[str, float] = {}
        for worker in workers:
            for key, value in worker["counters"].items():
                app_counters[key] = app_counters.get(key, 0) + value
        dead = [dict(name=n, **d) for n, d in sorted(self.dead.items())][:DEAD_LETTERS_SHOWN]
        return {
            "name": self.name,
            "state": self.state,
            "cancelled": self.cancelled,
            "leader": leader,
            "standbys": self.contenders[1:],
            "workers": workers,
            "running": len(self.running),
            "queue": {"depth": self.depth, "claimed": self.claimed,
                      "queues": self.queue_rows()},
            "failures": self.failures[-RECENT_FAILURES:][::-1],
            "dead_letters": dead,
            "dead_total": len(self.dead),
            "results": self.results,
            "config": self.config,
            "shards": self.shards,
            "assignments": dict(sorted(self.assignments.items())),
            "done": self.done,
            "counters": self.counters,
            "worker_counters": app_counters,
            "totals": {"done": self.totals.done, "failed": self.totals.failed,
                       "retried": self.totals.retried,
                       "dead_lettered": self.totals.dead_lettered,
                       "leader_changes": self.leader_changes},
            "durations": records.unstructure(self.totals.durations),
            "series": self.series(),
            "duty_holder": self.duty_holder(),
            "recent": self.recent,
            "delayed": [d | {"revoked": d["task_id"] in self.revoked} for d in self.delayed],
            "delayed_total": self.delayed_total,
            "schedules": self.schedules(time.time()),
        }


@attrs.define
class Model:
    """All applications, versioned; viewers wait for a newer version (no polling)."""

    allow_actions: bool = False
    apps: dict[str, AppModel] = attrs.field(factory=dict)
    #: each app's schedule definitions, by app name (``dashboard --schedules``)
    schedules: dict[str, list[Schedule]] = attrs.field(factory=dict)
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
            self.apps[name] = AppModel(name, schedule_defs=self.schedules.get(name, []))
        return self.apps[name]

    def ordered(self) -> list[AppModel]:
        """The applications, running ones first (:data:`STATE_ORDER`), then by name."""
        return sorted(self.apps.values(), key=lambda a: (STATE_ORDER.get(a.state, 9), a.name))

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
            "apps": [app.to_json() for app in self.ordered()],
        }

    def snapshot_bytes(self) -> bytes:
        """The JSON state of the current version, encoded once and shared by all viewers."""
        if self._encoded[0] != self.version:
            self._encoded = (self.version, json.dumps(self.to_json(), default=str).encode())
        return self._encoded[1]
