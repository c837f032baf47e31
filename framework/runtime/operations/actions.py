"""Operations on one app's records: look up a result, requeue or discard a dead letter;
and its lifecycle: is it known, purge (after telling its processes to leave), resume a
cancelled app, rerun a finished job as a new generation.

Used by :class:`~framework.runtime.Client` (and so the ``framework`` commands) and by the
dashboard, whose only requests on a viewer's behalf are the dead-letter ones, one per click
(the live view itself never reads ZooKeeper per viewer).

None of these hold a scope: on SUSPENDED a call waits for the connection (a read) or
raises :class:`~framework.errors.ConnectionLossError` (a write whose outcome is unknown:
each is safe to repeat); on LOST it raises :class:`~framework.errors.SessionExpiredError`.
"""

from __future__ import annotations

import functools
import time
from typing import Any

import attrs
import trio

from framework import errors, records
from framework.logs import get_logger
from framework.primitives.queue import WorkQueue, parse_item
from framework.runtime.app import DEFAULT_QUEUE, App, check_queue_name, ensure_result_buckets
from framework.runtime.records import CancelRecord, JobDone, PastRun, decode_or_none
from framework.runtime.results.result_index import mark_queued
from framework.runtime.tasks import Task, TaskResult
from framework.zk import Session, gather, validate_name

log = get_logger(__name__)


class ActionError(errors.FrameworkError):
    """A request refused (unknown dead letter, bad key...): told to the user or viewer."""


class UnknownApp(ActionError, errors.NoNodeError):
    """No such application; the message names the known ones."""


@attrs.frozen
class DeadLetterName:
    """A dead letter's node name: ``<bucket>.<item node>.<deliveries>``."""

    name: str
    priority: int

    @classmethod
    def parse(cls, name: str) -> DeadLetterName:
        flat, _, attempts = name.rpartition(".")
        bucket, _, node = flat.partition(".")
        entry = parse_item(bucket, node) if attempts.isdigit() else None
        if entry is None or "/" in name:
            raise ActionError(f"not a dead letter's name: {name!r}")
        return cls(name, entry.priority)


async def lookup_result(session: Session, app: str, key: str) -> dict[str, Any] | None:
    """The result record of task id (or idempotency key) ``key``; ``None`` if there is none."""
    try:
        validate_name("task key", key)
        path = App(app).result_path(key)
    except errors.ConfigurationError as exc:
        raise ActionError(str(exc)) from None
    try:
        data, _stat = await session.get(path)
    except errors.NoNodeError:
        return None
    try:
        return attrs.asdict(TaskResult.decode(data))
    except (ValueError, TypeError):
        return {"raw": data.decode(errors="replace")}


async def requeue(session: Session, app: str, name: str) -> str:
    """Put dead letter ``name`` back in its queue (the task's named queue, else the
    default one; with its priority and a fresh count of deliveries), then delete the dead
    letter at the version read.

    At-least-once: the put comes first, so a crash in between leaves the dead letter in
    place (requeued twice if clicked again); two items of one task id never run at once and
    a task with a successful result is not run again (the runtime's marker and idempotency
    key).  Returns the new item's name."""
    parsed = DeadLetterName.parse(name)
    application = _app(app)
    path = f"{application.dead}/{parsed.name}"
    try:
        data, stat = await session.get(path)
    except errors.NoNodeError:
        raise ActionError(f"no dead letter {name!r} in {app!r} (already requeued?)") from None
    try:
        task: Task | None = Task.decode(data)
    except (ValueError, TypeError):
        task = None  # not a task: nothing of it to keep, back into the default queue
    queue = task.queue if task is not None else None  # the queue it was taken from
    item = await WorkQueue(session, application.queue_path(queue)).put(
        data, priority=parsed.priority)
    if task is not None:  # its key's record (a success skips it) stays while it is queued
        await mark_queued(session, application, [(task.key, application.item_ref(queue, item))])
    try:
        await session.delete(path, version=stat.version)
    except (errors.NoNodeError, errors.BadVersionError):
        pass  # someone else requeued or discarded it meanwhile
    log.info("dashboard.requeued", app=app, dead_letter=name, item=item,
             queue=queue or DEFAULT_QUEUE)
    return item


async def discard(session: Session, app: str, name: str) -> None:
    """Delete dead letter ``name`` for good."""
    parsed = DeadLetterName.parse(name)
    try:
        await session.delete(f"{_app(app).dead}/{parsed.name}")
    except errors.NoNodeError:
        raise ActionError(f"no dead letter {name!r} in {app!r} (already gone?)") from None
    log.info("dashboard.discarded", app=app, dead_letter=name)


def _app(name: str) -> App:
    try:
        return App(name)
    except (errors.ConfigurationError, ValueError) as exc:
        raise ActionError(str(exc)) from None


