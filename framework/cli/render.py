"""The command line's tables: what ``framework status``, ``apps``, ``inspect`` and ``dead``
print.  The runtime returns data (:mod:`framework.runtime.operations`); rendering it, with
rich, is the command line's job.  Long cells fold, nothing is cut.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from rich.console import Group as RichGroup
from rich.table import Table

if TYPE_CHECKING:
    from framework.runtime.operations import (
        ActiveTask,
        AppStatus,
        AppSummary,
        Contender,
        DelayedReport,
        QueueReport,
        ScheduleState,
        TypeRow,
    )
    from framework.runtime.records import RunningRecord


def _table(title: str | None, *columns: str) -> Table:
    """A table that folds long cells instead of cutting them."""
    table = Table(title=title, title_justify="left")
    for column in columns:
        table.add_column(column, overflow="fold")
    return table


def render_apps(apps: list[AppSummary]) -> Table | str:
    if not apps:
        return "No applications in this ZooKeeper."
    table = _table(None, "app", "state", "generation", "leader", "masters", "workers",
                   "queue depth")
    for a in apps:
        table.add_row(a.name, a.state, str(a.generation), a.leader or "-", str(a.masters),
                      str(a.workers), str(a.queue_depth))
    return table


def _master(who: Contender) -> str:
    address = f" {who.address}" if who.address else ""
    return f"{who.name} ({who.host or '?'}:{who.pid or '?'}){address} token {who.token}"


def _progress(marker: RunningRecord) -> str:
    done, total = marker.done, marker.total
    if done is None:
        return "-"
    text = f"{done:g}/{total:g} ({done / total:.0%})" if total else f"{done:g}"
    return f"{text} {marker.message or ''}".strip()


def _ago(now: float, at: Any) -> str:
    return f"{now - at:.0f}s ago" if isinstance(at, (int, float)) else "-"


def render_status(status: AppStatus) -> RichGroup | str:
    """A human-readable view (rich tables; long cells fold, nothing is cut)."""
    if not status.exists:
        return f"No application {status.app!r} in this ZooKeeper."
    now = time.time()
    parts: list[Any] = [_summary(status, now), _workers(status, now)]
    if status.running:
        running = _table("running tasks", "task", "worker", "attempt", "progress", "started")
        for task_id, marker in sorted(status.running.items()):
            running.add_row(task_id, marker.worker or "?", str(marker.attempt),
                            _progress(marker), _ago(now, marker.started))
        parts.append(running)
    if status.assignments:
        shards = _table("assignments", "shard", "worker")
        for shard, worker in sorted(status.assignments.items()):
            shards.add_row(shard, worker)
        parts.append(shards)
    if status.failures:
        failures = _table("recent failures", "task", "worker", "attempt", "error")
        for failure in status.failures:
            failures.add_row(failure.task_id, failure.worker, str(failure.attempts),
                             str(failure.error))
        parts.append(failures)
    return RichGroup(*parts)


def _summary(status: AppStatus, now: float) -> Table:
    """The application's lines: state, generation, masters, duties, counts."""
    summary = Table.grid(padding=(0, 2))
    summary.add_column(no_wrap=True)
    summary.add_column(overflow="fold")
    summary.add_row("application", status.app)
    summary.add_row("state", status.state)
    if status.past_runs:
        last = status.past_runs[-1].done
        summary.add_row("generation", f"{status.generation} (rerun {len(status.past_runs)} "
                        f"time(s); the last finished {_ago(now, last.at)} by "
                        f"{last.master or '?'}: {last.results:,} results, "
                        f"{last.dead_letters:,} dead-lettered)")
    summary.add_row("leader", _master(status.leader) if status.leader else "(none)")
    for doc in status.standbys:
        summary.add_row("standby", _master(doc))
    if status.duties:
        holder = status.duty_holder
        summary.add_row("duties", (
            "no worker holds them" if holder is None else
            f"{holder} (deferred: the leading master does them)"
            if status.duties[holder] == "deferred" else
            f"{holder} (moves delayed tasks, fires schedules, applies retention)"))
    summary.add_row("queue depth", str(status.queue_depth))
    if set(status.queues) - {"default"}:  # named queues: the depth of each
        summary.add_row("queues", ", ".join(f"{name} {depth}"
                                            for name, depth in status.queues.items()))
    summary.add_row("running", str(len(status.running)))
    summary.add_row("results", str(status.results))
    summary.add_row("dead letters", str(status.dead_letters))
    if status.types_without_worker:
        summary.add_row("types with no worker",
                        f"{', '.join(status.types_without_worker)} (their tasks wait in the "
                        "queue until a worker that has them runs)")
    if status.queues_without_worker:
        summary.add_row("queues no worker serves",
                        f"{', '.join(status.queues_without_worker)} (their tasks wait until "
                        "a worker serving them runs: framework run ... -Q)")
    return summary


def _workers(status: AppStatus, now: float) -> Table:
    """One row per live worker."""
    workers = _table("workers", "name", "address", "state", "load", "done", "failed",
                     "shards", "duties", "health", "changed")
    for name, member in sorted(status.workers.items()):
        workers.add_row(
            name, member.address or "", member.state.value, f"{member.load:.0%}",
            str(member.done), str(member.failed), ",".join(member.shards) or "-",
            status.duties.get(name, "-"),
            "ok" if member.health.get("ok", True) else json.dumps(member.health),
            _ago(now, member.at),
        )
    return workers


