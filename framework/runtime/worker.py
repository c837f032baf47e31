"""``Worker``: subclass it and implement ``handle`` (pull mode) and/or ``serve_shard`` (push).

A worker is a :class:`~framework.runtime.service.Service` (name, membership with status,
configuration, graceful stop) running two parts: the task consumer
(:mod:`framework.runtime.worker_parts.task_consumer`: takes tasks from the shared queue,
at-least-once) and the shard server (:mod:`framework.runtime.worker_parts.shard_server`:
serves the shards the master assigns to it).  What each guarantees on a crash, on
SUSPENDED and on LOST is written in those modules.

Graceful stop (SIGTERM/Ctrl-C via the runner, or :meth:`~Service.request_stop`): stop taking,
let in-flight tasks finish for up to ``drain_timeout`` seconds (then cancel them: their items
are redelivered), stop shards, leave the group.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any

import trio

from framework import errors
from framework.primitives.queue import WorkQueue
from framework.retry import Backoff
from framework.runtime.app import DEFAULT_QUEUE, App, queue_list
from framework.runtime.service import Part, Service
from framework.runtime.submission import SubmitOptions, Submitter
from framework.runtime.task_types import TaskRules, collect, rules_of
from framework.runtime.tasks import Task
from framework.runtime.worker_parts.duties import Duties
from framework.runtime.worker_parts.handlers import HANDLER_POOLS, check_handler
from framework.runtime.worker_parts.shard_server import ShardServer
from framework.runtime.worker_parts.task_consumer import TaskConsumer

__all__ = ["HANDLER_POOLS", "Worker"]


class Worker(Service):
    """Base class of an application's workers; override :meth:`handle` / :meth:`serve_shard`.

    Class attributes tune the runtime: ``concurrency`` (tasks at once), ``max_attempts``
    (then the task is dead-lettered), ``backoff_base``/``backoff_max`` (seconds held before
    a failed task is released for retry, doubling per attempt), ``time_limit`` (seconds per
    task unless the task sets its own), ``drain_timeout``, ``status_interval``,
    ``suspended_grace``, ``lease`` (seconds: a task's claim must be renewed by this worker's
    trio loop within it, and is renewed only until the task's time limit and retry backoff
    are over; a worker stuck past that, or whose event loop is blocked, loses the task to
    another worker, and its late acknowledgement is refused by the server),
    ``confirm_after`` (push mode: seconds a serving record must last, with the session
    trusted, before it is confirmed and the leader may drop another replica for it; see
    :meth:`ready`), ``queues`` (the queues it takes tasks from: ``("default",)`` unless
    told otherwise, by this attribute, ``Worker(queues=...)`` or ``framework run -Q a,b``;
    a list given replaces the default, so ``default`` is served only if listed, as with
    Celery's ``-Q``; each slot waits on all of them at once, see
    :mod:`framework.runtime.worker_parts.task_consumer`).

    ``handle`` may be a plain ``def`` for blocking or CPU-bound work: it then runs in a pool
    of ``concurrency`` threads (``handler_pool = "thread"``, the default) or processes
    (``handler_pool = "process"``, with trio-parallel: the class must be importable by name,
    and the handler gets a copy of the worker with ``app``, ``name``, ``address`` and
    ``config`` only).  ``time_limit`` holds for both: a thread past its limit fails its task
    and frees the slot, but a Python thread cannot be killed, so it runs on in the background
    until it returns (its result is dropped; ``status()["stuck_threads"]`` counts them); a
    process past its limit is killed.  A thread handler reports progress with
    ``trio.from_thread.run(self.report_progress, task, done, total)``.
    """

    concurrency: int = 1
    max_attempts: int = 5
    backoff_base: float = 0.2
    backoff_max: float = 10.0
    time_limit: float | None = None
    drain_timeout: float = 30.0
    lease: float | None = 30.0  # a task's claim is renewed within this (None: no lease)
    handler_pool: str = "thread"  # where a plain-def handle runs: "thread" or "process"
    confirm_after: float | None = 1.0  # seconds until a serving record is confirmed (ready)
    #: where payloads too large for a znode are read from (a directory or a
    #: :class:`~framework.runtime.payloads.PayloadStore`; ``None``: FRAMEWORK_PAYLOAD_STORE)
    payload_store: Any = None
    #: may be elected to move delayed tasks, fire ``schedules`` and apply retention while no
    #: master leads (worker-only deployments: :mod:`framework.runtime.worker_parts.duties`)
    duties: bool = True
    #: the queues this worker takes tasks from (names; a str may list them "a,b")
    queues: tuple[str, ...] | str = (DEFAULT_QUEUE,)

    def __init__(self, app: App | str | None = None, *, name: str | None = None,
                 address: str = "", queues: Iterable[str] | str | None = None) -> None:
        super().__init__(app, name=name, address=address)
        #: the queues served, checked (a bad name is a one-line ConfigurationError)
        self.queues = queue_list(queues if queues is not None else type(self).queues)
        #: the task types this worker runs, by name (its ``@task`` methods, and ``handle``)
        self.task_types = collect(type(self), default=Worker.handle)
        #: whether a task type is a plain ``def`` (run in the handler pool)
        self.handle_blocks = check_handler(type(self), self.task_types)
        self._rules: dict[str, TaskRules] = {}
        self._submitter: Submitter | None = None
        self.tasks = TaskConsumer(self)
        self.shard_server = ShardServer(self)

    # ------------------------------------------------------------ for subclasses

    async def handle(self, task: Task) -> Any:
        """Do one task; return a JSON result (it must fit in a znode: keep it small).  A
        subclass may make it a plain ``def`` (run in the ``handler_pool``).

        Raise to fail: the task is retried up to ``max_attempts`` deliveries, except for
        :class:`~framework.errors.PermanentFailure`, which fails it for good at once.  A
        result that is not JSON or is too large fails the task for good the same way."""
        raise NotImplementedError(f"{type(self).__name__} takes tasks but has no handle()")

    async def serve_shard(self, shard: str, spec: bytes) -> None:
        """Serve one assigned shard until cancelled (push mode).  Default: hold it idle.

        Replicated push mode (``MasterContext.run_replicated``): once the shard can be
        served, enter ``async with self.ready(shard, info) as listed:`` and serve inside it.
        Raise :class:`~framework.errors.PermanentFailure` if this worker can never serve
        it (a corrupt copy, say): the runtime records the refusal and the master places
        the shard elsewhere.  Any other error is logged and the shard served again after
        a backoff, as long as it stays assigned."""
        await trio.sleep_forever()

    async def on_assignments(self, shards: frozenset[str]) -> None:
        """Called with each new listing of this worker's assignments (push mode), before
        the shards that left it are cancelled and the new ones started.  Keep it short
        (the next listing waits for it).  Default: nothing."""

    # ------------------------------------------------------------ the parts

    def parts(self) -> list[Part]:
        self.tasks = TaskConsumer(self)  # counts per run
        self.shard_server = ShardServer(self)
        return [self.tasks, self.shard_server, Duties(self)]

    @asynccontextmanager
    async def ready(self, shard: str, info: Any = None) -> AsyncIterator[bool]:
        """Say that this worker serves ``shard`` for as long as the block runs (push mode);
        see :meth:`ShardServer.ready
        <framework.runtime.worker_parts.shard_server.ShardServer.ready>`."""
        async with self.shard_server.ready(shard, info) as listed:
            yield listed

    @property
    def assigned_shards(self) -> frozenset[str]:
        """The shards assigned to this worker in the newest listing of its assignments
        (push mode).  Unchanged while the session cannot be trusted (the worker does not
        know better then): a shard whose ``serve_shard`` is cancelled but still listed here
        was stopped by the session, not unassigned - keep what it needs to serve again."""
        return self.shard_server.assigned

    async def report_progress(self, task: Task, done: float, total: float | None = None,
                              message: str = "") -> None:
        """Publish progress of a running task (shown by ``framework status``)."""
        await self.tasks.report_progress(task, done, total, message)

    async def submit(self, name: str, payload: Any = None, *, key: str | None = None,
                     time_limit: float | None = None, priority: int | None = None,
                     countdown: float | None = None, eta: float | datetime | None = None,
                     expires: float | None = None, soft_time_limit: float | None = None,
                     on_success: str | None = None, on_failure: str | None = None,
                     queue: str | None = None) -> Task:
        """Queue a follow-up task of type ``name`` (a crawler queues the links it found,
        say); the same options (:class:`~framework.runtime.submission.SubmitOptions`) and
        errors as ``MasterContext.submit``; :class:`~framework.errors.NotConnectedError`
        while the worker is not running."""
        options = SubmitOptions(key=key, time_limit=time_limit, priority=priority,
                                countdown=countdown, eta=eta, expires=expires,
                                soft_time_limit=soft_time_limit, on_success=on_success,
                                on_failure=on_failure, queue=queue)
        if self.session is None:
            raise errors.NotConnectedError("the worker is not running")
        if self._submitter is None or self._submitter.session is not self.session:
            self._submitter = Submitter(self.session, self.app,
                                        WorkQueue(self.session, self.app.tasks))
        return await self._submitter.submit(name, payload, options)

    @property
    def backoff(self) -> Backoff:
        """The retry delays of this worker (``backoff_base`` doubling up to ``backoff_max``,
        with jitter): a failed task's retry, a slot in trouble, a shard that failed."""
        return Backoff(self.backoff_base, self.backoff_max)

    @property
    def takes_tasks(self) -> bool:
        """Whether this worker pulls from the task queue (it does if it has a task type:
        a ``@task`` method, or ``handle`` overridden)."""
        return bool(self.task_types)

    def rules_for(self, name: str) -> TaskRules | None:
        """How this worker runs task type ``name`` (``None``: it has no such type)."""
        rules = self._rules.get(name)
        if rules is None and name in self.task_types:
            rules = self._rules[name] = rules_of(self.task_types[name], self)
        return rules

    @property
    def most_attempts(self) -> int:
        """The largest ``max_attempts`` of this worker's task types (the queue buries an
        item only past it; each type's own limit is applied when its task is taken)."""
        return max([self.max_attempts] + [self.rules_for(n).max_attempts  # type: ignore[union-attr]
                                          for n in self.task_types])

    @property
    def tasks_done(self) -> int:
        return self.tasks.tasks_done

    @property
    def tasks_failed(self) -> int:
        return self.tasks.tasks_failed