# ------------------------------------------------------------------ lifecycle


async def known_apps(session: Session, root: str = "/apps") -> list[str]:
    """The applications under ``root``, sorted (one listing)."""
    try:
        return sorted(await session.children(root))
    except errors.NoNodeError:
        return []


async def require_app(session: Session, app: App, *, hint: str = "") -> None:
    """Return if ``app`` exists, else raise :class:`UnknownApp` naming the known apps (and
    ``hint``, what to do instead): one ``exists``, plus a listing when it is missing."""
    if await session.exists(app.base) is not None:
        return
    known = await known_apps(session, app.root)
    listed = f"known: {', '.join(known)}" if known else "there are none"
    raise UnknownApp(f"no application {app.name!r} in this ZooKeeper ({listed})"
                     + (f"; {hint}" if hint else ""))


async def processes(session: Session, app: App) -> tuple[int, int]:
    """How many masters (leader and standbys) and workers of ``app`` are alive."""
    counts = []
    for path in (app.masters, app.workers):
        try:
            counts.append(len(await session.children(path)))
        except errors.NoNodeError:
            counts.append(0)
    return counts[0], counts[1]


async def purge_queue(session: Session, app: App, queue: str, *, by: str = "") -> int:
    """Delete every task waiting in ``app``'s queue ``queue`` (``default`` or a named one),
    as Celery's ``purge -Q``; returns how many were deleted (0 for a queue never made).

    Refused (:class:`ActionError`, naming them) while a live worker serves the queue (its
    status document's ``queues``): with no such worker nothing holds a claim on its items,
    so no task being handled loses its acknowledgement.  A worker that starts serving it
    during the purge may lose the ack of a task it took meanwhile (its handler ran; the
    item is gone).  Its tasks' ``pending/`` markers stay (they name items that left the
    queue, as after an ack).  One listing per bucket, one delete per item (pipelined)."""
    name = check_queue_name(queue)
    serving = await _serving(session, app, name)
    if serving:
        raise ActionError(
            f"queue {name!r} of {app.name!r} is served by live worker(s) {', '.join(serving)}: "
            "stop them (or restart them without it in -Q) first")
    work = WorkQueue(session, app.queue_path(name))
    names = await work.item_names()
    deleted = [0]

    async def delete(item: str) -> None:
        try:
            await session.delete(f"{work.items_root}/{item}")
            deleted[0] += 1
        except errors.NoNodeError:
            pass  # taken meanwhile

    for start in range(0, len(names), 500):
        await gather(*[functools.partial(delete, n) for n in names[start:start + 500]])
    log.info("app.queue_purged", app=app.name, queue=name, deleted=deleted[0], by=by)
    return deleted[0]


@attrs.frozen
class _Serves:
    """The part of a worker's status document naming the queues it serves."""

    types: tuple[str, ...] = ()
    queues: tuple[str, ...] = (DEFAULT_QUEUE,)


async def _serving(session: Session, app: App, queue: str) -> list[str]:
    """The live workers that take tasks from ``queue`` (one listing, one read each)."""
    try:
        names = sorted(await session.children(app.workers))
    except errors.NoNodeError:
        return []
    serving = []
    for name in names:
        try:
            data, _stat = await session.get(f"{app.workers}/{name}")
        except errors.NoNodeError:
            continue
        doc = decode_or_none(data, _Serves, path=f"{app.workers}/{name}")
        if doc is not None and doc.types and queue in doc.queues:
            serving.append(name)
    return serving


async def wait_processes_gone(session: Session, app: App) -> None:
    """Return once ``app`` has no live master or worker (children watches on ``masters/``
    and ``workers/``, no polling); a lost connection is waited out, then looked at again."""
    while True:
        changed = trio.Event()
        try:
            alive = 0
            for path in (app.masters, app.workers):
                try:
                    alive += len(await session.children(path, watch=session.waker(changed)))
                except errors.NoNodeError:
                    pass
            if not alive:
                return
        except (errors.ConnectionLossError, errors.SessionExpiredError):
            await session.wait_connected()
            continue
        await changed.wait()


async def cancel(session: Session, app: App, *, by: str = "") -> bool:
    """Create ``app``'s cancel node (its masters and workers drain and leave); ``False`` if
    it already was cancelled.  :class:`UnknownApp` if there is no such app."""
    await require_app(session, app)
    try:
        await session.create(app.cancel, records.encode(CancelRecord(time.time(), by)))
    except errors.NodeExistsError:
        return False
    return True


