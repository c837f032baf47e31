"""What ``framework inspect APP active|scheduled|delayed|types|queues`` shows (Celery's
``celery inspect active/scheduled/reserved``, RQ's ``rq info``), and what the dashboard's
scheduled view reads: read-only looks at one application, each with a stated cost in
ZooKeeper requests (``n`` = the nodes listed; reads of one kind are pipelined).

* :func:`active` - the tasks being handled now (``running/`` markers), their types and
  queues: one listing, one read per running task, and one read of the queue item its marker
  names (the type; ``?`` if the item is gone: acknowledged meanwhile) - in the default queue,
  then, for those not found there, in each named queue (one listing of ``queues/``).
* :func:`delayed_tasks` - tasks submitted with ``countdown``/``eta`` that are not due yet
  (``delayed/``): one listing of the minute buckets, one listing per bucket, one read per
  task shown (at most ``limit``; the others are counted, not read).
* :func:`schedule_states` - each periodic schedule's last slot and fire count
  (``schedules/``): one listing and one read per schedule.  A schedule's definition lives in
  the class that fires it (a Master's or an elected worker's ``schedules``), not in
  ZooKeeper: its next fire is computed only when that class is given.
* :func:`type_rows` - the app's task-type catalog (one read: each type's queue too) and which
  running workers take each type (one listing of ``workers/`` and one read per worker).
* :func:`queue_reports` - each of the app's queues (``default``, then the named queues: one
  listing of ``queues/``), each a :func:`queue_report`: its counts (the queue's own
  :func:`~framework.primitives.queue.queue_counts`), items per priority lane (one listing
  per bucket: names only), items per task type when ``sample`` allows (one read per item,
  the first ``sample`` items in the order workers take them; the rest are counted as not
  sampled), and the running workers serving it (their status documents' ``queues``: one
  listing of ``workers/`` and one read per worker, once for all queues).

Each answer is a snapshot: a task may start, finish or be moved meanwhile.  SUSPENDED: the
reads wait for the connection; LOST: they raise the session's error.  Nothing here writes.
"""

from __future__ import annotations

import functools
import time
from collections import Counter
from typing import Any

import attrs

from framework import errors, records
from framework.primitives.queue import WorkQueue, parse_item
from framework.runtime.app import DEFAULT_QUEUE, App
from framework.runtime.queues import queue_names
from framework.runtime.records import MemberState, RunningRecord, decode_or_none
from framework.runtime.scheduling.delayed import DelayedRecord, due_of
from framework.runtime.scheduling.schedules import NS, Schedule, ScheduleRecord
from framework.runtime.task_types import Catalog
from framework.runtime.tasks import Task
from framework.zk import Session, gather

#: Delayed tasks read (and shown) by default; the others are counted.
DELAYED_SHOWN = 100
#: Queue items read for the per-type counts by default.
TYPE_SAMPLE = 200


@attrs.frozen
class ActiveTask:
    """A task being handled now: where, which attempt, since when, its progress."""

    task_id: str
    worker: str
    attempt: int
    started: float
    type: str = "?"
    done: float | None = None
    total: float | None = None
    message: str | None = None
    queue: str = "?"  # the queue it was taken from ("?": its item is gone)


@attrs.frozen
class DelayedTask:
    """A task waiting for its time (``due``, seconds since the epoch)."""

    task_id: str
    type: str
    due: float
    priority: int
    queue: str = DEFAULT_QUEUE  # the queue it goes into when due


@attrs.frozen
class DelayedReport:
    """The first ``shown`` delayed tasks, soonest first, and how many there are."""

    tasks: list[DelayedTask]
    total: int


@attrs.frozen
class ScheduleState:
    """A periodic schedule as ZooKeeper records it: the last slot fired or passed over
    (seconds since the epoch), how many fired, and its next fire when its definition was
    given (else ``None``)."""

    name: str
    last_slot: float
    fires: int
    next_fire: float | None = None
    task: str | None = None
    every: str | None = None


@attrs.frozen
class TypeRow:
    """A task type of the catalog (or one a worker takes that the catalog lacks), its
    options, and the running workers that take it."""

    name: str
    priority: int | None
    max_attempts: int | None
    time_limit: float | None
    rate_limit: str | None
    workers: list[str]
    queue: str | None = None  # the queue its tasks go to (None: not in the catalog)


@attrs.frozen
class QueueReport:
    """One of the app's queues (``name``): items (claimed ones included), claimed items,
    buckets, items per priority lane, items per task type among the first ``sampled``
    (``None``: not sampled), and the running workers that serve it."""

    name: str
    queued: int
    claimed: int | None
    buckets: int
    lanes: dict[int, int]
    types: dict[str, int] | None
    sampled: int
    workers: list[str] = attrs.Factory(list)


