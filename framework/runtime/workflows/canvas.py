"""Canvas: ``chain``, ``group`` and ``chord`` of tasks, with results passed on, durable.

Celery's canvas (``chain``, ``group``, ``chord``), RQ's ``depends_on``, Dramatiq's
``pipeline`` and ``group``::

    from framework.runtime import apply_canvas, canvas_result, chain, chord, group, sig

    cid = await apply_canvas(session, "thumbnails", chord(
        [sig("resize", {"image": n}) for n in range(10)], sig("report")))
    record = await canvas_result(session, "thumbnails", cid, wait=True)
    record.state, record.result    # "succeeded", the report's result

**What runs.** Each step is an ordinary task of the app (its type's retries, time limit,
dead letters).  A ``chain`` queues its steps one after another: step ``i + 1`` is queued once
step ``i`` succeeded, with payload ``{"previous": <step i's result>, "payload": <its own>}``
(or its own payload as given, for ``sig(..., immutable=True)``).  A ``group`` queues every
member at once; its result is the list of the members' results, in order.  A ``chord`` is a
group and a callback queued once every member succeeded, with payload ``{"results": [...],
"payload": <its own>}``.  A step or member that fails for good fails the canvas with its error
(``step 2 (resize): ValueError: ...``); nothing after it is queued.  No nesting.

**State in ZooKeeper, one driver.** :func:`apply_canvas` writes one record,
``canvas/<id>`` (:class:`CanvasRecord`: the steps, how many are queued, the members counted
in, the state), in one create: nothing is queued by the submitter.  The driver
(:class:`CanvasDriver`) runs in the app's elected duty holder
(:mod:`~framework.runtime.worker_parts.duties`, whether or not a master leads), fenced by
its term.  Every step of a canvas is one multi that changes its record at the version read:

* queueing a step (or member, or the callback) is the queue item's create and the record's
  ``queued`` (``callback_queued``) moved on, together - so each is queued exactly once, by
  one driver, across failovers;
* a member's end is counted into ``joined`` (its index and result) at the version read - once
  per member, so the callback is queued once, when the count is complete, and never without
  every member's result;
* the end of the canvas (succeeded / failed) is the record's last change.

A driver killed -9 or paused (SIGSTOP) at any moment leaves the record at a version from
which the next holder resumes: a step queued is not queued again, a member counted is not
counted again, a multi it had not committed is made by its successor; a paused driver's late
multi is refused by its fence.  Each task runs at least once (the queue's guarantee: a worker
killed while running it runs it again elsewhere) and its result is recorded once (its key is
``<canvas id>-<step>``, ``<canvas id>-callback``).

Cost: the submit is one create; the driver adds per step one multi (queue) and one watch on
the step's result record, per member one more multi (its count).  SUSPENDED / LOST: the
driver stops with the holder's term and the next holder resumes from the records.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import trio

from framework import errors, records
from framework.logs import get_logger
from framework.primitives import Term
from framework.primitives.queue import WorkQueue
from framework.runtime.app import App, check_name
from framework.runtime.payloads import MAX_TASK_BYTES
from framework.runtime.queues import QueueSet
from framework.runtime.results import Limit
from framework.runtime.task_types import Catalog
from framework.runtime.tasks import TaskResult, new_task, read_result
from framework.zk import MAX_DATA_BYTES, Session

log = get_logger(__name__)

RUNNING, SUCCEEDED, FAILED = "running", "succeeded", "failed"

#: Ended canvas records deleted per fenced multi (well under a request's size limit).
TRIM_PER_MULTI = 100
KINDS = ("chain", "group", "chord")


@attrs.frozen
class Signature:
    """One step: task type ``name`` with ``payload``; ``immutable``: a chain step gets its own
    payload as is, not the previous result with it; ``priority``: the type's by default."""

    name: str
    payload: Any = None
    immutable: bool = False
    priority: int | None = None


@attrs.frozen
class Canvas:
    """What :func:`chain`, :func:`group` and :func:`chord` build (not yet submitted)."""

    kind: str
    steps: tuple[Signature, ...]
    callback: Signature | None = None


