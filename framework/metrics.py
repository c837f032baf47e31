"""Per-process metrics: Prometheus (``framework run --metrics-port``) and the task counts a
worker publishes in its status record.

Small functions that the runtime calls at the moments that matter; each one only updates
in-memory state (no I/O, never raises), so calling them costs nothing measurable.

Two views of the same observations:

* **this process's Prometheus endpoint** (``--metrics-port``), names ``framework_*``:

      framework_tasks_done_total{app}            task_finished(app, ok=True, seconds)
      framework_tasks_failed_total{app}          task_finished(app, ok=False, seconds, final=...)
      framework_tasks_retried_total{app}         ... a failed attempt that will be retried
      framework_tasks_dead_lettered_total{app}   ... a failed attempt that was final
      framework_task_duration_seconds{app}       every finished attempt
      framework_tasks_in_flight{app}             task_started(app) / task_ended(app)
      framework_queue_depth{app}                 queue_depth(app, items)
      framework_leader_changes_total{app}        leadership_changed(app, leading)
      framework_is_leader{app}                   1 while this process leads the app
      framework_session_state_changes_total{state}  session_state_changed(state)
      framework_session_connected                1 while this process's session is connected

* **the worker's status record**: ``task_finished(..., owner=consumer)`` also counts into
  that owner's :class:`TaskStats` (:func:`task_stats`), which the owner publishes in its
  ``workers/<name>`` record with the rest of its status (at most every ``status_interval``,
  never one write per task).  The dashboard sums these across live workers and serves them
  under its own names (``framework_app_*``), so a Prometheus that scrapes both never counts
  a task twice.
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import Any

import attrs
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from framework import records
from framework.errors import FrameworkError

#: The registry of this process's framework metrics (``serve`` exposes it).
REGISTRY = CollectorRegistry(auto_describe=True)

#: Upper bounds (seconds) of every task duration histogram: this process's, the one in its
#: status record, and the dashboard's sum of those.
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
                    60.0, 300.0)


@attrs.define
class Durations:
    """A cumulative histogram, as Prometheus wants it: ``counts[i]`` is the number of
    observations ``<= bounds[i]``, the last count (``+Inf``) all of them; ``sum`` their
    total in seconds."""

    bounds: tuple[float, ...] = DURATION_BUCKETS
    counts: list[int] = attrs.Factory(lambda self: [0] * (len(self.bounds) + 1),
                                      takes_self=True)
    sum: float = 0.0

    @property
    def count(self) -> int:
        return self.counts[-1] if self.counts else 0

    def observe(self, seconds: float) -> None:
        seconds = max(seconds, 0.0)
        for i, bound in enumerate(self.bounds):
            if seconds <= bound:
                self.counts[i] += 1
        self.counts[-1] += 1
        self.sum += seconds

    def add(self, other: Durations, sign: int = 1) -> None:
        """Add (``sign=-1``: subtract) ``other``.  With other bounds only its count and sum
        are added (to ``+Inf``): the buckets of two layouts cannot be merged exactly."""
        if tuple(other.bounds) == tuple(self.bounds) and len(other.counts) == len(self.counts):
            for i, value in enumerate(other.counts):
                self.counts[i] += sign * value
        else:
            self.counts[-1] += sign * other.count
        self.sum += sign * other.sum

    def copy(self) -> Durations:
        return Durations(tuple(self.bounds), list(self.counts), self.sum)


@attrs.define
class TaskStats:
    """Cumulative counts of one task consumer since it started: tasks done, failed attempts
    (``retried`` ones and ``dead_lettered`` final ones) and the durations of every finished
    attempt.  Only ever grows; a restarted process starts again from zero."""

    done: int = 0
    failed: int = 0
    retried: int = 0
    dead_lettered: int = 0
    durations: Durations = attrs.Factory(Durations)

    def record(self, ok: bool, seconds: float, *, final: bool = False) -> None:
        self.durations.observe(seconds)
        if ok:
            self.done += 1
            return
        self.failed += 1
        if final:
            self.dead_lettered += 1
        else:
            self.retried += 1

    def published(self) -> dict[str, Any]:
        """The keys it adds to a status record (``MemberStatus`` reads them back)."""
        return {"retried": self.retried, "dead_lettered": self.dead_lettered,
                "durations": records.unstructure(self.durations)}

    def copy(self) -> TaskStats:
        return TaskStats(self.done, self.failed, self.retried, self.dead_lettered,
                         self.durations.copy())

    def shrank_from(self, earlier: TaskStats) -> bool:
        """Whether any count is below ``earlier``'s (the counting process restarted)."""
        return (self.done < earlier.done or self.failed < earlier.failed
                or self.retried < earlier.retried or self.dead_lettered < earlier.dead_lettered
                or self.durations.count < earlier.durations.count)

    def add(self, other: TaskStats, sign: int = 1) -> None:
        self.done += sign * other.done
        self.failed += sign * other.failed
        self.retried += sign * other.retried
        self.dead_lettered += sign * other.dead_lettered
        self.durations.add(other.durations, sign)