def render_dead_letters(app: str, letters: list[Any]) -> Table:
    """``framework dead APP list``: key, attempts, error and name of each dead letter."""
    table = _table(f"dead letters of {app}", "key", "attempts", "error", "name")
    for d in letters:
        name = d.name + (f" (and {len(d.older)} older, superseded)" if d.older else "")
        table.add_row(str(d.key), str(d.attempts), str(d.error or "-"), name)
    return table


# ---------------------------------------------------------------- inspect


def _when(at: float | None, now: float) -> str:
    """``2026-11-28 17:30:05Z (in 12s)``: UTC, and how far from now."""
    if not at:
        return "-"
    stamp = time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(at))
    delta = at - now
    return f"{stamp} (in {_span(delta)})" if delta >= 0 else f"{stamp} ({_span(-delta)} ago)"


def _span(seconds: float) -> str:
    """``42s``, ``7m``, ``5.2h``, ``3.1d``."""
    if seconds < 90:
        return f"{seconds:.0f}s"
    if seconds < 5400:
        return f"{seconds / 60:.0f}m"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86400:.1f}d"


def render_active(tasks: list[ActiveTask]) -> Any:
    if not tasks:
        return "No task is running."
    now = time.time()
    table = _table(f"active tasks ({len(tasks)})", "task", "type", "queue", "worker",
                   "attempt", "progress", "started")
    for t in tasks:
        progress = "-" if t.done is None else (
            f"{t.done:g}/{t.total:g}" if t.total else f"{t.done:g}")
        if t.message:
            progress = f"{progress} {t.message}"
        table.add_row(t.task_id, t.type, t.queue, t.worker, str(t.attempt), progress,
                      f"{now - t.started:.0f}s ago" if t.started else "-")
    return table


def render_delayed(report: DelayedReport) -> Any:
    if not report.total:
        return "No delayed task."
    now = time.time()
    more = f", {report.total - len(report.tasks)} more not shown" \
        if report.total > len(report.tasks) else ""
    table = _table(f"delayed tasks ({report.total}{more})", "task", "type", "queue",
                   "due (UTC)", "priority")
    for t in report.tasks:
        table.add_row(t.task_id, t.type, t.queue, _when(t.due, now), str(t.priority))
    return table


def render_schedules(states: list[ScheduleState]) -> Any:
    if not states:
        return "No periodic schedule has fired (none recorded under schedules/)."
    now = time.time()
    table = _table("schedules", "schedule", "task", "every", "last slot (UTC)", "fires",
                   "next fire (UTC)")
    for s in states:
        table.add_row(s.name, s.task or "-", s.every or "-", _when(s.last_slot, now),
                      str(s.fires),
                      _when(s.next_fire, now) if s.next_fire else "- (give --schedules)")
    return table


def render_types(rows: list[TypeRow]) -> Any:
    if not rows:
        return "No task type registered (no worker of this app has started yet)."
    table = _table("task types", "type", "queue", "priority", "max attempts", "time limit",
                   "rate limit", "running workers")
    for r in rows:
        table.add_row(r.name, r.queue or "-", _text(r.priority), _text(r.max_attempts),
                      _text(r.time_limit), r.rate_limit or "-",
                      ", ".join(r.workers) or "(none: its tasks wait)")
    return table


def render_queues(reports: list[QueueReport]) -> Any:
    """The table of every queue (depth, claims, the workers serving it), then each
    non-empty queue's lanes and types."""
    from rich.console import Group

    table = _table("queues", "queue", "queued", "claimed", "waiting", "buckets",
                   "served by")
    for report in reports:
        waiting = None if report.claimed is None else max(report.queued - report.claimed, 0)
        table.add_row(report.name, str(report.queued), _text(report.claimed),
                      _text(waiting), str(report.buckets),
                      ", ".join(report.workers) or "(no running worker: its tasks wait)")
    parts: list[Any] = [table]
    for report in reports:
        parts.extend(_queue_details(report, titled=len(reports) > 1))
    return Group(*parts)


def _queue_details(report: QueueReport, *, titled: bool) -> list[Any]:
    """A queue's items per priority lane and per task type (of its first sampled)."""
    of_queue = f" ({report.name})" if titled else ""
    parts: list[Any] = []
    if report.lanes:
        lanes = _table(f"by priority lane{of_queue}", "priority", "items")
        lanes.caption = "lower is taken first"
        for priority, count in report.lanes.items():
            lanes.add_row(f"{priority:+d}", str(count))
        parts.append(lanes)
    if report.types:
        of = f" of the first {report.sampled}" if report.sampled < report.queued else ""
        types = _table(f"by task type{of}{of_queue}", "type", "items")
        for name, count in report.types.items():
            types.add_row(name, str(count))
        parts.append(types)
    return parts


def _text(value: Any) -> str:
    return "-" if value is None else (f"{value:g}" if isinstance(value, float) else str(value))
