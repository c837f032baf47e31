"""One claimed item of a worker's task consumer: a :class:`Delivery`, and the narrow contract
the consumer reads its worker through.

A :class:`Delivery` is made by the consumer for each item its slot claims (inside the
queue's ``take`` block, so a task that cannot even be decoded fails where deliveries count)
and lives until the item is acknowledged or handed back.  It holds the task, the queue
item, the rules of the task's type (``None``: a type this worker lacks), its
``running/<task id>`` marker once made (created with the claim on the fast path, see
:class:`ClaimedTask`) and the version of an earlier failure record of its key (replaced by
the result).  :meth:`Delivery.finish` arranges the acknowledging transaction (the result
record, the ack, the marker's delete; committed when the take's block ends), and
:meth:`Delivery.fail` records a failed attempt and says whether it was the last.

Neither raises for SUSPENDED or LOST: writes made while the session cannot be trusted fail
with the session's errors (the consumer's slot backs off), and the ack itself is checked by
the queue (``ClaimLost`` when the claim was lost).  :meth:`Delivery.fail`'s writes are a
clean-up (shielded, bounded by :func:`~framework.zk.cleanup_scope`), skipped on ZooKeeper
errors: a failure record is best effort, the item's release is not.

:class:`ConsumerSettings` are the worker's settings the consumer reads, fixed when a run
starts; :class:`ConsumerHost` is what it still asks the worker while running (whether it
drains, the rules of a task type, status publication).
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

import attrs
import trio

from framework import errors
from framework.primitives.queue import Finisher, QueueItem, WorkQueue
from framework.retry import Backoff, RetryPolicy
from framework.runtime.app import DEFAULT_QUEUE, App, queue_list
from framework.runtime.results.result_index import SlotKeeper, entry_path, write_record
from framework.runtime.task_types import TaskRules, TaskType
from framework.runtime.tasks import FAILURE_RING, Outcome, Task, TaskResult
from framework.runtime.worker_parts.markers import Marker
from framework.runtime.workflows import callbacks
from framework.zk import Session, cleanup_scope

#: Longest error message kept in a failure record (a record must fit in one znode).
MAX_ERROR_CHARS = 4000

#: Longest traceback kept in a failure record (its end: the frames nearest the error).
MAX_TRACEBACK_CHARS = 8000


@attrs.frozen
class ConsumerSettings:
    """The worker's settings its task consumer uses, read once when a run starts."""

    app: App
    name: str
    concurrency: int
    lease: float | None
    drain_timeout: float
    time_limit: float | None
    retry: RetryPolicy  # the worker class's (a task type's own is in its rules)
    task_types: Mapping[str, TaskType]
    most_attempts: int  # the largest max_attempts of its types: the queue's own limit
    #: the queues it serves (names, checked; ``("default",)`` unless told otherwise)
    queues: tuple[str, ...] = (DEFAULT_QUEUE,)

    @classmethod
    def of(cls, worker: Any) -> ConsumerSettings:
        backoff = Backoff(worker.backoff_base, worker.backoff_max)
        return cls(worker.app, worker.name, worker.concurrency, worker.lease,
                   worker.drain_timeout, worker.time_limit,
                   RetryPolicy(worker.max_attempts, backoff), dict(worker.task_types),
                   worker.most_attempts,
                   queue_list(getattr(worker, "queues", None) or DEFAULT_QUEUE))


class ConsumerHost(Protocol):
    """What the task consumer asks its worker while it runs."""

    #: set when a stop is requested (the drain's deadline starts then)
    stop_requested: trio.Event
    #: the session it runs in (``None`` while not running)
    session: Session | None

    @property
    def draining(self) -> bool:
        """Whether a stop was requested (slots take no new task)."""
        ...

    def rules_for(self, name: str) -> TaskRules | None:
        """How this worker runs task type ``name`` (``None``: it has no such type)."""
        ...

    def status_changed(self) -> None:
        """Publish the worker's status soon (counts changed)."""
        ...


@attrs.frozen
class ClaimedTask:
    """What a fast-path claim hands back with its item (``QueueItem.extras.payload``): the
    task, decoded when the claim was built, and the marker committed with the claim."""

    task: Task
    marker: Marker


