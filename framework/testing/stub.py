"""A test mode for an application's own code: its handlers run in this process, no ZooKeeper.

:class:`StubApp` is to this framework what Dramatiq's ``StubBroker`` or Celery's
``task_always_eager`` are to theirs: a unit test submits tasks to it and calls
:meth:`StubApp.join`, which runs them on one instance of the worker class, one at a time, in
the order the real queue would take them (lower ``priority`` first, then submission order),
and keeps what happened::

    async def test_resize() -> None:
        app = StubApp(Resizer, config={"size": 128})
        task = await app.submit("resize", {"image": 7})
        await app.join()
        assert app.result(task.id).result == {"resized": 7, "size": 128}

What it keeps of the real runtime (the same code where it can):

* task types and their options (``max_attempts``, ``time_limit``, the worker class's
  defaults; ``expires`` against the real clock, ``soft_time_limit`` in ``async def``
  handlers, ``on_success`` / ``on_failure`` callbacks queued as the worker queues them),
  handlers run as the worker runs them (:class:`~framework.runtime.worker_parts.HandlerPool`:
  ``async def`` in trio, a plain ``def`` in a thread or the process pool, within the time
  limit);
* submission checks: an unknown task type is a :class:`~framework.errors.ConfigurationError`
  naming the known ones, a payload that is not JSON is refused, ``countdown``/``eta`` are
  checked;
* outcomes: a result record per task (:class:`~framework.runtime.tasks.TaskResult`, its
  result checked as JSON that fits in a znode), a failed attempt retried up to its type's
  ``max_attempts`` (a :class:`~framework.errors.PermanentFailure` at once), then a dead
  letter; a task whose key already has a successful result is not run again (idempotency
  keys); ``revoke`` of a queued task records it revoked;
* canvases: :meth:`StubApp.run_canvas` runs a ``chain``, ``group`` or ``chord`` with the
  driver's payloads, task ids and errors;
* named queues: a task goes into its type's queue or the one its submit names, and runs only
  if the worker serves that queue (``Worker.queues``); a task of a queue it does not serve
  waits (:attr:`StubApp.unserved`), as it would in a real app with no worker serving it;
* inside a handler, ``self.config`` (given or published by a stub master), ``self.submit``
  (follow-up tasks land in the stub) and ``self.report_progress`` (kept in
  :attr:`StubApp.progress`).

What it does not do: there is no clock to wait on - retries are not backed off, rate limits
do not space starts, and delayed tasks (``countdown``/``eta``) run after every task queued
for now, in due order, without waiting; schedules do not fire (submit their task to test
it); ``self.session`` is ``None`` (code that talks to ZooKeeper itself needs the embedded
ZooKeeper of :mod:`framework.testing.pytest_plugin`); push mode (shards) is not simulated.

:meth:`StubApp.run_master` runs a master's ``lead`` with a :class:`StubMasterContext`
(``submit``, ``submit_many``, ``publish_config``, ``result``, ``wait_idle``, ``workers``), so a
whole job can be checked in one test.
"""

from __future__ import annotations

import heapq
import itertools
import time
import traceback
import uuid
from datetime import datetime
from typing import Any

import attrs
import trio

from framework import errors
from framework.retry import RetryPolicy
from framework.runtime import DEFAULT_QUEUE
from framework.runtime.master import Master
from framework.runtime.submission import SubmitOptions
from framework.runtime.tasks import Outcome, Task, TaskResult, new_task
from framework.runtime.worker import Worker
from framework.runtime.worker_parts import HandlerPool, run_with_soft_limit
from framework.runtime.workflows import (
    FAILED,
    SUCCEEDED,
    Canvas,
    CanvasRecord,
    callback_for,
    failure_text,
    step_key,
)

__all__ = ["StubApp", "StubMasterContext", "TaskFailed"]