_stats: weakref.WeakKeyDictionary[object, TaskStats] = weakref.WeakKeyDictionary()


def task_stats(owner: object) -> TaskStats:
    """The :class:`TaskStats` that ``task_finished(..., owner=owner)`` counts into (new and
    empty on first use; it goes with ``owner``)."""
    stats = _stats.get(owner)
    if stats is None:
        stats = _stats[owner] = TaskStats()
    return stats

_done = Counter("framework_tasks_done", "Tasks finished successfully", ["app"],
                registry=REGISTRY)
_failed = Counter("framework_tasks_failed", "Task attempts that failed", ["app"],
                  registry=REGISTRY)
_retried = Counter("framework_tasks_retried", "Failed task attempts that will be retried",
                   ["app"], registry=REGISTRY)
_dead = Counter("framework_tasks_dead_lettered", "Tasks moved to the dead-letter list",
                ["app"], registry=REGISTRY)
_duration = Histogram("framework_task_duration_seconds", "Time spent in handle()", ["app"],
                      buckets=DURATION_BUCKETS, registry=REGISTRY)
_in_flight = Gauge("framework_tasks_in_flight", "Tasks being handled by this process",
                   ["app"], registry=REGISTRY)
_depth = Gauge("framework_queue_depth", "Items in the task queue, as last seen", ["app"],
               registry=REGISTRY)
_leader_changes = Counter("framework_leader_changes",
                          "Times this process became or stopped being the leader", ["app"],
                          registry=REGISTRY)
_is_leader = Gauge("framework_is_leader", "1 while this process leads the app", ["app"],
                   registry=REGISTRY)
_session_changes = Counter("framework_session_state_changes",
                           "ZooKeeper session state changes of this process", ["state"],
                           registry=REGISTRY)
_connected = Gauge("framework_session_connected", "1 while the ZooKeeper session is connected",
                   registry=REGISTRY)

_lock = threading.Lock()
_server: Any = None


def task_started(app: str) -> None:
    """A handler starts (call right before ``handle``)."""
    _in_flight.labels(app).inc()


def task_ended(app: str) -> None:
    """A handler is no longer running, however it ended (call in a ``finally``: a cancelled
    handler has no outcome but must leave the in-flight gauge)."""
    _in_flight.labels(app).dec()


def task_finished(app: str, ok: bool, seconds: float, *, final: bool = False,
                  owner: object | None = None) -> None:
    """A task's outcome: succeeded (``ok``, its result recorded) or failed; ``final``: the
    failure will not be retried (the item goes to the dead letters).  ``owner`` (the task
    consumer): also count it into ``task_stats(owner)``, the same observation."""
    seconds = max(seconds, 0.0)
    if owner is not None:
        task_stats(owner).record(ok, seconds, final=final)
    _duration.labels(app).observe(seconds)
    if ok:
        _done.labels(app).inc()
        return
    _failed.labels(app).inc()
    (_dead if final else _retried).labels(app).inc()


def queue_depth(app: str, items: int) -> None:
    """The queue's depth as last seen by this process (a master's ``wait_idle``, say)."""
    _depth.labels(app).set(items)


def leadership_changed(app: str, leading: bool) -> None:
    """This process became the leader (``True``) or its term ended (``False``)."""
    _leader_changes.labels(app).inc()
    _is_leader.labels(app).set(1 if leading else 0)


def session_state_changed(state: str) -> None:
    """The session went ``connected``, ``suspended`` or ``lost``."""
    _session_changes.labels(state).inc()
    _connected.set(1 if state == "connected" else 0)


#: The environment variable naming the address the metrics endpoint listens on.
LISTEN_ENV = "FRAMEWORK_METRICS_LISTEN"


def serve(port: int, host: str | None = None) -> int:
    """Serve ``/metrics`` of this process on ``host:port`` (a daemon thread); return the
    port (useful with 0).  ``host`` (default ``$FRAMEWORK_METRICS_LISTEN``, else
    ``0.0.0.0``: every interface, so a Prometheus on another host reaches it; the endpoint
    is not published anywhere, so it has no advertised address).  An address or port that
    cannot be bound is a one-line :class:`FrameworkError`.  Idempotent: a second call
    returns the first server's port."""
    global _server
    if not 0 <= port <= 65535:
        raise FrameworkError(f"--metrics-port must be between 0 and 65535, got {port}")
    host = host or os.environ.get(LISTEN_ENV) or "0.0.0.0"
    with _lock:
        if _server is None:
            try:
                _server = start_http_server(port, addr=host, registry=REGISTRY)
            except OSError as exc:
                raise FrameworkError(
                    f"cannot serve metrics on {host}:{port}: {exc.strerror or exc} "
                    f"(--metrics-port, ${LISTEN_ENV})"
                ) from None
        server = _server[0] if isinstance(_server, tuple) else _server
        return int(server.server_port)
