"""The pull-mode part of a worker: take tasks from the app's queue and run its handler.

:class:`TaskConsumer` runs ``concurrency`` slots.  Each slot claims a task (at-least-once:
an item is deleted only after the handler returned and its result was recorded, in the same
multi that acknowledges it), marks it ``running/<task id>`` (also the task id's mutual
exclusion), runs the handler within its time limit, and records a failure when it raises:
retried up to its type's ``max_attempts`` deliveries, then dead-lettered at once with the
handler's error (a :class:`~framework.errors.PermanentFailure` at once too).

Revocation: a claimed task is revocable from its claim on.  A revoke seen before its handler
starts - also during the waits in between (its stored payload's read, its type's rate-limit
token), checked again after them - acknowledges it as revoked without running it; a revoke
of a running task cancels its handler.  Either way the ``revoked/`` node goes with the ack.

Routing by type: a slot claims only tasks of the worker's own types (the queue's
``accept``); a task of another type is never claimed by this worker and no delivery is
counted - it waits in the queue for a worker that has its type (forever, if none ever runs:
``framework status`` names the app's types that no running worker has).  Idle workers
wait in the line of workers with the same types (``types_line``), so a put wakes the first
idle workers of each kind, and a worker without the type never stands in front of one with
it.  Each worker process reads a task of a type it lacks once and passes over it since.

Crash safety: a task's claim is an ephemeral node of the worker's session (kill -9 the worker
and the task goes back to the queue); a task whose key already has a successful record is
acknowledged without running again (idempotency key).  SUSPENDED: a running handler goes on
until the session's trust deadline, then its claim scope is cancelled (``ClaimLost``; the item
is delivered again).  LOST: the same, at once.

Graceful stop: waiting slots stop at once; in-flight tasks may finish for up to
``drain_timeout`` seconds, then they are cancelled (their items are redelivered).  A slot
whose claim lands just as the drain begins, before its handler starts, hands the item back
unstarted (its ``running/`` marker goes in the same transaction; no delivery is counted).
"""

from __future__ import annotations

import json
import time
import traceback
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import trio

from framework import errors, metrics
from framework.logs import get_logger
from framework.primitives.queue import ClaimExtras, Finisher, QueueItem, WorkQueue
from framework.retry import RetryPolicy
from framework.runtime import payloads
from framework.runtime.app import ensure_result_buckets
from framework.runtime.handlers import HandlerPool
from framework.runtime.markers import Marker, earlier_delivery_of, marker_owner
from framework.runtime.records import RunningRecord
from framework.runtime.result_index import SlotKeeper, entry_path, write_record
from framework.runtime.task_types import Catalog, TaskRules, type_info, types_line
from framework.runtime.tasks import DEFAULT_TASK, FAILURE_RING, Outcome, Task, TaskResult
from framework.zk import Session, cleanup_scope, validate_path, wait_gone, watch_children

if TYPE_CHECKING:
    from framework.runtime.worker import Worker

log = get_logger(__name__)

#: Longest error message kept in a failure record (a record must fit in one znode).
MAX_ERROR_CHARS = 4000

#: Most names of task types passed over (not this worker's) its status document lists.
MAX_PASSED_TYPES = 32

#: Longest traceback kept in a failure record (its end: the frames nearest the error).
MAX_TRACEBACK_CHARS = 8000


class _HandedBack(Exception):
    """A handler failed; its error is recorded and the item goes back to the queue."""


class _GivenUp(_HandedBack, errors.PermanentFailure):
    """A task failed for good (its result cannot be stored, or the handler said retrying
    cannot help): its failure is recorded and the queue dead-letters the item at once."""


