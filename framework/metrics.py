"""Per-process Prometheus metrics (``framework run --metrics-port``).

Small functions that the runtime calls at the moments that matter; each one only updates an
in-memory metric (no I/O, never raises), so calling them costs nothing measurable.  The
names match those of the dashboard's ``/metrics`` (docs/dashboard.md), which derives the same
quantities from ZooKeeper for every process at once.

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
"""

from __future__ import annotations

import threading
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from framework.errors import FrameworkError

#: The registry of this process's framework metrics (``serve`` exposes it).
REGISTRY = CollectorRegistry(auto_describe=True)

#: Histogram bounds in seconds, the same as the dashboard's.
DURATION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)

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


def task_finished(app: str, ok: bool, seconds: float, *, final: bool = False) -> None:
    """A task's outcome: succeeded (``ok``, its result recorded) or failed; ``final``: the
    failure will not be retried (the item goes to the dead letters)."""
    _duration.labels(app).observe(max(seconds, 0.0))
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


def serve(port: int, host: str = "0.0.0.0") -> int:
    """Serve ``/metrics`` of this process on ``host:port`` (a daemon thread); return the
    port (useful with 0).  A port that cannot be bound is a one-line :class:`FrameworkError`.
    Idempotent: a second call returns the first server's port."""
    global _server
    if not 0 <= port <= 65535:
        raise FrameworkError(f"--metrics-port must be between 0 and 65535, got {port}")
    with _lock:
        if _server is None:
            try:
                _server = start_http_server(port, addr=host, registry=REGISTRY)
            except OSError as exc:
                raise FrameworkError(
                    f"cannot serve metrics on {host}:{port}: {exc.strerror or exc}"
                ) from None
        server = _server[0] if isinstance(_server, tuple) else _server
        return int(server.server_port)