class TaskFailed(errors.FrameworkError):
    """A task failed for good during :meth:`StubApp.join` with ``fail_fast``; ``result``
    is its record, the handler's exception is the ``__cause__``."""

    def __init__(self, result: TaskResult) -> None:
        super().__init__(f"task {result.task_id} failed: {result.error}")
        self.result = result


@attrs.define
class _Queued:
    task: Task
    priority: int
    due: float | None  # None: now


class StubApp:
    """One application's worker class run in this process (see the module doc).

    ``worker``: the :class:`~framework.runtime.Worker` subclass (or an instance of it);
    ``config``: what ``self.config`` holds (``on_config`` is called with it at the first
    :meth:`join`); ``app``: the application name when the class has no ``app_name``.

    Not thread-safe; use it from one trio run.  Tasks run one at a time."""

    def __init__(self, worker: type[Worker] | Worker, *, config: Any = None,
                 app: str | None = None) -> None:
        if isinstance(worker, type):
            if not issubclass(worker, Worker):
                raise errors.ConfigurationError(
                    f"StubApp needs a Worker subclass, got {worker.__name__}")
            worker = worker(app or (None if worker.app_name else "stub"), name="stub-worker")
        if not isinstance(worker, Worker):
            raise errors.ConfigurationError(
                f"StubApp needs a Worker subclass, got {type(worker).__name__}")
        self.worker = worker
        self.app = worker.app
        worker.config = config
        self._config_pending = config is not None
        # inside handlers, follow-ups and progress land here
        worker.submit = self.submit  # type: ignore[method-assign]
        worker.report_progress = self._report_progress  # type: ignore[method-assign]
        #: result records by task key (the last one written for the key)
        self.results: dict[str, TaskResult] = {}
        #: every failed attempt, oldest first (the ``failures/`` ring of the real app)
        self.failures: list[TaskResult] = []
        #: the records of tasks that failed for good, oldest first (the dead-letter list)
        self.dead_letters: list[TaskResult] = []
        #: the last progress each task reported: ``(done, total, message)``
        self.progress: dict[str, tuple[float, float | None, str]] = {}
        #: every task submitted, in order (follow-ups from handlers included)
        self.submitted: list[Task] = []
        self._errors: dict[str, BaseException] = {}
        self._order = itertools.count()
        self._ready: list[tuple[int, int, _Queued]] = []
        self._delayed: list[tuple[float, int, _Queued]] = []
        self._revoked: set[str] = set()
        #: tasks put into a queue the worker does not serve (``Worker.queues``), oldest
        #: first: they wait, as in a real app where no running worker serves their queue
        self.unserved: list[Task] = []

    # ------------------------------------------------------------ submitting

    @property
    def task_types(self) -> list[str]:
        """The worker's task type names."""
        return sorted(self.worker.task_types)

    async def submit(self, name: str, payload: Any = None, *, key: str | None = None,
                     time_limit: float | None = None, priority: int | None = None,
                     countdown: float | None = None, eta: float | datetime | None = None,
                     expires: float | None = None, soft_time_limit: float | None = None,
                     on_success: str | None = None, on_failure: str | None = None,
                     queue: str | None = None) -> Task:
        """Queue one task (the options of ``Client.submit``:
        :class:`~framework.runtime.submission.SubmitOptions`, and its errors for a bad
        option or an unknown type; a key that exists is queued again, as a master's
        submit does); it runs at the next :meth:`join`."""
        options = SubmitOptions(key=key, time_limit=time_limit, priority=priority,
                                countdown=countdown, eta=eta, expires=expires,
                                soft_time_limit=soft_time_limit, on_success=on_success,
                                on_failure=on_failure, queue=queue)
        self._check_type(name)
        due = options.due()
        if expires is None:
            expires = self.worker.task_types[name].options.expires
        task = new_task(payload, name=name, task_id=key, idempotency_key=key,
                        time_limit=time_limit, soft_time_limit=soft_time_limit,
                        expires=None if expires is None else (due or time.time()) + expires,
                        on_success=on_success, on_failure=on_failure,
                        queue=queue or self.worker.task_types[name].options.queue)
        self._queue(task, priority, due)
        await trio.lowlevel.checkpoint()
        return task

    async def submit_many(self, name: str, payloads: list[Any], *,
                          priority: int | None = None,
                          keys: list[str] | None = None,
                          queue: str | None = None) -> list[Task]:
        """Queue many tasks; ``keys`` (one per payload) are their ids and idempotency keys;
        ``queue``: their queue (default: the type's)."""
        self._check_type(name)
        if keys is not None and len(keys) != len(payloads):
            raise errors.ConfigurationError(
                f"submit_many: {len(keys)} keys for {len(payloads)} payloads")
        queue = queue or self.worker.task_types[name].options.queue
        tasks = [new_task(p, name=name, task_id=k, idempotency_key=k, queue=queue)
                 for p, k in zip(payloads, keys or [None] * len(payloads), strict=True)]
        for task in tasks:
            self._queue(task, priority, None)
        await trio.lowlevel.checkpoint()
        return tasks

    def revoke(self, task_id: str) -> None:
        """Revoke a task that has not run: it is recorded ``revoked`` when its turn comes."""
        self._revoked.add(task_id)

    def _check_type(self, name: str) -> None:
        if name not in self.worker.task_types:
            known = ", ".join(sorted(self.worker.task_types)) or "none"
            raise errors.ConfigurationError(
                f"application {self.app.name!r} has no task type {name!r}; its task types: "
                f"{known}")

    def _queue(self, task: Task, priority: int | None, due: float | None) -> None:
        if priority is None:
            priority = self.worker.task_types[task.name].options.priority
        queued = _Queued(task, priority, due)
        self.submitted.append(task)
        if task.queue_name not in self.worker.queues:  # nobody serves its queue: it waits
            self.unserved.append(task)
        elif due is None:
            heapq.heappush(self._ready, (priority, next(self._order), queued))
        else:
            heapq.heappush(self._delayed, (due, next(self._order), queued))

    # ------------------------------------------------------------ running

    @property
    def pending(self) -> int:
        """Tasks queued or delayed, not yet run (retries included; those of a queue the
        worker does not serve too: :attr:`unserved`)."""
        return len(self._ready) + len(self._delayed) + len(self.unserved)

    async def join(self, *, fail_fast: bool = False) -> None:
        """Run every queued task, and those they submit, and delayed ones in due order,
        until none is left.  ``fail_fast``: raise :class:`TaskFailed` at the first task that
        fails for good (its handler's error as the cause) instead of going on."""
        if self._config_pending:
            self._config_pending = False
            await self.worker.on_config(self.worker.config)
        pool = HandlerPool(self.worker)
        async with pool.open():
            while self._ready or self._delayed:
                if not self._ready:  # no clock to wait on: the earliest delayed is due
                    _due, order, queued = heapq.heappop(self._delayed)
                    heapq.heappush(self._ready, (queued.priority, order, queued))
                _priority, _order, queued = heapq.heappop(self._ready)
                final = await self._run(pool, queued)
                if final is not None and fail_fast:
                    raise TaskFailed(final) from self._errors.get(final.key)

    async def _run(self, pool: HandlerPool, queued: _Queued) -> TaskResult | None:
        """One delivery of ``queued.task``; returns its record if it failed for good."""
        task = attrs.evolve(queued.task, attempts=queued.task.attempts + 1)
        previous = self.results.get(task.key)
        if previous is not None and previous.ok:
            return None  # done before under this key: never twice
        started = time.time()
        if task.id in self._revoked:
            self._revoked.discard(task.id)
            self.results[task.key] = TaskResult(task.id, False, self.worker.name,
                                                task.attempts, error="revoked",
                                                started_at=started, key=task.key,
                                                outcome=Outcome.REVOKED, name=task.name)
            return None
        if task.expires is not None and started > task.expires:
            self.results[task.key] = TaskResult(task.id, False, self.worker.name,
                                                task.attempts, error="expired",
                                                started_at=started, key=task.key,
                                                outcome=Outcome.EXPIRED, name=task.name)
            return None
        rules = self.worker.rules_for(task.name)
        assert rules is not None  # submit checked the type
        limit = task.time_limit or rules.time_limit
        soft = None if rules.kind.blocking else (task.soft_time_limit
                                                 or rules.kind.options.soft_time_limit)
        try:
            value = await run_with_soft_limit(
                lambda: pool.call_within(task, rules.kind, limit), soft)
            result = TaskResult(task.id, True, self.worker.name, task.attempts, value,
                                started_at=started, key=task.key, name=task.name)
            result.encode()  # not JSON, or too large for a znode: fails for good
        except Exception as exc:
            return self._failed(queued, task, exc, started, rules.retry)
        self.results[task.key] = result
        self._call_back(task, result)
        return None

    def _call_back(self, task: Task, result: TaskResult) -> None:
        """Queue the callback ``result`` owes (the submit's, else the type's), as the
        worker would (:mod:`framework.runtime.workflows.callbacks`); a callback type the worker
        lacks is a :class:`~framework.errors.ConfigurationError`."""
        options = self.worker.task_types[task.name].options
        callback = callback_for(
            task, result, on_success=task.on_success or options.on_success,
            on_failure=task.on_failure or options.on_failure)
        if callback is not None:
            self._check_type(callback.name)
            queue = self.worker.task_types[callback.name].options.queue  # its type's queue
            callback = attrs.evolve(callback, queue=None if queue == DEFAULT_QUEUE else queue)
            self._queue(callback, None, None)

    def _failed(self, queued: _Queued, task: Task, exc: Exception, started: float,
                retry: RetryPolicy) -> TaskResult | None:
        if isinstance(exc, trio.TooSlowError):
            error = "time limit exceeded"
        elif isinstance(exc, errors.PermanentFailure):
            error = str(exc)
        else:
            error = f"{type(exc).__name__}: {exc}"
        final = retry.gives_up(task.attempts, exc)
        record = TaskResult(task.id, False, self.worker.name, task.attempts, None, error,
                            started_at=started, key=task.key, name=task.name,
                            traceback="".join(traceback.format_exception(exc)))
        self.failures.append(record)
        if not final:
            queued.task = task  # delivered once more, at the back of its priority
            heapq.heappush(self._ready, (queued.priority, next(self._order), queued))
            return None
        self.results[task.key] = record
        self._call_back(task, record)
        self.dead_letters.append(record)
        self._errors[task.key] = exc
        return record

    async def _report_progress(self, task: Task, done: float, total: float | None = None,
                               message: str = "") -> None:
        self.progress[task.id] = (done, total, message)
        await trio.lowlevel.checkpoint()

    # ------------------------------------------------------------ reading

    def result(self, key: str) -> TaskResult | None:
        """The result record of task id (or idempotency key) ``key``, if it ended."""
        return self.results.get(key)

    # ------------------------------------------------------------ canvases

    async def run_canvas(self, canvas: Canvas, *, canvas_id: str | None = None) -> CanvasRecord:
        """Run a ``chain``/``group``/``chord`` now, as the app's driver would (the same
        payloads, task ids and errors; see :mod:`framework.runtime.workflows.canvas`), running
        whatever else is queued meanwhile; returns its final record."""
        cid = canvas_id or uuid.uuid4().hex
        record = CanvasRecord(canvas.kind, canvas.steps, canvas.callback, created=time.time())
        if canvas.kind == "chain":
            payload = canvas.steps[0].payload
            for index, step in enumerate(canvas.steps):
                result = await self._run_step(cid, index, step.name, payload, step.priority)
                record = attrs.evolve(record, queued=index + 1)
                if not result.ok:
                    return _ended(record, FAILED, error=failure_text(index, step, result))
                if index + 1 < len(canvas.steps):
                    after = canvas.steps[index + 1]
                    payload = after.payload if after.immutable else {
                        "previous": result.result, "payload": after.payload}
            return _ended(record, SUCCEEDED, result=result.result)
        for index, step in enumerate(canvas.steps):
            await self.submit(step.name, step.payload, key=step_key(cid, index),
                              priority=step.priority)
        await self.join()
        record = attrs.evolve(record, queued=len(canvas.steps))
        results = []
        for index, step in enumerate(canvas.steps):
            result = self.results[step_key(cid, index)]
            if not result.ok:
                return _ended(record, FAILED, error=failure_text(index, step, result))
            results.append(result.result)
        record = attrs.evolve(record, joined={str(i): r for i, r in enumerate(results)})
        callback = canvas.callback
        if callback is None:
            return _ended(record, SUCCEEDED, result=results)
        payload = callback.payload if callback.immutable else {"results": results,
                                                               "payload": callback.payload}
        result = await self._run_step(cid, None, callback.name, payload, callback.priority)
        record = attrs.evolve(record, callback_queued=True)
        if not result.ok:
            return _ended(record, FAILED, error=failure_text(None, callback, result))
        return _ended(record, SUCCEEDED, result=result.result)

    async def _run_step(self, cid: str, index: int | None, name: str, payload: Any,
                        priority: int | None) -> TaskResult:
        key = step_key(cid, index)
        await self.submit(name, payload, key=key, priority=priority)
        await self.join()
        return self.results[key]

    # ------------------------------------------------------------ a master

    async def run_master(self, master: type[Master] | Master) -> dict[str, int]:
        """Run ``master``'s ``lead`` against this stub (its ``wait_idle`` is :meth:`join`),
        then run what is left; returns the job's summary as ``framework run`` prints it
        (``results``, ``dead_letters``).  The master's schedules do not fire."""
        if isinstance(master, type):
            master = master(self.app.name if master.app_name is None else None,
                            name="stub-master")
        await master.lead(StubMasterContext(self, master))  # type: ignore[arg-type]
        await self.join()
        master.summary = {"results": len(self.results), "dead_letters": len(self.dead_letters)}
        return master.summary