class TaskConsumer:
    """The pull-mode part of ``worker`` (see the module doc): a :class:`Part` that drains.

    ``tasks_done``, ``tasks_failed``, ``in_flight`` and ``stuck_threads`` (handler threads
    abandoned at their time limit, still running) count this run's tasks."""

    drains = True

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.tasks_done = 0
        self.tasks_failed = 0
        self._in_flight = 0
        self._waiting: set[trio.CancelScope] = set()
        self._markers: dict[str, Marker] = {}  # running/ path -> this worker's marker
        self.handlers = HandlerPool(worker)  # where handlers run (threads, processes)
        self._slots: SlotKeeper | None = None  # the result index's slots written into
        self._revoked: frozenset[str] = frozenset()  # task ids under revoked/, as last seen
        self._revocable: dict[str, trio.CancelScope] = {}  # running task id -> its handler
        self._passed_types: dict[str, None] = {}  # types of tasks passed over, newest last

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def layout(self) -> Sequence[str]:
        app = self.worker.app
        return (app.tasks, app.running, app.results, app.failures, app.dead, app.revoked)

    async def prepare(self, session: Session) -> None:
        if self.worker.takes_tasks:
            await ensure_result_buckets(session, self.worker.app)  # before the first probe
            worker = self.worker
            await Catalog(session, worker.app).register({
                name: type_info(kind, max_attempts=worker.max_attempts,
                                time_limit=worker.time_limit)
                for name, kind in worker.task_types.items()
            })

    async def run(self, session: Session) -> None:
        """Run the slots until the worker drains (or only wait for that, if the worker
        takes no tasks)."""
        worker = self.worker
        if not worker.takes_tasks:
            await worker.stop_requested.wait()
            return
        self._slots = SlotKeeper(session, worker.app)
        queue = WorkQueue(session, worker.app.tasks, max_attempts=worker.most_attempts,
                          dead_letter=worker.app.dead, lease=worker.lease,
                          claim_with=self._claim_extras, accept=self._takes,
                          line=types_line(worker.task_types))
        async with self.handlers.open(), trio.open_nursery() as timer:
            # known before the first take
            await timer.start(self._follow_revoked, session, queue)
            timer.start_soon(self._slots.run)  # the result index's slots, made ahead
            async with trio.open_nursery() as slots:
                for _ in range(worker.concurrency):
                    slots.start_soon(self._slot, session, queue)
                # the timer lives outside the slots: a quick drain exits at once
                timer.start_soon(self._drain_deadline, slots.cancel_scope)
            timer.cancel_scope.cancel()

    def request_stop(self) -> None:
        """Waiting slots stop at once; running ones finish (see the module doc)."""
        for scope in list(self._waiting):
            scope.cancel()

    def status(self) -> dict[str, Any]:
        """The consumer's counts, the task types it takes (``types``) and those of tasks it
        passed over (``passed_types``, the last :data:`MAX_PASSED_TYPES`): ``framework
        status`` names the types no running worker has from them; and its
        :class:`~framework.metrics.TaskStats` (retried, dead-lettered, the duration
        histogram) for the dashboard to sum."""
        return {"types": sorted(self.worker.task_types), "passed_types": list(self._passed_types),
                "load": self._in_flight / max(self.worker.concurrency, 1),
                "in_flight": self._in_flight, "done": self.tasks_done,
                "failed": self.tasks_failed, "stuck_threads": self.handlers.stuck_threads,
                **metrics.task_stats(self).published()}

    async def _slot(self, session: Session, queue: WorkQueue) -> None:
        trouble = 0  # consecutive failures of the slot itself (not of handlers)
        while not self.worker.draining:
            if trouble:
                # a persistent problem (e.g. the app's znodes deleted under us) must not
                # turn into a busy loop: back off, exponentially, up to backoff_max
                await self.worker.backoff.sleep(trouble)
            marker: list[Marker] = []
            try:
                with trio.CancelScope() as slot:
                    # request_stop cancels only slots still waiting for an item
                    self._waiting.add(slot)
                    try:
                        async with queue.take() as item:
                            self._waiting.discard(slot)
                            # an exception leaving this block hands the item back
                            await self._handle_item(session, queue, item, marker)
                        await payloads.discard(item.data, self.worker)  # acknowledged
                        await self._after_ack(session, marker)
                        # the running/ marker outlives the ack or release, so an observer
                        # that sees no marker and an empty queue knows all is done
                    finally:
                        self._waiting.discard(slot)
                        await self._clear_running(session, marker)
                if slot.cancelled_caught:  # only ever cancelled while waiting
                    return
                trouble = 0
            except _HandedBack:
                trouble = 0  # the handler failed: logged, backed off, item handed back
            except errors.FrameworkError as exc:
                trouble += 1
                log.warning("task.released", worker=self.worker.name, error=str(exc), retry=trouble)
            except Exception:
                trouble += 1
                log.exception("worker.slot_error", worker=self.worker.name, retry=trouble)

    async def _mark_running(self, session: Session, running: str, task: Task,
                            item: QueueItem, marker: list[Marker]) -> None:
        """Create this delivery's ``running/<task id>`` marker; on return ``marker`` holds
        it.  The marker is also the task id's mutual exclusion: another live delivery of the
        same id (a resubmission, an at-least-once put) waits here until that one's marker is
        gone, without failing or using up a delivery.  A lost reply is recovered by the
        delivery token in the marker's data (our own marker is adopted); the marker of an
        earlier delivery of this same item is stale (that delivery lost its claim, its
        handler is stuck) and is taken over."""
        mine = self._new_marker(running, task, item)
        try:
            while True:
                try:
                    await session.create(running, mine.encode(), ephemeral=True)
                    marker.append(mine)
                    return
                except (errors.ConnectionLossError, errors.NodeExistsError):
                    pass  # ours, applied with its reply lost, or another delivery's
                owner = await marker_owner(session, running)
                if owner is None:
                    continue
                delivery, owner_session, version = owner
                if (delivery, owner_session) == (mine.delivery,
                                                 await session.wait_connected()):
                    mine.version = version
                    marker.append(mine)
                    return
                if earlier_delivery_of(delivery, item):
                    log.warning("task.stale_marker_taken_over", task=task.id,
                                worker=self.worker.name, other=delivery)
                    try:
                        await session.delete(running, version=version)
                    except (errors.BadVersionError, errors.NoNodeError):
                        pass
                    continue
                log.info("task.same_id_running", task=task.id, worker=self.worker.name,
                         other=delivery)
                await wait_gone(session, running)
        except BaseException:
            # interrupted while our create may have been applied: never leave an orphan
            # marker behind, it would hold up every later delivery of this task id
            with cleanup_scope(session):
                try:
                    owner = await marker_owner(session, running)
                    if owner is not None and owner[0] == mine.delivery:
                        await session.delete(running, version=owner[2])
                except errors.ZooKeeperError:
                    pass  # the session ended (so did its ephemeral marker), or not ours
            raise

    async def _clear_running(self, session: Session, marker: list[Marker]) -> None:
        """Delete our marker, and only ours: the node is read first and deleted at the
        version read only if it carries our delivery token (a later delivery that took
        over a stale marker of ours creates its own, also at version 0: a delete by
        version alone would remove it).  Only failure paths get here: a successful task's
        marker goes in its acknowledging transaction."""
        if marker:
            mine = marker[0]
            self._markers.pop(mine.path, None)
            if mine.finisher is not None and mine.finisher.applied:
                return  # deleted with the acknowledgement
            with cleanup_scope(session):
                try:
                    owner = await marker_owner(session, mine.path)
                    if owner is not None and owner[0] == mine.delivery:
                        await session.delete(mine.path, version=owner[2])
                except errors.ZooKeeperError:
                    pass  # not ours any more, or the session (and the marker) ended

    def _takes(self, item: QueueItem) -> bool:
        """Whether this worker takes ``item``: a task of one of its types, or a revoked one
        (acknowledged as revoked), or a malformed item (so that it fails where failures
        count).  Any other is never claimed: it waits for a worker that has its type (see
        the module doc)."""
        try:
            doc = json.loads(item.data)  # a quarter of a record's decode
            name = doc.get("name", DEFAULT_TASK)
            if name in self.worker.task_types or not isinstance(name, str) \
                    or doc.get("id") in self._revoked:  # taken to be acknowledged as revoked
                return True
        except (ValueError, AttributeError, TypeError):
            return True
        if name not in self._passed_types:  # published: status names types nobody has
            self._passed_types[name] = None
            if len(self._passed_types) > MAX_PASSED_TYPES:
                del self._passed_types[next(iter(self._passed_types))]
            self.worker.status_changed()
        return False

    def _claim_extras(self, item: QueueItem) -> ClaimExtras | None:
        """What a task's claim commits with it: the delivery's ``running/`` marker, and
        a probe that the task has no result record (created and deleted again in the same
        transaction: refused if one exists).  Refused (another delivery of the same id
        runs, an earlier one's marker is left, a record exists), the task is claimed
        alone and :meth:`_handle_item` takes the slow path (marker, then record read)."""
        try:
            task = Task.decode(item.data, item.attempts)
            running = f"{self.worker.app.running}/{task.id}"
            record = self.worker.app.result_path(task.key)
            validate_path(running)
            validate_path(record)
        except Exception:
            return None  # a malformed task: the slow path fails it where failures count
        mine = self._new_marker(running, task, item)

        def build(txn: Any) -> None:
            txn.create(running, mine.encode(), ephemeral=True)
            txn.create(record, b"").delete(record)

        def undo(txn: Any) -> None:
            txn.delete(running, version=0)

        return ClaimExtras(build, undo, (task, mine))

    def _new_marker(self, running: str, task: Task, item: QueueItem) -> Marker:
        return Marker(running, RunningRecord(f"{self.worker.name}/{item.name}/{item.attempts}",
                                             self.worker.name, time.time(), task.attempts))

    async def _handle_item(self, session: Session, queue: WorkQueue, item: QueueItem,
                           marker: list[Marker]) -> None:
        """Run one delivery.  ``item.attempts`` counts deliveries, this one included."""
        previous_version: int | None = None  # the result record's version, if one exists
        if item.extras is not None:
            # claimed with its marker, and no result record existed then
            task, mine = item.extras.payload
            marker.append(mine)
            running = mine.path
        else:
            task = Task.decode(item.data, item.attempts)
            running = f"{self.worker.app.running}/{task.id}"
        rules = self.worker.rules_for(task.name)
        limit = task.time_limit or (rules.time_limit if rules else self.worker.time_limit)
        stuck_after = limit + (rules.backoff if rules else self.worker.backoff).cap + 1.0 \
            if limit else None
        if stuck_after:
            # past its limit (and the retry backoff) a handler that did not stop is stuck:
            # stop renewing the claim's lease, so the task goes to another worker
            queue.renew_for(item, stuck_after)
        if item.extras is None:
            await self._mark_running(session, running, task, item, marker)
        self._markers[running] = marker[0]
        record = self.worker.app.result_path(task.key)
        if item.extras is None:
            try:
                data, stat = await session.get(record)
                previous = TaskResult.decode(data)
                if previous.ok:
                    log.info("task.duplicate_skipped", task=task.id, key=task.key,
                             done_by=previous.worker)
                    return
                previous_version = stat.version
            except errors.NoNodeError:
                pass
        if rules is None and task.id in self._revoked:  # a type we lack, taken to end it
            await self._finish(session, queue, item, task, marker, previous_version,
                               self._revoked_result(task, time.time()), revoked=True)
            return
        refusal = self._refusal(task, rules)
        if refusal is not None:
            await self._failed(session, task, refusal, time.time(), rules)
            raise _GivenUp() from refusal
        assert rules is not None
        # revocable from here on: a revoke seen now, during the waits before the handler
        # (its stored payload, its rate-limit token) or while it runs cancels this scope;
        # the task is then acknowledged as revoked and its handler never starts
        revocable = self._revocable[task.id] = trio.CancelScope()
        if task.id in self._revoked:
            revocable.cancel()
        started = time.time()
        in_handler = False
        value: Any = None
        try:
            with revocable:
                task = await self._before_handler(task, rules)
                if revocable.cancel_called:  # revoked during a wait that ran to its end
                    await trio.lowlevel.checkpoint()  # raises Cancelled, caught by revocable
                if stuck_after:
                    queue.renew_for(item, stuck_after)
                in_handler = True
                self._in_flight += 1
                self.worker.status_changed()
                metrics.task_started(self.worker.app.name)
                started = time.time()
                value = await self.handlers.call_within(task, rules.kind, limit)
        except Exception as exc:
            if not in_handler and not isinstance(exc, errors.PermanentFailure):
                raise  # the payload store failed: the slot backs off, the item comes back
            final = await self._failed(session, task, exc, started if in_handler else time.time(),
                                       rules)
            # leaving take() with an error hands the item back, or - its type's attempts
            # used up, or a permanent failure - buries it at once: the queue's own limit is
            # the largest of the worker's types, and a delivery past the type's own would
            # only record "delivered too often" over the real error
            raise (_GivenUp() if final else _HandedBack()) from exc
        finally:
            self._revocable.pop(task.id, None)
            if in_handler:
                self._in_flight -= 1
                self.worker.status_changed()
                metrics.task_ended(self.worker.app.name)
        if revocable.cancelled_caught:
            await self._finish(session, queue, item, task, marker, previous_version,
                               self._revoked_result(task, started), revoked=True)
            return
        result = TaskResult(task.id, True, self.worker.name, task.attempts, value,
                            started_at=started, key=task.key)
        try:
            await self._finish(session, queue, item, task, marker, previous_version, result)
        except errors.PermanentFailure as exc:
            await self._failed(session, task, exc, started, rules)
            raise _GivenUp() from None
        self.tasks_done += 1
        metrics.task_finished(self.worker.app.name, True, time.time() - started, owner=self)
        self.worker.status_changed()  # publish the count (the last one came before _finish)
        log.info("task.done", task=task.id, worker=self.worker.name, attempt=task.attempts,
                 seconds=round(time.time() - started, 3))

    async def _before_handler(self, task: Task, rules: TaskRules) -> Task:
        """The waits between a claim and its handler: the stored payload read back (off
        ZooKeeper), then the type's rate-limit token (the claim is held and renewed
        meanwhile).  Both run in the task's revocable scope."""
        if task.payload_ref is not None:
            task = await payloads.resolve(task, self.worker)
        if rules.limiter is not None:
            await rules.limiter.acquire()
        return task

    def _revoked_result(self, task: Task, started: float) -> TaskResult:
        log.info("task.revoked", task=task.id, worker=self.worker.name, attempt=task.attempts)
        return TaskResult(task.id, False, self.worker.name, task.attempts, None, "revoked",
                          started_at=started, key=task.key, outcome=Outcome.REVOKED)

    async def _finish(self, session: Session, queue: WorkQueue, item: QueueItem, task: Task,
                      marker: list[Marker], previous_version: int | None,
                      result: TaskResult, *, revoked: bool = False) -> None:
        """Acknowledge ``item`` with ``result`` recorded (:class:`PermanentFailure`, before
        anything is written, if the result cannot be stored); a ``revoked`` task's
        ``revoked/`` node goes in the same multi."""
        encoded = result.encode()
        record = self.worker.app.result_path(task.key)
        # the result is written in the transaction that acknowledges the item (and deletes
        # our marker), combined with the other slots' acks, with its entry in the time
        # index when it is created; if the server refuses the record's part (a record
        # written meanwhile, a slot deleted), it is written alone before the ack
        mine = marker[0]
        slots = self._slots
        assert slots is not None
        slot = slots.current(time.time())

        def build(txn: Any) -> None:
            if previous_version is None:
                txn.create(record, encoded)
                txn.create(entry_path(self.worker.app, slot, task.key))
            else:
                txn.set(record, encoded, version=previous_version)
            txn.delete(mine.path, version=mine.version)
            if revoked:
                txn.delete(f"{self.worker.app.revoked}/{task.id}")

        async def fallback() -> None:
            await slots.made(slot)  # a refused entry's slot may be missing: made first
            await write_record(session, self.worker.app, task.key, encoded, slot)
            if revoked:  # its revoked/ node goes once the item is acknowledged alone
                mine.after_ack = f"{self.worker.app.revoked}/{task.id}"

        finisher = Finisher(build, fallback)
        queue.finish_with(item, finisher)
        mine.finisher = finisher

    async def _after_ack(self, session: Session, marker: list[Marker]) -> None:
        """What an acknowledgement made alone (its finisher's fallback ran) still owes:
        a revoked task's ``revoked/`` node (kept until the item left the queue, so a
        redelivery before that is still acknowledged as revoked, never run)."""
        if marker and marker[0].after_ack is not None:
            with cleanup_scope(session):
                try:
                    await session.delete(marker[0].after_ack, missing_ok=True)
                except errors.ZooKeeperError:
                    pass  # left behind: a resubmission of the id would find it revoked

    async def _follow_revoked(self, session: Session, queue: WorkQueue,
                              task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Keep :attr:`_revoked` current (one children watch on ``revoked/`` per worker, so a
        revoke costs each worker one listing and a task nothing) and cancel the handler of
        a revoked task this worker is running.  A new revoke also makes ``queue`` look
        again at the tasks it passed over: a revoked task of a type no worker has is taken
        by any worker, only to be acknowledged as revoked."""
        started = False
        async for snap in watch_children(session, self.worker.app.revoked):
            new = frozenset(snap.children) - self._revoked
            self._revoked = frozenset(snap.children)
            for task_id in self._revoked & set(self._revocable):
                self._revocable[task_id].cancel()
            if new:
                queue.reconsider()
            if not started:
                task_status.started()
                started = True

    def _refusal(self, task: Task, rules: TaskRules | None) -> errors.PermanentFailure | None:
        """Why this delivery must fail for good without running: more deliveries than its
        type allows (the queue buries items only past the largest ``max_attempts`` of the
        worker's types), or a task type this worker does not have (a safeguard: such a task
        is never claimed, see :meth:`_takes`)."""
        if rules is None:
            known = ", ".join(sorted(self.worker.task_types)) or "none"
            return errors.PermanentFailure(
                f"worker {self.worker.name} has no task type {task.name!r} (its task types: "
                f"{known})"
            )
        if task.attempts > rules.max_attempts:
            return errors.PermanentFailure(
                f"delivered {task.attempts} times, over the {rules.max_attempts} attempts of "
                f"task type {task.name!r}"
            )
        return None

    async def _failed(self, session: Session, task: Task, exc: Exception,
                      started: float, rules: TaskRules | None) -> bool:
        """Record a failed delivery (the failures ring; the result record too when it is
        final); hold the claim for the retry backoff when it is not.  Return whether it is
        final: the type's ``max_attempts`` reached, or a permanent failure."""
        ended = time.time()  # the record's time: not counting the traceback's formatting
        self.tasks_failed += 1
        if isinstance(exc, trio.TooSlowError):
            error = "time limit exceeded"
        elif isinstance(exc, errors.PermanentFailure):
            error = str(exc)
        else:
            error = f"{type(exc).__name__}: {exc}"
        if len(error) > MAX_ERROR_CHARS:
            error = error[:MAX_ERROR_CHARS] + f"... ({len(error):,} characters)"
        retry = rules.retry if rules else RetryPolicy(self.worker.max_attempts,
                                                      self.worker.backoff)
        final = retry.gives_up(task.attempts, exc)
        metrics.task_finished(self.worker.app.name, False, time.time() - started, final=final,
                              owner=self)
        trace = "".join(traceback.format_exception(exc))
        if len(trace) > MAX_TRACEBACK_CHARS:
            trace = f"... ({len(trace):,} characters)\n" + trace[-MAX_TRACEBACK_CHARS:]
        log.warning("task.failed", task=task.id, key=task.key, worker=self.worker.name, error=error,
                    attempt=task.attempts, final=final, exc_info=exc)
        result = TaskResult(task.id, False, self.worker.name, task.attempts, None, error,
                            started_at=started, finished_at=ended, key=task.key,
                            traceback=trace)
        with cleanup_scope(session):
            try:
                node = await session.create(f"{self.worker.app.failures}/f-", result.encode(),
                                            sequence=True)
                old = int(node[-10:]) - FAILURE_RING
                if old >= 0:
                    await session.delete(f"{self.worker.app.failures}/f-{old:010d}",
                                         missing_ok=True)
                if final:
                    assert self._slots is not None
                    slot = self._slots.current(ended)
                    await write_record(session, self.worker.app, task.key, result.encode(),
                                       slot)
            except errors.ZooKeeperError:
                pass
        if not final:
            # hold the claim for a while so the retry is delayed (exponential backoff)
            await retry.sleep(task.attempts)
        return final

    async def _drain_deadline(self, slots: trio.CancelScope) -> None:
        await self.worker.stop_requested.wait()
        await trio.sleep(self.worker.drain_timeout)
        log.warning("worker.drain_timeout", worker=self.worker.name, in_flight=self._in_flight)
        slots.cancel()

    async def report_progress(self, task: Task, done: float, total: float | None = None,
                              message: str = "") -> None:
        """Publish progress of a running task (shown by ``framework status``)."""
        assert self.worker.session is not None
        marker = self._markers.get(f"{self.worker.app.running}/{task.id}")
        if marker is None:
            raise errors.ConfigurationError(
                f"report_progress() for task {task.id!r}, which this worker is not running"
            )
        data = marker.progressed(done, total, message, time.time())
        try:
            stat = await self.worker.session.set(marker.path, data, version=marker.version)
        except (errors.BadVersionError, errors.NoNodeError):
            return  # the marker is no longer ours: this delivery lost its claim
        marker.version = stat.version
