"""Delayed tasks: submitted now, queued at their time (``countdown=`` / ``eta=``).

A delayed task waits in ``delayed/<minute>/<due ms>-<guid>`` (its :class:`DelayedRecord`),
``minute`` being its due time's minute since the epoch.  The active master's
:class:`DelayedMover` queues each one at its due time: it watches the children of
``delayed/`` (a new minute) and of the earliest minute only, and sleeps until the earliest
due time or the next change, whichever comes first (a timer, no polling).  A task is moved
in one fenced multi that creates its queue item and deletes its delayed node
(:meth:`WorkQueue.put` with ``also``), so it is queued exactly once, by the leader only,
and a new leader (after a crash or a lost session) moves what is due at once: nothing is
lost on a failover, only delayed by the time the election takes.

Lost replies: the delayed node's name carries a GUID chosen before the create, so a retried
create that finds the node knows it is its own.  SUSPENDED: the mover's writes are fenced
by the term (a deposed master's move is refused); LOST: its term ends and the next leader
moves on.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import attrs
import trio

from framework import errors, records
from framework.logs import get_logger
from framework.primitives.queue import WorkQueue
from framework.runtime.app import App
from framework.runtime.queues import QueueSet, mark_unrouted
from framework.runtime.results.result_index import mark_queued
from framework.runtime.tasks import Task
from framework.zk import Session, Transaction

log = get_logger("framework.runtime.scheduling.delayed")

#: Seconds of one ``delayed/`` bucket.
BUCKET_SECONDS = 60

#: Tasks moved before the mover looks at its watches again.
MOVES_PER_ROUND = 200


@attrs.frozen
class DelayedRecord:
    """A task to queue at ``due`` (seconds since the epoch) with ``priority``;
    ``explicit``: its id or key was given (its queue item is then marked for retention);
    ``unrouted``: submitted while the app's catalog listed no type and without ``queue=``,
    so its queue is found when it is due (see :meth:`DelayedMover._route`)."""

    task: Task
    priority: int = 0
    due: float = 0.0
    explicit: bool = False
    unrouted: bool = False


def bucket_of(due: float) -> str:
    return f"{int(due // BUCKET_SECONDS):010d}"


def due_of(name: str) -> float:
    """The due time (seconds) in a delayed node's name (``<due ms>-<guid>``)."""
    return int(name.split("-", 1)[0]) / 1000.0


async def delay(session: Session, app: App, task: Task, priority: int, due: float, *,
                explicit: bool = False, unrouted: bool = False) -> str:
    """Record ``task`` to be queued at ``due``; returns its node's path."""
    bucket = f"{app.delayed}/{bucket_of(due)}"
    path = f"{bucket}/{int(due * 1000):013d}-{uuid.uuid4().hex}"
    data = records.encode(DelayedRecord(task, priority, due, explicit, unrouted))
    while True:
        try:
            await session.create(path, data, makepath=True)
            return path
        except errors.NodeExistsError:
            return path  # our create, applied with its reply lost (the name is ours alone)
        except errors.ConnectionLossError:
            await session.wait_connected()


