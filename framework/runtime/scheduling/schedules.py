"""Periodic jobs: interval and cron schedules fired by the elected master, with failover.

A master class lists its schedules; while it leads, :class:`Scheduler` fires them::

    class Boss(Master):
        schedules = [every(60, "report"), cron("0 3 * * *", "cleanup", {"days": 30})]

**Slots.** A schedule's fire times are its *slots*: multiples of ``seconds`` since the epoch
for :func:`every`, the times its expression matches (UTC) for :func:`cron`.  Slots are
integer nanoseconds since the epoch, computed exactly: ``seconds`` is taken as the decimal
written (``every(0.7)`` is 700,000,000 ns, not the binary float nearest 0.7), so the slot
after a slot is always the next one, however far from the epoch.  The task of slot ``s`` has
the id ``<schedule>-<s in whole milliseconds>`` (it is also its idempotency key); a period
is at least one millisecond, so slots' ids are distinct.

**Exactly one fire per slot, across failovers.**  ``schedules/<name>`` records the last slot
fired (:class:`ScheduleRecord`).  A fire is one fenced multi: the task's queue item is
created and the record set to the new slot at the version read (:meth:`WorkQueue.put` with
``also``).  So a deposed master fires nothing (the fence), two leaders never fire the same
slot (the version), and a crash before the multi leaves the slot unfired for the next
leader, after it leaves it fired.  A new leader reads the record and catches up the slots
it missed according to the schedule's :class:`CatchUp` policy: ``LATEST`` (default) fires
the latest missed slot once, ``ALL`` fires each missed slot in order (at most
``MAX_CATCH_UP``), ``SKIP`` fires none and waits for the next slot.  A schedule seen for the
first time starts at its next slot.

SUSPENDED: writes are fenced by the term, so a fire either commits in this term or not at
all.  LOST: the term ends, the scheduler is cancelled with it; the next leader resumes from
the records.  Timing: the scheduler sleeps until the earliest next slot (a timer, no
polling); a fire is queued a few milliseconds after its slot.
"""

from __future__ import annotations

import enum
import time
from datetime import UTC, datetime, timedelta
from fractions import Fraction
from typing import Any

import attrs
import trio
from cronsim import CronSim, CronSimError

from framework import errors, records
from framework.logs import get_logger
from framework.primitives.queue import WorkQueue
from framework.runtime.app import App, check_name
from framework.runtime.queues import QueueSet
from framework.runtime.tasks import new_task
from framework.zk import Session

log = get_logger("framework.runtime.scheduling.schedules")

#: Most missed slots ``CatchUp.ALL`` fires after a failover.
MAX_CATCH_UP = 1000

#: Nanoseconds per second: slots are integer nanoseconds since the epoch.
NS = 1_000_000_000

#: The shortest interval of :func:`every` (task ids name a slot in whole milliseconds).
MIN_PERIOD_NS = 1_000_000

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def period_ns(seconds: float) -> int:
    """``seconds`` as whole nanoseconds, exactly as written: ``0.7`` is 700,000,000 (the
    float's shortest decimal form, not its binary value)."""
    return round(Fraction(repr(float(seconds))) * NS)