@attrs.frozen
class CanvasRecord:
    """``canvas/<id>``: a canvas and how far it got (see the module doc)."""

    kind: str
    steps: tuple[Signature, ...]
    callback: Signature | None = None
    queued: int = 0  # steps (chain) or members (group, chord) queued so far
    joined: dict[str, Any] = attrs.Factory(dict)  # member index -> its result, counted once
    callback_queued: bool = False
    state: str = RUNNING
    result: Any = None
    error: str | None = None
    created: float = 0.0
    ended: float | None = None

    @property
    def done(self) -> bool:
        return self.state != RUNNING


def sig(name: str, payload: Any = None, *, immutable: bool = False,
        priority: int | None = None) -> Signature:
    """A step: task type ``name`` with ``payload`` (Celery's ``signature``; ``immutable``
    is its ``si``)."""
    check_name("task name", name)
    new_task(payload, name=name)  # not JSON: refused now
    return Signature(name, payload, immutable, priority)


def chain(*steps: Signature) -> Canvas:
    """Steps run one after another, each given the previous one's result."""
    return Canvas("chain", _steps(steps, "chain"))


def group(*members: Signature | Sequence[Signature]) -> Canvas:
    """Members run at once; the result is their results, in order."""
    return Canvas("group", _steps(_flat(members), "group"))


def chord(members: Canvas | Sequence[Signature], callback: Signature) -> Canvas:
    """A group, then ``callback`` with the members' results once every member succeeded."""
    steps = members.steps if isinstance(members, Canvas) else tuple(members)
    if isinstance(members, Canvas) and members.kind != "group":
        raise errors.ConfigurationError("chord(): the header must be a group or a list of sig()")
    if not isinstance(callback, Signature):
        raise errors.ConfigurationError("chord(): the callback must be a sig()")
    return Canvas("chord", _steps(steps, "chord"), callback)


def _flat(members: tuple[Any, ...]) -> tuple[Any, ...]:
    if len(members) == 1 and isinstance(members[0], (list, tuple)):
        return tuple(members[0])
    return members


def _steps(steps: Sequence[Any], kind: str) -> tuple[Signature, ...]:
    if not steps or not all(isinstance(s, Signature) for s in steps):
        raise errors.ConfigurationError(
            f"{kind}() takes one or more sig(...) steps (no nesting), got {list(steps)!r}")
    return tuple(steps)


def canvas_root(app: App) -> str:
    """Where the canvas records of ``app`` live."""
    return f"{app.base}/canvas"


def step_key(canvas_id: str, index: int | None) -> str:
    """The task id (and idempotency key) of step ``index`` (``None``: the callback)."""
    return f"{canvas_id}-{'callback' if index is None else index}"


async def apply_canvas(session: Session, app: App | str, canvas: Canvas, *,
                       canvas_id: str | None = None) -> str:
    """Submit ``canvas``; returns its id.  Its task types are checked against the app's
    catalog (:class:`~framework.errors.ConfigurationError` naming the known ones).  Applying
    the same ``canvas_id`` again does nothing (the first one stands)."""
    app = app if isinstance(app, App) else App(app)
    canvas_id = check_name("canvas id", canvas_id) if canvas_id else uuid.uuid4().hex
    catalog = Catalog(session, app)
    for step in (*canvas.steps, *([canvas.callback] if canvas.callback else [])):
        await catalog.check(step.name)
    record = CanvasRecord(canvas.kind, canvas.steps, canvas.callback, created=time.time())
    data = records.encode(record)
    if len(data) > 512 * 1024:
        raise errors.ConfigurationError(
            f"a canvas of {len(data):,} bytes: keep its payloads small (refer to data)")
    try:
        await session.create(f"{canvas_root(app)}/{canvas_id}", data, makepath=True)
    except errors.NodeExistsError:
        pass  # applied before (or our create, its reply lost)
    log.info("canvas.applied", app=app.name, canvas=canvas_id, kind=canvas.kind,
             steps=len(canvas.steps))
    return canvas_id