class DelayedMover:
    """The leader's mover of due tasks into ``queue`` (fenced by the term the queue is), or
    for a task of a named queue into that queue (made like ``queue``: fenced the same)."""

    def __init__(self, session: Session, app: App, queue: WorkQueue) -> None:
        self.session = session
        self.app = app
        self.queue = queue
        self.queues = QueueSet(app, queue)
        self.moved = 0
        self.latest_lateness: float | None = None  # seconds after its time the last one

    async def run(self) -> None:
        """Move due tasks until cancelled (the end of the term)."""
        session = self.session
        await session.ensure_path(self.app.delayed)
        while True:
            changed = trio.Event()
            try:
                buckets = sorted(await session.children(self.app.delayed,
                                                        watch=session.waker(changed)))
                waiting: float | None = None
                for bucket in buckets:
                    path = f"{self.app.delayed}/{bucket}"
                    names = sorted(await session.children(path, watch=session.waker(changed)))
                    if not names:
                        await self._drop_bucket(path)
                        continue
                    now = time.time()
                    due = [n for n in names if due_of(n) <= now][:MOVES_PER_ROUND]
                    for name in due:
                        await self._move(f"{path}/{name}")
                    if due:
                        changed.set()  # look again at once: more may be due
                    else:
                        waiting = due_of(names[0]) - now
                    break  # only the earliest non-empty bucket is watched
            except (errors.ConnectionLossError, errors.SessionExpiredError):
                await session.wait_connected()
                continue
            with trio.move_on_after(waiting if waiting is not None else float("inf")):
                await changed.wait()

    async def _drop_bucket(self, path: str) -> None:
        try:
            await self.session.delete(path)
        except (errors.NotEmptyError, errors.NoNodeError):
            pass  # a task arrived meanwhile (the next look sees it), or already gone

    async def _move(self, path: str) -> None:
        try:
            data, stat = await self.session.get(path)
        except errors.NoNodeError:
            return
        try:
            record = records.decode(data, DelayedRecord)
        except records.CorruptRecord as exc:
            log.error("delayed.corrupt", path=path, error=str(exc))
            await self.session.delete(path, version=stat.version, missing_ok=True)
            return
        try:
            record, mark = await self._route(record)
            queue = self.queues.get(record.task.queue)

            def also(txn: Transaction) -> None:
                txn.delete(path, version=stat.version)
                if mark is not None:
                    mark_unrouted(txn, self.app, record.task, exists=mark)

            item = await queue.put(record.task.encode(), priority=record.priority, also=also)
        except errors.TransactionFailedError as exc:
            # our delete refused: the node changed or went (another mover: never, fenced)
            log.warning("delayed.move_refused", path=path, error=str(exc))
            return
        if record.explicit:
            await mark_queued(self.session, self.app,
                              [(record.task.key, self.app.item_ref(record.task.queue, item))])
        self.moved += 1
        self.latest_lateness = time.time() - record.due
        log.info("delayed.queued", task=record.task.id, name=record.task.name,
                 queue=record.task.queue_name, late=round(self.latest_lateness, 3))


    async def _route(self, record: DelayedRecord) -> tuple[DelayedRecord, bool | None]:
        """An unrouted task's record with its type's queue, now that it is due, and whether
        its ``unrouted/`` marker is to be made (``None``: no; ``False``: created; ``True``:
        set, it exists): while the catalog still lists no type, it goes to the default queue
        marked, as a submit does, for the router to move once the type is known."""
        if not record.unrouted or record.task.queue is not None:
            return record, None
        task = await self.queues.routed(record.task)
        if task.queue is not None or await self.queues.listed(task.name):
            return attrs.evolve(record, task=task, unrouted=False), None
        await self.session.ensure_path(self.app.unrouted)
        exists = await self.session.exists(self.app.unrouted_path(task.id)) is not None
        return record, exists


def due_time(countdown: Any = None, eta: Any = None) -> float | None:
    """The due time of a submission (seconds since the epoch), or ``None`` for now.
    ``countdown``: seconds from now; ``eta``: seconds since the epoch or a timezone-aware
    ``datetime``.  :class:`~framework.errors.ConfigurationError` for anything else."""
    if countdown is not None and eta is not None:
        raise errors.ConfigurationError("give countdown or eta, not both")
    if countdown is not None:
        if isinstance(countdown, bool) or not isinstance(countdown, (int, float)) \
                or not countdown >= 0:
            raise errors.ConfigurationError(
                f"countdown must be a number of seconds >= 0, got {countdown!r}")
        return time.time() + countdown
    if eta is None:
        return None
    if hasattr(eta, "timestamp"):
        if getattr(eta, "tzinfo", None) is None:
            raise errors.ConfigurationError(
                "eta must be a timezone-aware datetime (datetime.now(timezone.utc) + ...)")
        return float(eta.timestamp())
    if isinstance(eta, bool) or not isinstance(eta, (int, float)) or eta != eta:
        raise errors.ConfigurationError(
            f"eta must be seconds since the epoch or an aware datetime, got {eta!r}")
    return float(eta)