async def purge(session: Session, app: App, *, force: bool = False,
                grace: float = 30.0, by: str = "") -> bool:
    """Delete ``app``'s whole subtree; ``False`` if there is none.

    With live masters or workers: refused (:class:`ActionError`) unless ``force``; then the
    app is cancelled first (its processes drain and leave: a live one would re-create its
    nodes), and the delete waits until none is left, for at most ``grace`` seconds (past
    it: :class:`ActionError`, nothing deleted, the cancel node stays)."""
    if await session.exists(app.base) is None:
        return False
    masters, workers = await processes(session, app)
    if masters or workers:
        if not force:
            raise ActionError(
                f"application {app.name!r} has {masters} master(s) and {workers} worker(s) "
                "alive: stop them first, or pass --force (they are told to leave first)"
            )
        told = await _tell_to_leave(session, app, by)
        log.info("app.purge_waiting", app=app.name, masters=masters, workers=workers,
                 cancelled_now=told)
        with trio.move_on_after(grace):
            await wait_processes_gone(session, app)
        masters, workers = await processes(session, app)
        if masters or workers:
            raise ActionError(
                f"application {app.name!r} still has {masters} master(s) and {workers} "
                f"worker(s) alive {grace:g}s after it was cancelled: nothing deleted (they "
                "drain their tasks first; purge again once they left, or give a longer "
                "--grace)"
            )
    await session.delete_tree(app.base)
    log.info("app.purged", app=app.name)
    return True


async def _tell_to_leave(session: Session, app: App, by: str) -> bool:
    try:
        await session.create(app.cancel, records.encode(CancelRecord(time.time(), by)))
    except errors.NodeExistsError:
        return False
    return True


async def resume(session: Session, app: App) -> CancelRecord | None:
    """Undo a cancel: delete ``app``'s cancel node; returns its record (``None``: the app
    was not cancelled).  Processes that left do not come back by themselves: start them
    again.  :class:`UnknownApp` if there is no such app."""
    await require_app(session, app)
    try:
        data, stat = await session.get(app.cancel)
    except errors.NoNodeError:
        return None
    try:
        await session.delete(app.cancel, version=stat.version)
    except errors.NoNodeError:
        return None  # resumed meanwhile by someone else
    except errors.BadVersionError:
        pass  # rewritten meanwhile: it is gone now all the same after a retry
    log.info("app.resumed", app=app.name)
    return decode_or_none(data, CancelRecord, path=app.cancel) or CancelRecord()


def history_path(app: App) -> str:
    """Where past generations of ``app``'s job are kept (:class:`PastRun` records)."""
    return app.history


async def rerun(session: Session, app: App, *, by: str = "") -> PastRun:
    """Start a new generation of ``app``'s finished job: the next master elected runs
    ``lead`` again.  Returns the generation that was kept in ``history/``.

    In order, each step safe to repeat (a rerun cut short is finished by running it again):
    the job-done record goes to ``history/g-<n>`` with when and by whom it was rerun; the
    previous generation's result records (and their time index), failure records and dead
    letters are deleted, so the job's keys run again (a success would be skipped) and its
    counts start from zero; then ``done`` is deleted.  Refused (:class:`ActionError`) if the
    job is not finished, or while the app is cancelled (``framework resume`` first);
    :class:`UnknownApp` if there is no such app.  Queued tasks are left alone."""
    await require_app(session, app)
    if await session.exists(app.cancel) is not None:
        raise ActionError(f"application {app.name!r} is cancelled: `framework resume "
                          f"{app.name}` first, then rerun it")
    try:
        data, _stat = await session.get(app.done)
    except errors.NoNodeError:
        raise ActionError(f"the job of {app.name!r} is not finished (no done record): "
                          "nothing to rerun") from None
    done = decode_or_none(data, JobDone, path=app.done) or JobDone()
    history = history_path(app)
    await session.ensure_path(history)
    past = await _kept_generation(session, history, done)
    if past is None:
        generation = len(await session.children(history)) + 1
        past = PastRun(generation, done, time.time(), by)
        await session.create(f"{history}/g-{generation:06d}", records.encode(past))
    for path in (app.results, app.results_log, app.failures, app.dead):
        await session.delete_tree(path)
    await session.ensure_path(app.failures)
    await session.ensure_path(app.dead)
    await ensure_result_buckets(session, app)  # workers' fast path expects them
    try:
        await session.delete(app.done)
    except errors.NoNodeError:
        pass
    log.info("app.rerun", app=app.name, generation=past.generation + 1, by=by)
    return past


async def _kept_generation(session: Session, history: str, done: JobDone) -> PastRun | None:
    """The history record of ``done``, if a rerun cut short already kept it."""
    names = sorted(await session.children(history))
    if not names:
        return None
    data, _stat = await session.get(f"{history}/{names[-1]}")
    past = decode_or_none(data, PastRun, path=f"{history}/{names[-1]}")
    return past if past is not None and past.done == done else None