async def canvas_result(session: Session, app: App | str, canvas_id: str, *,
                        wait: bool = False) -> CanvasRecord | None:
    """The record of canvas ``canvas_id`` (``None``: no such canvas); with ``wait``, once
    it has ended (a watch on the record, no polling)."""
    app = app if isinstance(app, App) else App(app)
    path = f"{canvas_root(app)}/{canvas_id}"
    while True:
        changed = trio.Event()
        try:
            data, _ = await session.get(path, watch=session.waker(changed) if wait else None)
        except errors.NoNodeError:
            return None
        record = records.decode(data, CanvasRecord)
        if record.done or not wait:
            return record
        await changed.wait()


class CanvasDriver:
    """Drives every running canvas of ``app`` for one term of the duty holder (its writes
    fenced by ``term``); see the module doc.

    Ended canvas records are kept within ``keep`` (count and age, by their end time):
    every ``trim_every`` seconds (``None``: never) the driver deletes those over it, oldest
    first, in fenced multis of :data:`TRIM_PER_MULTI`.  A running canvas is never deleted;
    ``canvas_result`` of a deleted one is ``None``, and ``apply_canvas`` with its id starts
    a new canvas (an id's idempotency lasts as long as its record)."""

    def __init__(self, session: Session, app: App, term: Term, *,
                 keep: Limit | None = None, trim_every: float | None = None) -> None:
        self.session = session
        self.app = app
        self.term = term
        self.keep = keep or Limit()
        self.trim_every = trim_every
        self.queue = WorkQueue(session, app.tasks, dead_letter=app.dead,
                               fence=(term.node, term.version))
        self.queues = QueueSet(app, self.queue)  # a step goes into its type's queue
        self.catalog = Catalog(session, app)
        self._driving: set[str] = set()
        self._ended: dict[str, float] = {}  # ended canvas id -> when it ended

    async def run(self) -> None:
        """Follow ``canvas/`` and drive each running canvas, until cancelled."""
        root = canvas_root(self.app)
        await self.session.ensure_path(root)
        async with trio.open_nursery() as nursery:
            if self.trim_every is not None:
                nursery.start_soon(self._trim_every, self.trim_every)
            while True:
                changed = trio.Event()
                try:
                    names = await self.session.children(root, watch=self.session.waker(changed))
                except (errors.ConnectionLossError, errors.SessionExpiredError):
                    await self.session.wait_connected()
                    continue
                for name in names:
                    if name not in self._driving and name not in self._ended:
                        self._driving.add(name)
                        nursery.start_soon(self._follow, name)
                listed = set(names)
                for gone in [name for name in self._ended if name not in listed]:
                    del self._ended[gone]
                await changed.wait()

    async def _follow(self, canvas_id: str) -> None:
        try:
            while True:
                try:
                    ended = await self._drive(canvas_id)
                    if ended is not None:
                        self._ended[canvas_id] = ended.ended or time.time()
                    return
                except (errors.ConnectionLossError, errors.SessionExpiredError):
                    await self.session.wait_connected()  # then resume from the record
                except Exception:  # a bug here must not end the holder's term
                    log.exception("canvas.error", canvas=canvas_id)
                    return
        finally:
            self._driving.discard(canvas_id)

    async def _trim_every(self, interval: float) -> None:
        """:meth:`trim` every ``interval`` seconds, for the term (a failed pass is logged
        and tried again at the next)."""
        while True:
            await trio.sleep(interval)
            try:
                deleted = await self.trim()
            except errors.FrameworkError as exc:
                log.warning("canvas.trim_failed", app=self.app.name, error=str(exc))
                continue
            if deleted:
                log.info("canvas.trimmed", app=self.app.name, deleted=deleted)

    async def trim(self) -> int:
        """Delete the ended canvas records over ``keep`` now; returns how many.  Each multi
        checks the fence; a record already gone is skipped (it leaves the listing)."""
        victims = self.keep.over_times(self._ended, time.time())
        deleted = 0
        for start in range(0, len(victims), TRIM_PER_MULTI):
            batch = victims[start:start + TRIM_PER_MULTI]
            txn = self.term.fenced()
            for canvas_id in batch:
                txn.delete(self._path(canvas_id))
            try:
                await txn.commit()
            except errors.TransactionFailedError as exc:
                if exc.failed_index == 0 or not isinstance(exc.cause, errors.NoNodeError):
                    raise  # the fence is gone: this term trims no more
                # a record deleted meanwhile (by hand): forget those gone, the next pass
                # deletes the others
                batch = [c for c in batch if await self.session.exists(self._path(c)) is None]
            else:
                deleted += len(batch)
            for canvas_id in batch:
                self._ended.pop(canvas_id, None)
        return deleted

    # ------------------------------------------------------------ one canvas

    def _path(self, canvas_id: str) -> str:
        return f"{canvas_root(self.app)}/{canvas_id}"

    async def _read(self, canvas_id: str) -> tuple[CanvasRecord | None, int]:
        try:
            data, stat = await self.session.get(self._path(canvas_id))
        except errors.NoNodeError:
            return None, -1
        try:
            return records.decode(data, CanvasRecord), stat.version
        except records.CorruptRecord as exc:
            log.error("canvas.corrupt", canvas=canvas_id, error=str(exc))
            return None, -1

    async def _drive(self, canvas_id: str) -> CanvasRecord | None:
        """Move the canvas on, one multi at a time, until it has ended; its last record
        (``None``: it is gone, or unreadable)."""
        while True:
            record, version = await self._read(canvas_id)
            if record is None or record.done:
                return record
            if record.kind == "chain":
                await self._chain_step(canvas_id, record, version)
            else:
                await self._group_step(canvas_id, record, version)

    async def _chain_step(self, canvas_id: str, record: CanvasRecord, version: int) -> None:
        current = record.queued - 1
        if current < 0:
            await self._queue(canvas_id, record, version, 0, record.steps[0].payload)
            return
        result = await self._result(step_key(canvas_id, current))
        if not result.ok:
            await self._end(canvas_id, version, record, FAILED,
                            error=failure_text(current, record.steps[current], result))
        elif current == len(record.steps) - 1:
            await self._end(canvas_id, version, record, SUCCEEDED, result=result.result)
        else:
            step = record.steps[current + 1]
            payload = step.payload if step.immutable else {"previous": result.result,
                                                           "payload": step.payload}
            await self._queue(canvas_id, record, version, current + 1, payload)

    async def _group_step(self, canvas_id: str, record: CanvasRecord, version: int) -> None:
        members = len(record.steps)
        if record.queued < members:
            index = record.queued
            await self._queue(canvas_id, record, version, index, record.steps[index].payload)
            return
        if len(record.joined) < members:
            await self._join(canvas_id, record)
            return
        results = [record.joined[str(i)] for i in range(members)]
        if record.callback is None:
            await self._end(canvas_id, version, record, SUCCEEDED, result=results)
        elif not record.callback_queued:
            callback = record.callback
            payload = callback.payload if callback.immutable else {"results": results,
                                                                   "payload": callback.payload}
            await self._queue(canvas_id, record, version, None, payload)
        else:
            result = await self._result(step_key(canvas_id, None))
            if result.ok:
                await self._end(canvas_id, version, record, SUCCEEDED, result=result.result)
            else:
                await self._end(canvas_id, version, record, FAILED,
                                error=failure_text(None, record.callback, result))

    async def _join(self, canvas_id: str, record: CanvasRecord) -> None:
        """Count each member in as it ends (one multi per member, at the version read),
        waiting on every uncounted member's result at once; return once all are counted,
        or once one failed for good (the canvas then ends failed with its error)."""
        waiting = [i for i in range(len(record.steps)) if str(i) not in record.joined]
        send, receive = trio.open_memory_channel[tuple[int, TaskResult]](len(waiting))

        async def wait_for(index: int) -> None:
            await send.send((index, await self._result(step_key(canvas_id, index))))

        async with trio.open_nursery() as nursery:
            for index in waiting:
                nursery.start_soon(wait_for, index)
            for _ in waiting:
                index, result = await receive.receive()
                record, version = await self._read(canvas_id)
                if record is None or record.done:
                    break
                if str(index) in record.joined:
                    continue
                if not result.ok:
                    await self._end(canvas_id, version, record, FAILED,
                                    error=failure_text(index, record.steps[index], result))
                    break
                joined = {**record.joined, str(index): result.result}
                await self._set(canvas_id, version, attrs.evolve(record, joined=joined))
                log.info("canvas.joined", canvas=canvas_id, member=index, joined=len(joined),
                         members=len(record.steps))
            nursery.cancel_scope.cancel()

    async def _result(self, key: str) -> TaskResult:
        result = await read_result(self.session, self.app.result_path(key), wait=True)
        assert result is not None
        return result

    # ------------------------------------------------------------ the multis

    async def _queue(self, canvas_id: str, record: CanvasRecord, version: int,
                     index: int | None, payload: Any) -> None:
        """Queue step ``index`` (``None``: the callback) and move the record on, together."""
        step = record.callback if index is None else record.steps[index]
        assert step is not None
        key = step_key(canvas_id, index)
        priority = step.priority
        queue: str | None = None  # its type's queue (the default one if it has none)
        try:
            info = await self.catalog.check(step.name)
            queue = info.queue
            if priority is None:
                priority = info.priority
        except errors.ConfigurationError as exc:  # its type left the catalog
            if priority is None:
                await self._end(canvas_id, version, record, FAILED, error=str(exc))
                return
        task = new_task(payload, name=step.name, task_id=key, idempotency_key=key,
                        queue=queue)
        moved = attrs.evolve(record, callback_queued=True) if index is None else \
            attrs.evolve(record, queued=index + 1)
        path = self._path(canvas_id)
        data = task.encode()
        try:
            if len(data) > MAX_TASK_BYTES:
                raise errors.DataTooLargeError(
                    f"the task is {len(data):,} bytes as JSON, over the {MAX_TASK_BYTES:,} a "
                    "queued task may have: return small results (refer to data stored "
                    "elsewhere)")
            await self._refusable(lambda: self.queues.get(task.queue).put(
                data, priority=priority,
                also=lambda txn: txn.set(path, records.encode(moved), version=version)))
        except errors.DataTooLargeError as exc:  # the previous results made it too large
            await self._end(canvas_id, version, record, FAILED, error=f"{key}: {exc}")
            return
        log.info("canvas.queued", canvas=canvas_id, step=key, name=step.name,
                 queue=task.queue_name)

    async def _end(self, canvas_id: str, version: int, record: CanvasRecord, state: str,
                   result: Any = None, error: str | None = None) -> None:
        await self._set(canvas_id, version, attrs.evolve(
            record, state=state, result=result, error=error, ended=time.time()))
        log.info("canvas.ended", canvas=canvas_id, state=state, error=error)

    async def _set(self, canvas_id: str, version: int, record: CanvasRecord) -> None:
        data = records.encode(record)
        if len(data) > MAX_DATA_BYTES and not record.done:
            # the members' results no longer fit in the record: end it, saying why
            record = attrs.evolve(record, joined={}, state=FAILED, ended=time.time(),
                                  error=f"the canvas's results are {len(data):,} bytes, over "
                                        f"a znode's {MAX_DATA_BYTES:,}: return small results "
                                        "(refer to data stored elsewhere)")
            data = records.encode(record)
        txn = self.term.fenced().set(self._path(canvas_id), data, version=version)
        await self._refusable(txn.commit)

    async def _refusable(self, commit: Callable[[], Any]) -> None:
        """Commit; a refused multi (the record changed, or our fence is gone) is read again
        by the caller - unless our term is over, when we wait for its cancellation."""
        try:
            await commit()
        except errors.TransactionFailedError as exc:
            log.warning("canvas.write_refused", error=str(exc))
            if await self.session.exists(self.term.node) is None:
                await trio.sleep_forever()  # deposed: the term's scope cancels us


def failure_text(index: int | None, step: Signature | None, result: TaskResult) -> str:
    """A failed canvas's error: which step (``None``: the callback), its type, its error."""
    where = "callback" if index is None else f"step {index}"
    name = step.name if step is not None else "?"
    return f"{where} ({name}): {result.error}"