@attrs.frozen
class DeliveryContext:
    """Where a delivery writes: the session, the queue that claimed it, the app, the result
    index's slots, and the worker's name (in its records)."""

    session: Session
    queue: WorkQueue
    app: App
    slots: SlotKeeper
    worker: str


@attrs.define(eq=False)
class Delivery:
    """One claimed item, from its claim to its ack or release (see the module doc)."""

    context: DeliveryContext
    item: QueueItem
    task: Task
    rules: TaskRules | None
    #: this delivery's ``running/<task id>`` marker, once made (or adopted)
    marker: Marker | None = None
    #: the version of a failure record of the task's key, replaced by the result
    previous_version: int | None = None
    #: the ``callbacks/`` node written for this task (queued by the consumer after the ack)
    callback_node: str | None = None

    @classmethod
    def claimed(cls, context: DeliveryContext, item: QueueItem,
                rules_for: Callable[[str], TaskRules | None]) -> Delivery:
        """The delivery of ``item`` (``item.attempts`` counts deliveries, this one
        included).  Raises if the item is no task (a malformed one): raised in the take's
        block, that fails this delivery where failures count."""
        if item.extras is not None:  # claimed with its marker; no result record then
            claimed: ClaimedTask = item.extras.payload
            return cls(context, item, claimed.task, rules_for(claimed.task.name),
                       claimed.marker)
        task = Task.decode(item.data, item.attempts)
        return cls(context, item, task, rules_for(task.name))

    @property
    def running(self) -> str:
        """The path of the task's ``running/`` marker."""
        return f"{self.context.app.running}/{self.task.id}"

    @property
    def markers(self) -> list[Marker]:
        """The marker of this delivery, if it has one (at most one)."""
        return [self.marker] if self.marker is not None else []

    @property
    def fast(self) -> bool:
        """Whether the claim committed the marker and proved no result record existed."""
        return self.item.extras is not None

    def retry(self, default: RetryPolicy) -> RetryPolicy:
        """Its type's retry policy (``default``, the worker's, for a type it lacks)."""
        return self.rules.retry if self.rules is not None else default

    async def existing_success(self) -> TaskResult | None:
        """Slow path only: the task key's successful result, if one exists (a failure
        record's version is kept: the result replaces it)."""
        try:
            data, stat = await self.context.session.get(self.context.app.result_path(
                self.task.key))
        except errors.NoNodeError:
            return None
        previous = TaskResult.decode(data)
        if previous.ok:
            return previous
        self.previous_version = stat.version
        return None

    def revoked_result(self, started: float) -> TaskResult:
        """The record of this task acknowledged as revoked."""
        task = self.task
        return TaskResult(task.id, False, self.context.worker, task.attempts, None, "revoked",
                          started_at=started, key=task.key, outcome=Outcome.REVOKED,
                          name=task.name)

    def callback(self, result: TaskResult) -> Task | None:
        """The callback task ``result`` owes (the submit's ``on_success`` /
        ``on_failure``, else its type's; see :mod:`framework.runtime.workflows.callbacks`)."""
        task, options = self.task, self.rules.kind.options if self.rules else None
        return callbacks.callback_for(
            task, result,
            on_success=task.on_success or (options.on_success if options else None),
            on_failure=task.on_failure or (options.on_failure if options else None))

    def finish(self, result: TaskResult, *, revoked: bool = False) -> None:
        """Acknowledge the item with ``result`` recorded, when the take's block ends:
        the record (with its entry in the time index when it is created, or set at the
        version read over a failure record), the marker's delete and - ``revoked`` - the
        ``revoked/`` node go in the transaction that acks the item, combined with the
        other slots' acks, and so does the pending node of a success's callback
        (:mod:`framework.runtime.workflows.callbacks`).  If the server refuses the record's part (a
        record written meanwhile, a slot deleted), the record (and callback) are written
        alone before the ack.  Raises
        :class:`~framework.errors.PermanentFailure`, before anything is written, if the
        result cannot be stored."""
        encoded = result.encode()
        ctx, task, mine = self.context, self.task, self.marker
        assert mine is not None
        record = ctx.app.result_path(task.key)
        slot = ctx.slots.current(time.time())
        previous_version = self.previous_version
        revoked_node = f"{ctx.app.revoked}/{task.id}"
        callback = None if revoked else self.callback(result)
        if callback is not None:
            self.callback_node = callbacks.node_of(ctx.app, callback)
            pending = callbacks.encode(callback)

        def build(txn: Any) -> None:
            if previous_version is None:
                txn.create(record, encoded)
                txn.create(entry_path(ctx.app, slot, task.key))
            else:
                txn.set(record, encoded, version=previous_version)
            txn.delete(mine.path, version=mine.version)
            if revoked:
                txn.delete(revoked_node)
            if callback is not None:
                txn.create(callbacks.node_of(ctx.app, callback), pending)

        async def fallback() -> None:
            await ctx.slots.made(slot)  # a refused entry's slot may be missing: made first
            await write_record(ctx.session, ctx.app, task.key, encoded, slot)
            if callback is not None:
                await callbacks.write(ctx.session, ctx.app, callback)
            if revoked:  # its revoked/ node goes once the item is acknowledged alone
                mine.after_ack = revoked_node

        finisher = Finisher(build, fallback)
        ctx.queue.finish_with(self.item, finisher)
        mine.finisher = finisher

    async def fail(self, exc: Exception, started: float, retry: RetryPolicy,
                   on_failure: Callable[[bool], Awaitable[None] | None] | None = None
                   ) -> bool:
        """Record this failed attempt (the failures ring; the result record too when it is
        final) and return whether it is final (``retry`` gives up: attempts used up, or a
        permanent error).  ``on_failure(final)`` is told first (counts, metrics).  A final
        failure's callback (``on_failure``) is written right before its record."""
        ended = time.time()  # the record's time: not counting the traceback's formatting
        final = retry.gives_up(self.task.attempts, exc)
        if on_failure is not None:
            maybe = on_failure(final)
            if maybe is not None:
                await maybe
        result = self._failure_record(exc, started, ended)
        ctx = self.context
        with cleanup_scope(ctx.session):
            try:
                node = await ctx.session.create(f"{ctx.app.failures}/f-", result.encode(),
                                                sequence=True)
                old = int(node[-10:]) - FAILURE_RING
                if old >= 0:
                    await ctx.session.delete(f"{ctx.app.failures}/f-{old:010d}",
                                             missing_ok=True)
                callback = self.callback(result) if final else None
                if callback is not None:  # before the record: see workflows.callbacks
                    await callbacks.write(ctx.session, ctx.app, callback)
                    self.callback_node = callbacks.node_of(ctx.app, callback)
                if final:
                    await write_record(ctx.session, ctx.app, self.task.key, result.encode(),
                                       ctx.slots.current(ended))
            except errors.ZooKeeperError:
                pass
        return final

    def _failure_record(self, exc: Exception, started: float, ended: float) -> TaskResult:
        task = self.task
        return TaskResult(task.id, False, self.context.worker, task.attempts, None,
                          error_text(exc), started_at=started, finished_at=ended,
                          key=task.key, traceback=traceback_text(exc), name=task.name)


def error_text(exc: BaseException) -> str:
    """A failure record's error: the message of a permanent failure, ``time limit
    exceeded``, or ``<class>: <message>``; at most :data:`MAX_ERROR_CHARS`."""
    if isinstance(exc, trio.TooSlowError):
        error = "time limit exceeded"
    elif isinstance(exc, errors.PermanentFailure):
        error = str(exc)
    else:
        error = f"{type(exc).__name__}: {exc}"
    if len(error) > MAX_ERROR_CHARS:
        error = error[:MAX_ERROR_CHARS] + f"... ({len(error):,} characters)"
    return error


def traceback_text(exc: BaseException) -> str:
    """``exc``'s traceback, its end kept within :data:`MAX_TRACEBACK_CHARS`."""
    trace = "".join(traceback.format_exception(exc))
    if len(trace) > MAX_TRACEBACK_CHARS:
        trace = f"... ({len(trace):,} characters)\n" + trace[-MAX_TRACEBACK_CHARS:]
    return trace
