"""The pull-mode part of a worker: take tasks from the app's queue and run its handler.

Options per task (the submit's, else its type's): a task past its ``expires`` time when a
slot takes it is acknowledged with outcome ``expired`` and never run; an ``async def``
handler gets :class:`~framework.runtime.worker_parts.soft_limit.SoftTimeLimitExceeded` at its
``soft_time_limit``; ``on_success`` / ``on_failure`` callbacks are written with the ack (or
the final failure) and queued right after it (:mod:`framework.runtime.workflows.callbacks`).

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

Named queues: the worker serves the queues it is told (``ConsumerSettings.queues``,
``("default",)`` unless told otherwise).  With one, a slot takes from it as before.  With
several, each slot races one take per queue (:meth:`TaskConsumer._race`): the first claim
admitted wins, the other takes are cancelled, and a take that had claimed meanwhile hands its
item back as never delivered (``WorkQueue.take(admit=...)``): a worker of concurrency C
runs at most C tasks at once, no lost race counts as an attempt, and nothing polls.  Cost:
one waiting take (a place in that queue's line) per served queue per idle slot; when several
served queues hold items at once, a race can claim in each and undo all claims but one (one
multi each).  Priorities hold within a queue; across queues no order is promised.

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

import itertools
import json
import time
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import trio

from framework import errors, metrics
from framework.logs import get_logger
from framework.primitives.queue import ClaimExtras, QueueItem, WorkQueue
from framework.runtime import payloads
from framework.runtime.app import ensure_result_buckets
from framework.runtime.queues import QueueSet
from framework.runtime.records import RunningRecord
from framework.runtime.results.result_index import SlotKeeper
from framework.runtime.task_types import Catalog, TaskRules, type_info, types_line
from framework.runtime.tasks import DEFAULT_TASK, Outcome, Task, TaskResult
from framework.runtime.worker_parts.delivery import (
    MAX_ERROR_CHARS,
    MAX_TRACEBACK_CHARS,
    ClaimedTask,
    ConsumerHost,
    ConsumerSettings,
    Delivery,
    DeliveryContext,
    error_text,
)
from framework.runtime.worker_parts.handlers import HandlerPool
from framework.runtime.worker_parts.markers import Marker, earlier_delivery_of, marker_owner
from framework.runtime.worker_parts.soft_limit import run_with_soft_limit
from framework.runtime.workflows import callbacks
from framework.zk import Session, cleanup_scope, validate_path, wait_gone, watch_children

log = get_logger(__name__)

__all__ = ["MAX_ERROR_CHARS", "MAX_PASSED_TYPES", "MAX_TRACEBACK_CHARS", "TaskConsumer"]

#: Most names of task types passed over (not this worker's) its status document lists.
MAX_PASSED_TYPES = 32


class _HandedBack(Exception):
    """A handler failed; its error is recorded and the item goes back to the queue."""


class _GivenUp(_HandedBack, errors.PermanentFailure):
    """A task failed for good (its result cannot be stored, or the handler said retrying
    cannot help): its failure is recorded and the queue dead-letters the item at once."""


@attrs.define
class _Race:
    """One race of a slot's takes (:meth:`TaskConsumer._race`): each take's cancel scope,
    the winner's, and the error the winner's delivery raised."""

    scopes: list[trio.CancelScope] = attrs.Factory(list)
    winner: trio.CancelScope | None = None
    error: Exception | None = None


class TaskConsumer:
    """The pull-mode part of ``worker`` (see the module doc): a :class:`Part` that drains.

    It reads the worker's settings once per run (:class:`ConsumerSettings`) and asks the
    worker only what :class:`ConsumerHost` says while running; its handlers run in the
    worker's :class:`HandlerPool`.  ``tasks_done``, ``tasks_failed``, ``in_flight`` and
    ``stuck_threads`` (handler threads abandoned at their time limit, still running) count
    this run's tasks."""

    drains = True

    def __init__(self, worker: ConsumerHost) -> None:
        #: the worker as its handler pool and payload store see it (``handle``, its class,
        #: ``payload_store``): only those two reach further into it
        self.worker: Any = worker
        self.host = worker
        self.settings = ConsumerSettings.of(worker)
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
        self._producer: QueueSet | None = None  # where callbacks go (made per run)
        self._races = itertools.count()  # races of takes run (rotates the first queue)

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def layout(self) -> Sequence[str]:
        app = self.settings.app
        return (app.tasks, *(app.queue_path(q) for q in self.settings.queues), app.running,
                app.results, app.failures, app.dead, app.revoked, callbacks.callbacks_path(app))

    async def prepare(self, session: Session) -> None:
        self.settings = settings = ConsumerSettings.of(self.worker)
        if settings.task_types:
            await ensure_result_buckets(session, settings.app)  # before the first probe
            await Catalog(session, settings.app).register({
                name: type_info(kind, max_attempts=settings.retry.max_attempts or 1,
                                time_limit=settings.time_limit)
                for name, kind in settings.task_types.items()
            })

    async def run(self, session: Session) -> None:
        """Run the slots until the worker drains (or only wait for that, if the worker
        takes no tasks)."""
        self.settings = settings = ConsumerSettings.of(self.worker)
        if not settings.task_types:
            await self.host.stop_requested.wait()
            return
        self._slots = slots_kept = SlotKeeper(session, settings.app)
        line = types_line(settings.task_types)
        served = [
            DeliveryContext(session, WorkQueue(
                session, settings.app.queue_path(name), max_attempts=settings.most_attempts,
                dead_letter=settings.app.dead, lease=settings.lease,
                claim_with=self._claim_extras, accept=self._takes, line=line),
                settings.app, slots_kept, settings.name)
            for name in settings.queues]
        # where callbacks go: each into its type's queue (a producer's objects, not ours)
        self._producer = QueueSet(settings.app, WorkQueue(session, settings.app.tasks,
                                                          dead_letter=settings.app.dead))
        async with self.handlers.open(), trio.open_nursery() as timer:
            # known before the first take
            await timer.start(self._follow_revoked, session, [c.queue for c in served])
            timer.start_soon(self._slots.run)  # the result index's slots, made ahead
            # callbacks left by a worker killed between its ack and their move
            timer.start_soon(callbacks.move_left_behind, session, settings.app, self._producer)
            async with trio.open_nursery() as slots:
                for _ in range(settings.concurrency):
                    slots.start_soon(self._slot, session, served)
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
        settings = self.settings
        return {"types": sorted(settings.task_types), "queues": list(settings.queues),
                "passed_types": list(self._passed_types),
                "load": self._in_flight / max(settings.concurrency, 1),
                "in_flight": self._in_flight, "done": self.tasks_done,
                "failed": self.tasks_failed, "stuck_threads": self.handlers.stuck_threads,
                **metrics.task_stats(self).published()}

    async def _slot(self, session: Session, served: Sequence[DeliveryContext]) -> None:
        """Take and run tasks one at a time from the ``served`` queues (one take each, raced
        when there are several) until the worker drains."""
        trouble = 0  # consecutive failures of the slot itself (not of handlers)
        while not self.host.draining:
            if trouble:
                # a persistent problem (e.g. the app's znodes deleted under us) must not
                # turn into a busy loop: back off, exponentially, up to backoff_max
                await self.settings.retry.backoff.sleep(trouble)
            try:
                with trio.CancelScope() as slot:
                    # request_stop cancels only slots still waiting for an item
                    self._waiting.add(slot)
                    try:
                        if len(served) == 1:
                            await self._serve(session, served[0], slot)
                        else:
                            await self._race(session, served, slot)
                    finally:
                        self._waiting.discard(slot)
                if slot.cancelled_caught:  # only ever cancelled while waiting
                    return
                trouble = 0
            except _HandedBack:
                trouble = 0  # the handler failed: logged, backed off, item handed back
            except errors.FrameworkError as exc:
                trouble += 1
                log.warning("task.released", worker=self.settings.name, error=str(exc),
                            retry=trouble)
            except Exception:
                trouble += 1
                log.exception("worker.slot_error", worker=self.settings.name, retry=trouble)

    async def _serve(self, session: Session, context: DeliveryContext, slot: trio.CancelScope,
                     admit: Callable[[QueueItem], bool] | None = None) -> None:
        """Take one task from ``context``'s queue and run it (``admit``: see
        :meth:`_race`)."""
        delivery: Delivery | None = None
        try:
            async with context.queue.take(admit=admit) as item:
                self._waiting.discard(slot)
                # an exception leaving this block hands the item back
                delivery = Delivery.claimed(context, item, self.host.rules_for)
                await self._handle_item(delivery)
            await payloads.discard(item.data, self.worker)  # acknowledged
            await self._after_ack(session, delivery.markers)
            # the running/ marker outlives the ack or release (a task given up loses it
            # before its burial, the item still queued), so an observer that sees no
            # marker and an empty queue knows all is done
        finally:
            if delivery is not None:
                await self._clear_running(session, delivery.markers)
                await self._queue_callback(session, delivery)

    async def _race(self, session: Session, served: Sequence[DeliveryContext],
                    slot: trio.CancelScope) -> None:
        """Take one task from whichever served queue has one first: one take per queue,
        each in its own task and cancel scope.  The first take whose claim is admitted
        (:meth:`WorkQueue.take`'s ``admit``, called with no checkpoint between the claim
        and the block) wins and cancels the others; a loser cancelled while it waits
        leaves the queue's line, one cancelled in a claim round undoes its claim, and one
        whose claim comes after the win is refused by ``admit`` - both hand the item back
        as never delivered.  So the slot runs at most one task, and a lost race never
        counts as an attempt.  The winner's error is raised here, in the slot's task; so
        is the error of a take that failed before anyone won (it ends the race: the slot
        backs off and waits on every queue again)."""
        race = _Race()
        # the take started first tends to claim first: the queue that starts rotates, so a
        # busy queue does not keep the others waiting until it is empty
        first = next(self._races) % len(served)
        served = [*served[first:], *served[:first]]

        async def runner(context: DeliveryContext, scope: trio.CancelScope) -> None:
            def admit(_item: QueueItem) -> bool:
                if race.winner is not None:
                    return False
                race.winner = scope
                for other in race.scopes:
                    if other is not scope:
                        other.cancel()
                return True

            with scope:
                try:
                    await self._serve(session, context, slot, admit)
                except Exception as exc:  # raised again in the slot's task
                    if race.winner is scope or race.winner is None:
                        race.error = exc
                        for other in race.scopes:  # a take in trouble ends the race
                            if other is not scope:
                                other.cancel()
                    else:  # a loser's trouble while it was being cancelled: the win stands
                        log.warning("worker.race_loser_error", worker=self.settings.name,
                                    queue=context.queue.path, error=str(exc))

        async with trio.open_nursery() as nursery:
            for context in served:
                scope = trio.CancelScope()
                race.scopes.append(scope)
                nursery.start_soon(runner, context, scope)
        if race.error is not None:
            raise race.error

    async def _queue_callback(self, session: Session, delivery: Delivery) -> None:
        """Move the callback the delivery wrote (if any) into the queue, right after its
        ack or its final failure; left for :func:`callbacks.move_all` on ZooKeeper errors."""
        if delivery.callback_node is None:
            return
        assert self._producer is not None  # made when the run started
        with cleanup_scope(session):
            try:
                await callbacks.move(session, self.settings.app, self._producer,
                                     delivery.callback_node)
            except errors.ZooKeeperError as exc:
                log.warning("callback.left", node=delivery.callback_node, error=str(exc))

    async def _mark_running(self, delivery: Delivery) -> None:
        """Create this delivery's ``running/<task id>`` marker; on return
        ``delivery.marker`` holds it.  The marker is also the task id's mutual exclusion:
        another live delivery of the same id (a resubmission, an at-least-once put) waits
        here until that one's marker is gone, without failing or using up a delivery.  A
        lost reply is recovered by the delivery token in the marker's data (our own marker
        is adopted); the marker of an earlier delivery of this same item is stale (that
        delivery lost its claim, its handler is stuck) and is taken over."""
        session, task, item, running = (delivery.context.session, delivery.task,
                                        delivery.item, delivery.running)
        mine = self._new_marker(running, task, item)
        try:
            while True:
                try:
                    await session.create(running, mine.encode(), ephemeral=True)
                    delivery.marker = mine
                    return
                except (errors.ConnectionLossError, errors.NodeExistsError):
                    pass  # ours, applied with its reply lost, or another delivery's
                owner = await marker_owner(session, running)
                if owner is None:
                    continue
                token, owner_session, version = owner
                if (token, owner_session) == (mine.delivery, await session.wait_connected()):
                    mine.version = version
                    delivery.marker = mine
                    return
                if earlier_delivery_of(token, item):
                    log.warning("task.stale_marker_taken_over", task=task.id,
                                worker=self.settings.name, other=token)
                    try:
                        await session.delete(running, version=version)
                    except (errors.BadVersionError, errors.NoNodeError):
                        pass
                    continue
                log.info("task.same_id_running", task=task.id, worker=self.settings.name,
                         other=token)
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

    async def _clear_running(self, session: Session, markers: Sequence[Marker]) -> None:
        """Delete our marker (``markers``: a delivery's, at most one), and only ours: the
        node is read first and deleted at the version read only if it carries our delivery
        token (a later delivery that took over a stale marker of ours creates its own, also
        at version 0: a delete by version alone would remove it).  Only failure paths get
        here: a successful task's marker goes in its acknowledging transaction."""
        for mine in markers:
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
            if name in self.settings.task_types or not isinstance(name, str) \
                    or doc.get("id") in self._revoked:  # taken to be acknowledged as revoked
                return True
        except (ValueError, AttributeError, TypeError):
            return True
        if name not in self._passed_types:  # published: status names types nobody has
            self._passed_types[name] = None
            if len(self._passed_types) > MAX_PASSED_TYPES:
                del self._passed_types[next(iter(self._passed_types))]
            self.host.status_changed()
        return False

    def _claim_extras(self, item: QueueItem) -> ClaimExtras | None:
        """What a task's claim commits with it: the delivery's ``running/`` marker, and
        a probe that the task has no result record (created and deleted again in the same
        transaction: refused if one exists).  Refused (another delivery of the same id
        runs, an earlier one's marker is left, a record exists), the task is claimed
        alone and :meth:`_handle_item` takes the slow path (marker, then record read)."""
        app = self.settings.app
        try:
            task = Task.decode(item.data, item.attempts)
            running = f"{app.running}/{task.id}"
            record = app.result_path(task.key)
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

        return ClaimExtras(build, undo, ClaimedTask(task, mine))

    def _new_marker(self, running: str, task: Task, item: QueueItem) -> Marker:
        name = self.settings.name
        return Marker(running, RunningRecord(f"{name}/{item.name}/{item.attempts}",
                                             name, time.time(), task.attempts))

    async def _handle_item(self, delivery: Delivery) -> None:
        """Run one delivery: mark it running, skip a task whose key is done, end a revoked
        one, refuse one that may not run, run the handler, then record and acknowledge."""
        task, rules = delivery.task, delivery.rules
        limit, stuck_after = self._limits(delivery)
        if stuck_after:
            # past its limit (and the retry backoff) a handler that did not stop is stuck:
            # stop renewing the claim's lease, so the task goes to another worker
            delivery.context.queue.renew_for(delivery.item, stuck_after)
        if not delivery.fast:  # the claim's extras were refused: marker, then record
            await self._mark_running(delivery)
            assert delivery.marker is not None
            self._markers[delivery.running] = delivery.marker
            done = await delivery.existing_success()
            if done is not None:
                log.info("task.duplicate_skipped", task=task.id, key=task.key,
                         done_by=done.worker)
                return
        else:
            assert delivery.marker is not None
            self._markers[delivery.running] = delivery.marker
        if rules is None and task.id in self._revoked:  # a type we lack, taken to end it
            delivery.finish(self._revoked_result(delivery, time.time()), revoked=True)
            return
        if task.expires is not None and time.time() > task.expires:
            log.info("task.expired", task=task.id, type=task.name, worker=self.settings.name,
                     late=round(time.time() - task.expires, 3))
            delivery.finish(TaskResult(
                task.id, False, self.settings.name, task.attempts, None, "expired",
                key=task.key, outcome=Outcome.EXPIRED, name=task.name))
            return
        refusal = self._refusal(task, rules)
        if refusal is not None:
            await self._failed(delivery, refusal, time.time())
            raise _GivenUp() from refusal
        assert rules is not None
        value, started, revoked = await self._run_handler(delivery, rules, limit, stuck_after)
        if revoked:
            delivery.finish(self._revoked_result(delivery, started), revoked=True)
            return
        result = TaskResult(task.id, True, self.settings.name, task.attempts, value,
                            started_at=started, key=task.key, name=task.name)
        try:
            delivery.finish(result)
        except errors.PermanentFailure as exc:
            await self._failed(delivery, exc, started)
            raise _GivenUp() from None
        self.tasks_done += 1
        metrics.task_finished(self.settings.app.name, True, time.time() - started, owner=self)
        self.host.status_changed()  # publish the count (the last one came before finish)
        log.info("task.done", task=task.id, type=task.name, worker=self.settings.name,
                 attempt=task.attempts, seconds=round(time.time() - started, 3))

    def _limits(self, delivery: Delivery) -> tuple[float | None, float | None]:
        """The task's time limit, and after how long its handler counts as stuck (the
        limit plus the longest retry backoff and a second; ``None`` without a limit)."""
        rules = delivery.rules
        limit = delivery.task.time_limit or (rules.time_limit if rules
                                             else self.settings.time_limit)
        backoff = delivery.retry(self.settings.retry).backoff
        return limit, (limit + backoff.cap + 1.0 if limit else None)

    async def _run_handler(self, delivery: Delivery, rules: TaskRules, limit: float | None,
                           stuck_after: float | None) -> tuple[Any, float, bool]:
        """Run the handler in the task's revocable scope; (its value, when it started,
        whether the task was revoked instead).  Raises :class:`_GivenUp` or
        :class:`_HandedBack` after recording a failure; an error before the handler
        started (the payload store) is raised as is: the slot backs off."""
        task = delivery.task
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
                    delivery.context.queue.renew_for(delivery.item, stuck_after)
                in_handler = True
                self._in_flight += 1
                self.host.status_changed()
                metrics.task_started(self.settings.app.name)
                started = time.time()
                soft = None if rules.kind.blocking else (
                    task.soft_time_limit or rules.kind.options.soft_time_limit)
                value = await run_with_soft_limit(
                    lambda: self.handlers.call_within(task, rules.kind, limit), soft)
        except Exception as exc:
            if not in_handler and not isinstance(exc, errors.PermanentFailure):
                raise  # the payload store failed: the slot backs off, the item comes back
            final = await self._failed(delivery, exc, started if in_handler else time.time())
            # leaving take() with an error hands the item back, or - its type's attempts
            # used up, or a permanent failure - buries it at once: the queue's own limit is
            # the largest of the worker's types, and a delivery past the type's own would
            # only record "delivered too often" over the real error
            raise (_GivenUp() if final else _HandedBack()) from exc
        finally:
            self._revocable.pop(task.id, None)
            if in_handler:
                self._in_flight -= 1
                self.host.status_changed()
                metrics.task_ended(self.settings.app.name)
        return value, started, revocable.cancelled_caught

    async def _before_handler(self, task: Task, rules: TaskRules) -> Task:
        """The waits between a claim and its handler: the stored payload read back (off
        ZooKeeper), then the type's rate-limit token (the claim is held and renewed
        meanwhile).  Both run in the task's revocable scope."""
        if task.payload_ref is not None:
            task = await payloads.resolve(task, self.worker)
        if rules.limiter is not None:
            await rules.limiter.acquire()
        return task

    def _revoked_result(self, delivery: Delivery, started: float) -> TaskResult:
        task = delivery.task
        log.info("task.revoked", task=task.id, worker=self.settings.name, attempt=task.attempts)
        return delivery.revoked_result(started)

    async def _after_ack(self, session: Session, markers: Sequence[Marker]) -> None:
        """What an acknowledgement made alone (its finisher's fallback ran) still owes:
        a revoked task's ``revoked/`` node (kept until the item left the queue, so a
        redelivery before that is still acknowledged as revoked, never run)."""
        for mine in markers:
            if mine.after_ack is not None:
                with cleanup_scope(session):
                    try:
                        await session.delete(mine.after_ack, missing_ok=True)
                    except errors.ZooKeeperError:
                        pass  # left behind: a resubmission of the id would find it revoked

    async def _follow_revoked(self, session: Session, queues: Sequence[WorkQueue],
                              task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Keep :attr:`_revoked` current (one children watch on ``revoked/`` per worker, so a
        revoke costs each worker one listing and a task nothing) and cancel the handler of
        a revoked task this worker is running.  A new revoke also makes each of
        ``queues`` (the ones it serves) look again at the tasks it passed over: a revoked
        task of a type no worker has is taken by any worker, only to be acknowledged as
        revoked."""
        started = False
        async for snap in watch_children(session, self.settings.app.revoked):
            new = frozenset(snap.children) - self._revoked
            self._revoked = frozenset(snap.children)
            for task_id in self._revoked & set(self._revocable):
                self._revocable[task_id].cancel()
            if new:
                for queue in queues:
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
            known = ", ".join(sorted(self.settings.task_types)) or "none"
            return errors.PermanentFailure(
                f"worker {self.settings.name} has no task type {task.name!r} (its task "
                f"types: {known})"
            )
        if task.attempts > rules.max_attempts:
            return errors.PermanentFailure(
                f"delivered {task.attempts} times, over the {rules.max_attempts} attempts of "
                f"task type {task.name!r}"
            )
        return None

    async def _failed(self, delivery: Delivery, exc: Exception, started: float) -> bool:
        """Record a failed delivery (:meth:`Delivery.fail`: the failures ring, the result
        record too when it is final); hold the claim for the retry backoff when it is not.
        Return whether it is final: the type's ``max_attempts`` reached, or a permanent
        failure."""
        task = delivery.task
        retry = delivery.retry(self.settings.retry)

        def counted(final: bool) -> None:
            self.tasks_failed += 1
            metrics.task_finished(self.settings.app.name, False, time.time() - started,
                                  final=final, owner=self)
            log.warning("task.failed", task=task.id, type=task.name, key=task.key,
                        worker=self.settings.name,
                        error=error_text(exc), attempt=task.attempts, final=final,
                        exc_info=exc)

        final = await delivery.fail(exc, started, retry, counted)
        if final:
            # the failure is recorded: the key may be submitted again at once, so the
            # marker goes now, before the item is dead-lettered (the item, still in the
            # queue until then, keeps anyone from concluding that all is done)
            await self._clear_running(delivery.context.session, delivery.markers)
        else:
            # hold the claim for a while so the retry is delayed (exponential backoff)
            await retry.sleep(task.attempts)
        return final

    async def _drain_deadline(self, slots: trio.CancelScope) -> None:
        await self.host.stop_requested.wait()
        await trio.sleep(self.settings.drain_timeout)
        log.warning("worker.drain_timeout", worker=self.settings.name, in_flight=self._in_flight)
        slots.cancel()

    async def report_progress(self, task: Task, done: float, total: float | None = None,
                              message: str = "") -> None:
        """Publish progress of a running task (shown by ``framework status``)."""
        session = self.host.session
        assert session is not None
        marker = self._markers.get(f"{self.settings.app.running}/{task.id}")
        if marker is None:
            raise errors.ConfigurationError(
                f"report_progress() for task {task.id!r}, which this worker is not running"
            )
        data = marker.progressed(done, total, message, time.time())
        try:
            stat = await session.set(marker.path, data, version=marker.version)
        except (errors.BadVersionError, errors.NoNodeError):
            return  # the marker is no longer ours: this delivery lost its claim
        marker.version = stat.version