async def _children(session: Session, path: str) -> list[str]:
    try:
        return sorted(await session.children(path))
    except errors.NoNodeError:
        return []


async def _read_all(session: Session, paths: list[str]) -> dict[str, bytes]:
    """The data of ``paths`` (pipelined; gone ones left out)."""
    found: dict[str, bytes] = {}

    async def read(path: str) -> None:
        try:
            found[path] = (await session.get(path))[0]
        except errors.NoNodeError:
            pass

    await gather(*[functools.partial(read, p) for p in paths])
    return found


async def active(session: Session, app: App) -> list[ActiveTask]:
    """The tasks being handled now, oldest first."""
    names = await _children(session, app.running)
    data = await _read_all(session, [f"{app.running}/{n}" for n in names])
    markers = {}
    for name in names:
        path = f"{app.running}/{name}"
        if path in data:  # else finished meanwhile
            markers[name] = (decode_or_none(data[path], RunningRecord, path=path)
                             or RunningRecord())
    types = await _types_of(session, app, {n: m.delivery for n, m in markers.items()})
    out = [ActiveTask(name, marker.worker or "?", marker.attempt, marker.started,
                      types[name][0] if name in types else "?", marker.done, marker.total,
                      marker.message, types[name][1] if name in types else "?")
           for name, marker in markers.items()]
    return sorted(out, key=lambda t: (t.started, t.task_id))


def item_of(delivery: str) -> str | None:
    """The queue item's name in a ``running/`` marker's delivery token
    (``worker/<bucket>/<item>/attempt``), or ``None``."""
    head, _, _attempt = delivery.rpartition("/")
    _worker, _, item = head.partition("/")
    return item or None


async def _types_of(session: Session, app: App,
                    deliveries: dict[str, str]) -> dict[str, tuple[str, str]]:
    """The task type and queue of each task id, read from the queue item its delivery names
    (a delivery token does not name the queue: the default one is read first, the named
    ones only for the items not found there)."""
    found: dict[str, tuple[str, str]] = {}
    items = {t: i for t, d in deliveries.items() if (i := item_of(d)) is not None}

    async def read(queue: WorkQueue, name: str, task_id: str, item: str) -> None:
        data = await queue.item_data(item)
        if data is None:
            return
        try:
            found[task_id] = (Task.decode(data).name, name)
        except records.CorruptRecord:
            pass

    names = [DEFAULT_QUEUE]
    for index, name in enumerate(names):
        queue = WorkQueue(session, app.queue_path(name))
        await gather(*[functools.partial(read, queue, name, t, i) for t, i in items.items()
                       if t not in found])
        if index == 0 and len(found) < len(items):
            names += (await queue_names(session, app))[1:]
    return found


async def delayed_tasks(session: Session, app: App, *,
                        limit: int = DELAYED_SHOWN) -> DelayedReport:
    """The delayed tasks, soonest first: the first ``limit`` read, all counted."""
    buckets = await _children(session, app.delayed)
    listings: dict[str, list[str]] = {}

    async def list_bucket(bucket: str) -> None:
        listings[bucket] = await _children(session, f"{app.delayed}/{bucket}")

    await gather(*[functools.partial(list_bucket, b) for b in buckets])
    names = sorted((due_of(n), f"{app.delayed}/{b}/{n}") for b in buckets
                   for n in listings.get(b, []))
    total = len(names)
    shown = [path for _due, path in names[:limit]]
    data = await _read_all(session, shown)
    tasks = []
    for path in shown:
        if path not in data:
            continue  # moved into the queue meanwhile
        record = decode_or_none(data[path], DelayedRecord, path=path)
        if record is not None:
            tasks.append(DelayedTask(record.task.id, record.task.name, record.due,
                                     record.priority, record.task.queue_name))
    return DelayedReport(tasks, total)


async def schedule_states(session: Session, app: App,
                          schedules: list[Schedule] | None = None) -> list[ScheduleState]:
    """Each schedule recorded under ``schedules/``, and each of ``schedules`` (the firing
    class's definitions) with its next fire (see :func:`schedule_rows`)."""
    names = await _children(session, app.schedules)
    data = await _read_all(session, [f"{app.schedules}/{n}" for n in names])
    found = {}
    for name in names:
        path = f"{app.schedules}/{name}"
        record = decode_or_none(data[path], ScheduleRecord, path=path) if path in data else None
        if record is not None:
            found[name] = record
    return schedule_rows(found, schedules or [], time.time_ns())


