"""``Client``: submit tasks to an application and read their results from any process.

A web application, a script or ``framework submit`` hold a :class:`~framework.zk.Session`
and a ``Client`` for an app; no master or worker needs to run in that process::

    async with Session(hosts) as session:
        client = Client(session, "thumbnails")
        task = await client.submit("resize", {"image": 7}, key="img-7")
        record = await client.result("img-7", wait=True, timeout=60)

A submit is what :meth:`MasterContext.submit` does without the leader's fence: one item put
in the app's work queue.  With ``key`` the task's id and idempotency key are ``key``:
``result(key)`` finds its record, and submitting a key that exists (succeeded, queued or
running) raises :class:`~framework.runtime.submission.TaskExists` saying so (a failed one
is queued again).  Code outside trio uses :class:`~framework.runtime.BlockingClient`.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from typing import Any

import attrs
import trio

from framework import errors, records
from framework.primitives.queue import WorkQueue
from framework.records import CorruptRecord
from framework.runtime import actions
from framework.runtime.app import App, ensure_layout
from framework.runtime.payloads import PayloadStore
from framework.runtime.records import CancelRecord, PastRun, Revocation, RevokeRecord
from framework.runtime.submission import Existing, Submitter
from framework.runtime.tasks import Task, TaskResult, read_result
from framework.zk import Session, validate_name


@attrs.frozen
class DeadLetter:
    """A task given up (``dead/<name>``): ``name`` is what requeue and discard take;
    ``error`` is that of its final failure (from its result record), if recorded."""

    name: str
    task_id: str | None
    key: str | None
    attempts: int
    priority: int
    error: str | None
    payload: Any


class Client:
    """Submit tasks to application ``app`` and read their results, over ``session``.

    ``create``: the first submit to an app that does not exist creates it (tasks may wait
    for its first worker); ``False`` refuses it instead (:class:`~framework.runtime.actions.
    UnknownApp`, naming the known apps: a typo does not make an app).  ``payload_store``:
    where payloads over the queue's limit go (:mod:`framework.runtime.payloads`; default:
    ``FRAMEWORK_PAYLOAD_STORE``, else they are refused)."""

    def __init__(self, session: Session, app: App | str, *, create: bool = True,
                 payload_store: PayloadStore | str | None = None) -> None:
        if not isinstance(session, Session):
            raise errors.ConfigurationError(
                f"Client needs a framework Session, got {type(session).__name__}"
            )
        self.session = session
        self.app = app if isinstance(app, App) else App(app)
        self.create = create
        self.payload_store = payload_store
        self._queue: WorkQueue | None = None
        self._submit: Submitter | None = None

    async def _work_queue(self) -> WorkQueue:
        if self._queue is None:
            if not self.create:
                await actions.require_app(self.session, self.app,
                                          hint="--create to create it")
            await ensure_layout(self.session, self.app, self.app.tasks, self.app.running)
            self._queue = WorkQueue(self.session, self.app.tasks, dead_letter=self.app.dead)
        return self._queue

    async def _submitter(self) -> Submitter:
        if self._submit is None:
            self._submit = Submitter(self.session, self.app, await self._work_queue(),
                                     payload_store=self.payload_store)
        return self._submit

    async def submit(self, name: str, payload: Any = None, *, key: str | None = None,
                     time_limit: float | None = None, priority: int | None = None,
                     countdown: float | None = None, eta: Any = None) -> Task:
        """Queue one task of type ``name`` (``payload``: any JSON value), now or at its time
        (``countdown`` seconds from now, or ``eta``: an aware datetime or epoch seconds);
        returns it with its id.

        ``key`` names the task (id and idempotency key): a key that exists raises
        :class:`~framework.runtime.submission.TaskExists` (its result succeeded, or it is
        queued or running: see :meth:`existing`); one that failed for good is queued again.
        Lower ``priority`` values are taken first (default: the task type's).  Raises
        :class:`ConfigurationError` for a task type the app's workers do not have (once one
        has registered its types) and for an app that was cancelled (``framework cancel``);
        :class:`~framework.errors.DataTooLargeError` for a task over the queue's 64 KiB
        without a payload store; :class:`~framework.runtime.actions.UnknownApp` for a
        missing app with ``create=False``."""
        if await self.session.exists(self.app.cancel) is not None:
            raise errors.ConfigurationError(
                f"application {self.app.name!r} is cancelled: it takes no new tasks "
                f"(framework resume {self.app.name}, or purge the app to start again)"
            )
        submitter = await self._submitter()
        return await submitter.submit(name, payload, task_id=key, idempotency_key=key,
                                      time_limit=time_limit, priority=priority,
                                      countdown=countdown, eta=eta, check_existing=True)

    async def existing(self, key: str) -> Existing | None:
        """What exists of task key ``key``: its result (succeeded, failed, revoked), or
        that it is running or queued; ``None`` if nothing (see
        :meth:`Submitter.existing <framework.runtime.submission.Submitter.existing>`)."""
        validate_name("task key", key)
        return await Submitter(self.session, self.app,
                               WorkQueue(self.session, self.app.tasks)).existing(key)

    async def result(self, key: str, *, wait: bool = False,
                     timeout: float | None = None) -> TaskResult | None:
        """The result record of task ``key`` (id or idempotency key): a success, or the
        final failure of a task given up.  ``None`` if there is none yet; with ``wait``,
        blocks until it is written (a ZooKeeper watch, no polling) and raises
        :class:`trio.TooSlowError` after ``timeout`` seconds (``None``: no limit)."""
        validate_name("task key", key)
        path = self.app.result_path(key)
        with trio.fail_after(timeout) if wait and timeout is not None else nullcontext():
            return await read_result(self.session, path, wait=wait)

    async def cancel(self, *, by: str = "") -> bool:
        """Mark the app cancelled (its ``cancel`` node, which masters and workers watch);
        ``False`` if it already was.  :class:`~framework.runtime.actions.UnknownApp` (a
        :class:`NoNodeError`) if there is no such app."""
        return await actions.cancel(self.session, self.app, by=by)

    async def resume(self) -> CancelRecord | None:
        """Undo a cancel (delete the ``cancel`` node): new tasks are taken again and masters
        and workers started from now on run.  Returns the cancel record deleted, ``None``
        if the app was not cancelled; :class:`~framework.runtime.actions.UnknownApp` if
        there is no such app."""
        return await actions.resume(self.session, self.app)

    async def rerun(self, *, by: str = "") -> PastRun:
        """Start a new generation of the app's finished job (see
        :func:`framework.runtime.actions.rerun`); returns the generation kept in history."""
        return await actions.rerun(self.session, self.app, by=by)

    async def revoke(self, task_id: str, *, by: str = "") -> Revocation:
        """Revoke task ``task_id``: a queued (or delayed) one is acknowledged without running
        when a worker takes it, a running one has its handler cancelled at once (each
        worker watches ``revoked/``); either way it is recorded with outcome ``revoked``
        and never retried.  Returns what was done: :attr:`Revocation.FINISHED` (its result
        record exists: nothing to revoke), :attr:`Revocation.ALREADY` or
        :attr:`Revocation.REVOKED`.  :class:`NoNodeError` if there is no such app."""
        validate_name("task id", task_id)
        if await self.session.exists(self.app.base) is None:
            raise errors.NoNodeError(f"no application {self.app.name!r} in this ZooKeeper")
        if await self.session.exists(self.app.result_path(task_id)) is not None:
            return Revocation.FINISHED
        await self.session.ensure_path(self.app.revoked)
        record = records.encode(RevokeRecord(time.time(), by))
        try:
            await self.session.create(f"{self.app.revoked}/{task_id}", record)
        except errors.NodeExistsError:
            return Revocation.ALREADY
        return Revocation.REVOKED

    async def processes(self) -> tuple[int, int]:
        """How many masters (leader and standbys) and workers of the app are alive."""
        return await actions.processes(self.session, self.app)

    async def purge(self, *, force: bool = False, grace: float = 30.0, by: str = "") -> bool:
        """Delete the app's whole subtree (queue, results, dead letters, config...);
        ``False`` if there was none.  Refused (:class:`~framework.runtime.actions.
        ActionError`) while a master or worker is alive, unless ``force``: then the app is
        cancelled first and the delete waits (watches) until its processes have drained and
        left, for at most ``grace`` seconds (see :func:`framework.runtime.actions.purge`)."""
        return await actions.purge(self.session, self.app, force=force, grace=grace, by=by)

    async def requeue(self, dead_letter: str) -> str:
        """Put dead letter ``dead_letter`` (a :attr:`DeadLetter.name`) back in the queue
        with a fresh count of deliveries; returns the new item's name.  At-least-once: the
        put comes before the dead letter's delete."""
        return await actions.requeue(self.session, self.app.name, dead_letter)

    async def discard(self, dead_letter: str) -> None:
        """Delete dead letter ``dead_letter`` for good."""
        await actions.discard(self.session, self.app.name, dead_letter)

    async def dead_letters(self) -> list[DeadLetter]:
        """The app's dead letters, oldest first, each with the error of its final failure."""
        queue = WorkQueue(self.session, self.app.tasks, dead_letter=self.app.dead)
        out = []
        for item in await queue.dead_letters():
            try:
                task: Task | None = Task.decode(item.data)
            except CorruptRecord:
                task = None
            error = None
            if task is not None:
                try:
                    record = await self.result(task.key)
                except errors.ConfigurationError:
                    record = None
                error = record.error if record is not None and not record.ok else None
            out.append(DeadLetter(
                name=f"{item.name.replace('/', '.', 1)}.{item.attempts}",
                task_id=task.id if task else None, key=task.key if task else None,
                attempts=item.attempts, priority=item.priority, error=error,
                payload=task.payload if task else item.data.decode(errors="replace"),
            ))
        return out