def _ended(record: CanvasRecord, state: str, *, result: Any = None,
           error: str | None = None) -> CanvasRecord:
    return attrs.evolve(record, state=state, result=result, error=error, ended=time.time())


@attrs.define
class StubMasterContext:
    """What a master's ``lead`` gets from :meth:`StubApp.run_master`: the calls of
    :class:`~framework.runtime.MasterContext` that concern tasks and configuration."""

    stub: StubApp
    master: Master

    @property
    def app(self) -> Any:
        return self.stub.app

    async def submit(self, name: str, payload: Any = None, **options: Any) -> Task:
        return await self.stub.submit(name, payload, **options)

    async def submit_many(self, name: str, payloads: list[Any], **options: Any) -> list[Task]:
        return await self.stub.submit_many(name, payloads, **options)

    async def publish_config(self, config: Any) -> int:
        """The worker's ``config`` becomes ``config`` and its ``on_config`` is called."""
        self.stub.worker.config = config
        self.stub._config_pending = False
        await self.stub.worker.on_config(config)
        return 0

    async def result(self, key: str, *, wait: bool = False) -> TaskResult | None:
        """The record of ``key``; with ``wait``, tasks are run until it exists (``None``
        if it never does)."""
        if wait and key not in self.stub.results:
            await self.stub.join()
        return self.stub.result(key)

    async def is_running(self, task_id: str) -> bool:
        await trio.lowlevel.checkpoint()
        return False

    async def wait_idle(self) -> None:
        """Runs every task (:meth:`StubApp.join`)."""
        await self.stub.join()

    async def workers(self) -> dict[str, dict[str, Any]]:
        await trio.lowlevel.checkpoint()
        return {self.stub.worker.name: self.stub.worker.status()}

    async def apply_retention(self) -> dict[str, int]:
        await trio.lowlevel.checkpoint()
        return {"dead": 0, "failures": 0, "results": 0}