def schedule_rows(found: dict[str, ScheduleRecord], schedules: list[Schedule],
                  now_ns: int) -> list[ScheduleState]:
    """The schedules ``found`` under ``schedules/`` and those defined (``schedules``), by
    name; a defined one's next fire is the first slot after both its last slot and now, as
    the scheduler computes it (one never fired yet: its next slot after now)."""
    defined = {s.name: s for s in schedules}
    out = []
    for name in sorted(set(found) | set(defined)):
        record = found.get(name)
        last = record.slot_ns if record is not None else None
        schedule = defined.get(name)
        next_fire = (schedule.next_slot(max(last or now_ns, now_ns)) / NS
                     if schedule is not None else None)
        every = None
        if schedule is not None:
            every = (f"{schedule.seconds:.12g}s" if schedule.seconds is not None
                     else schedule.cron)
        out.append(ScheduleState(name, last / NS if last is not None else 0.0,
                                 record.fires if record is not None else 0, next_fire,
                                 schedule.task if schedule is not None else None, every))
    return out


@attrs.frozen
class _Takes:
    """The part of a worker's status document ``types`` and the queues' readers read (a
    worker written before named queues serves the default queue)."""

    state: MemberState = MemberState.UNKNOWN
    types: tuple[str, ...] = ()
    queues: tuple[str, ...] = (DEFAULT_QUEUE,)


async def _running_workers(session: Session, app: App) -> dict[str, _Takes]:
    """The running workers that take tasks, by name, with what they take."""
    workers = await _children(session, app.workers)
    docs = await _read_all(session, [f"{app.workers}/{w}" for w in workers])
    running = {}
    for worker in workers:
        path = f"{app.workers}/{worker}"
        doc = decode_or_none(docs[path], _Takes, path=path) if path in docs else None
        if doc is not None and doc.state is MemberState.RUNNING and doc.types:
            running[worker] = doc
    return running


async def type_rows(session: Session, app: App) -> list[TypeRow]:
    """The catalog's task types (and types a running worker takes that it lacks), with the
    running workers that take each."""
    catalog = await Catalog(session, app).read()
    takers: dict[str, list[str]] = {}
    for worker, doc in (await _running_workers(session, app)).items():
        for name in doc.types:
            takers.setdefault(name, []).append(worker)
    rows = []
    for name in sorted(set(catalog.types) | set(takers)):
        info = catalog.types.get(name)
        rows.append(TypeRow(name, info.priority if info else None,
                            info.max_attempts if info else None,
                            info.time_limit if info else None,
                            info.rate_limit if info else None, takers.get(name, []),
                            info.queue if info else None))
    return rows


async def queue_reports(session: Session, app: App, *,
                        sample: int = TYPE_SAMPLE) -> list[QueueReport]:
    """Each of the app's queues, ``default`` first (see the module doc), with the running
    workers serving it; ``sample=0`` reads no item."""
    names = await queue_names(session, app)
    running = await _running_workers(session, app)
    reports = []
    for name in names:
        report = await queue_report(session, app, sample=sample, queue=name)
        reports.append(attrs.evolve(report, workers=sorted(
            w for w, doc in running.items() if name in doc.queues)))
    return reports


async def queue_report(session: Session, app: App, *, sample: int = TYPE_SAMPLE,
                       queue: str = DEFAULT_QUEUE) -> QueueReport:
    """One of the app's queues (see the module doc; its ``workers`` left empty: see
    :func:`queue_reports`); ``sample=0`` reads no item."""
    work = WorkQueue(session, app.queue_path(queue))
    counts = await work.counts()
    names = await work.item_names()
    lanes: Counter[int] = Counter()
    for name in names:
        bucket, _, node = name.partition("/")
        entry = parse_item(bucket, node)
        if entry is not None:
            lanes[entry.priority] += 1
    types: Counter[str] | None = None
    sampled = 0
    if sample > 0:
        types = Counter()
        chosen = names[:sample]
        data: dict[str, bytes | None] = {}

        async def read(name: str) -> None:
            data[name] = await work.item_data(name)

        await gather(*[functools.partial(read, n) for n in chosen])
        for name in chosen:
            raw = data.get(name)
            if raw is None:
                continue  # acknowledged meanwhile
            try:
                types[Task.decode(raw).name] += 1
            except records.CorruptRecord:
                types["(unreadable)"] += 1
            sampled += 1
    return QueueReport(queue, counts.queued, counts.claimed, counts.buckets,
                       dict(sorted(lanes.items())),
                       dict(sorted(types.items())) if types is not None else None, sampled)


def unstructure(value: Any) -> Any:
    """A report as JSON values (for ``--json`` and the dashboard)."""
    return records.unstructure(value)