def to_datetime(ns: int) -> datetime:
    """The UTC time of ``ns`` nanoseconds since the epoch (to the microsecond below)."""
    return _EPOCH + timedelta(microseconds=ns // 1000)


def from_datetime(when: datetime) -> int:
    """Nanoseconds since the epoch of ``when``, exactly (no float on the way)."""
    return (when - _EPOCH) // timedelta(microseconds=1) * 1000


class CatchUp(enum.Enum):
    """What a new leader does with the slots nobody fired while there was no leader."""

    LATEST = "latest"  # fire the latest missed slot once
    ALL = "all"        # fire every missed slot, in order (at most MAX_CATCH_UP)
    SKIP = "skip"      # fire none: wait for the next slot


@attrs.frozen
class Schedule:
    """A periodic job: task ``task`` with ``payload`` at each slot (see the module doc)."""

    name: str
    task: str
    payload: Any = None
    seconds: float | None = None
    cron: str | None = None
    catch_up: CatchUp = CatchUp.LATEST
    priority: int | None = None
    #: the queue its tasks go to (``None``: the task type's queue)
    queue: str | None = None
    #: ``seconds`` in whole nanoseconds (interval schedules; computed, never given)
    period_ns: int | None = attrs.field(init=False, default=None, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        check_name("schedule name", self.name)
        check_name("task name", self.task)
        if (self.seconds is None) == (self.cron is None):
            raise errors.ConfigurationError(f"schedule {self.name!r}: give seconds or cron")
        if self.seconds is not None and (isinstance(self.seconds, bool)
                                         or not self.seconds > 0):
            raise errors.ConfigurationError(
                f"schedule {self.name!r}: every() needs a positive number of seconds, got "
                f"{self.seconds!r}")
        if self.seconds is not None:
            period = period_ns(self.seconds)
            if period < MIN_PERIOD_NS:
                raise errors.ConfigurationError(
                    f"schedule {self.name!r}: every() needs at least 0.001 seconds, got "
                    f"{self.seconds!r}")
            object.__setattr__(self, "period_ns", period)
        if self.cron is not None:
            try:
                CronSim(self.cron, datetime.now(UTC))
            except CronSimError as exc:
                raise errors.ConfigurationError(
                    f"schedule {self.name!r}: bad cron expression {self.cron!r} ({exc})"
                ) from None
        # a payload that is not JSON, a bad queue name: refused now
        new_task(self.payload, name=self.task, queue=self.queue)

    def next_slot(self, after: int) -> int:
        """The first slot strictly after ``after`` (integer nanoseconds since the epoch)."""
        period = self.period_ns
        if period is not None:
            return (after // period + 1) * period
        assert self.cron is not None
        return from_datetime(next(CronSim(self.cron, to_datetime(after))))

    def slots(self, after: int, until: int, limit: int) -> list[int]:
        """The slots in ``(after, until]`` (nanoseconds), the last ``limit`` of them."""
        period = self.period_ns
        if period is not None:
            first, last = after // period + 1, until // period
            return [k * period for k in range(max(first, last - limit + 1), last + 1)]
        found: list[int] = []
        slot = self.next_slot(after)
        while slot <= until:
            found = [*found[-(limit - 1):], slot] if limit > 1 else [slot]
            slot = self.next_slot(slot)
        return found

    def task_id(self, slot: int) -> str:
        """The id (and idempotency key) of slot ``slot``'s task: whole milliseconds."""
        return f"{self.name}-{slot // 1_000_000}"


def every(seconds: float, task: str, payload: Any = None, *, name: str | None = None,
          catch_up: CatchUp = CatchUp.LATEST, priority: int | None = None,
          queue: str | None = None) -> Schedule:
    """Task ``task`` every ``seconds`` (slots at multiples of ``seconds`` since the epoch),
    into ``queue`` (default: the task type's)."""
    return Schedule(name or f"{task}-every-{seconds:g}s".replace(".", "_"), task, payload,
                    seconds=seconds, catch_up=catch_up, priority=priority, queue=queue)


def cron(expression: str, task: str, payload: Any = None, *, name: str | None = None,
         catch_up: CatchUp = CatchUp.LATEST, priority: int | None = None,
         queue: str | None = None) -> Schedule:
    """Task ``task`` at the times cron ``expression`` matches, in UTC (``"0 3 * * *"``),
    into ``queue`` (default: the task type's)."""
    return Schedule(name or task, task, payload, cron=expression, catch_up=catch_up,
                    priority=priority, queue=queue)


@attrs.frozen
class ScheduleRecord:
    """``schedules/<name>``: the last slot fired (or passed over) and how many fired.

    ``ns`` is the slot exactly (nanoseconds since the epoch); ``slot`` the same in seconds,
    for people and older readers (a float: never used to compute the next slot).  A record
    without ``ns`` (written before it existed) is read to the millisecond, which is what its
    task ids named."""

    slot: float = 0.0
    fires: int = 0
    ns: int | None = None

    @classmethod
    def at(cls, slot: int, fires: int = 0) -> ScheduleRecord:
        return cls(slot / NS, fires, slot)

    @property
    def slot_ns(self) -> int:
        if self.ns is not None:
            return self.ns
        return round(Fraction(repr(self.slot)) * 1000) * 1_000_000


class Scheduler:
    """Fires ``schedules`` for one term, into ``queue`` (fenced by that term), or a task
    of a named queue (its schedule's, else its type's) into that queue, fenced the same."""

    def __init__(self, session: Session, app: App, queue: WorkQueue,
                 schedules: list[Schedule], submitter: Any) -> None:
        names = [s.name for s in schedules]
        if len(set(names)) != len(names):
            raise errors.ConfigurationError(f"two schedules share a name: {sorted(names)}")
        self.session = session
        self.app = app
        self.queue = queue
        self.queues = QueueSet(app, queue)
        self.schedules = schedules
        self.submitter = submitter  # for the task types' default priorities
        self.fired = 0

    def path(self, schedule: Schedule) -> str:
        return f"{self.app.schedules}/{schedule.name}"

    async def run(self) -> None:
        """Fire every schedule at its slots until cancelled (the end of the term)."""
        if not self.schedules:
            return
        await self.session.ensure_path(self.app.schedules)
        async with trio.open_nursery() as nursery:
            for schedule in self.schedules:
                nursery.start_soon(self._follow, schedule)

    async def _follow(self, schedule: Schedule) -> None:
        while True:
            try:
                await self._fire_forever(schedule)
            except (errors.ConnectionLossError, errors.SessionExpiredError):
                await self.session.wait_connected()  # then read the record again

    async def _fire_forever(self, schedule: Schedule) -> None:
        record, version = await self._read(schedule)
        while True:
            now = time.time_ns()
            missed = schedule.slots(record.slot_ns, now, MAX_CATCH_UP)
            if missed and schedule.catch_up is CatchUp.SKIP:
                record, version = await self._pass_over(schedule, record, version, missed[-1])
                missed = []
            elif missed and schedule.catch_up is CatchUp.LATEST:
                missed = missed[-1:]
            for slot in missed:
                record, version = await self._fire(schedule, record, version, slot)
            slot = schedule.next_slot(max(record.slot_ns, now))
            await trio.sleep(max(0, slot - time.time_ns()) / NS)
            record, version = await self._fire(schedule, record, version, slot)

    async def _read(self, schedule: Schedule) -> tuple[ScheduleRecord, int]:
        """The schedule's record and version; a new schedule starts at its next slot (its
        record is created with now as its last slot, at version 0)."""
        path = self.path(schedule)
        while True:
            try:
                data, stat = await self.session.get(path)
            except errors.NoNodeError:
                start = ScheduleRecord.at(time.time_ns())  # no slot before now is owed
                try:
                    await self.session.create(path, records.encode(start))
                except errors.NodeExistsError:
                    pass  # ours with its reply lost, or a predecessor's: read it
                continue
            try:
                return records.decode(data, ScheduleRecord), stat.version
            except records.CorruptRecord as exc:
                log.error("schedule.corrupt", schedule=schedule.name, error=str(exc))
                return ScheduleRecord.at(time.time_ns()), stat.version

    async def _fire(self, schedule: Schedule, record: ScheduleRecord, version: int,
                    slot: int) -> tuple[ScheduleRecord, int]:
        """Queue the task of ``slot`` and record the slot, in one fenced multi."""
        info = await self.submitter.catalog.check(schedule.task)
        task = new_task(schedule.payload, name=schedule.task, task_id=schedule.task_id(slot),
                        idempotency_key=schedule.task_id(slot),
                        queue=schedule.queue or info.queue)
        priority = schedule.priority if schedule.priority is not None else info.priority
        fired = ScheduleRecord.at(slot, record.fires + 1)
        path = self.path(schedule)
        try:
            await self.queues.get(task.queue).put(
                task.encode(), priority=priority,
                also=lambda txn: txn.set(path, records.encode(fired), version=version))
        except errors.TransactionFailedError as exc:
            # the record changed under us: only another leader can do that (never while
            # our fence holds), so read it again and go on from there
            log.warning("schedule.fire_refused", schedule=schedule.name, error=str(exc))
            return await self._read(schedule)
        self.fired += 1
        log.info("schedule.fired", schedule=schedule.name, task=task.id,
                 late=round((time.time_ns() - slot) / NS, 3))
        return fired, version + 1

    async def _pass_over(self, schedule: Schedule, record: ScheduleRecord, version: int,
                         slot: int) -> tuple[ScheduleRecord, int]:
        """Record ``slot`` as passed over without firing (``CatchUp.SKIP``), fenced."""
        passed = ScheduleRecord.at(slot, record.fires)
        try:
            txn = self.session.transaction()
            txn.set(self.path(schedule), records.encode(passed), version=version)
            if self.queue.fence is not None:
                txn.check(*self.queue.fence)
            await txn.commit()
        except errors.TransactionFailedError:
            return await self._read(schedule)
        log.info("schedule.skipped", schedule=schedule.name, until=slot / NS)
        return passed, version + 1
