"""``Client``: submit tasks to an application and read their results from any process.

A web application, a script or ``framework submit`` hold a :class:`~framework.zk.Session`
and a ``Client`` for an app; no master or worker needs to run in that process::

    async with Session(hosts) as session:
        client = Client(session, "thumbnails")
        task = await client.submit({"image": 7}, key="img-7")
        record = await client.result("img-7", wait=True, timeout=60)

A submit is what :meth:`MasterContext.submit` does without the leader's fence: one item put
in the app's work queue.  With ``key`` the task's id and idempotency key are ``key``, so
submitting the same key twice runs the task once and ``result(key)`` finds its record.
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
from framework.runtime.records import CancelRecord, Revocation, RevokeRecord
from framework.runtime.submission import Submitter
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
    """Submit tasks to application ``app`` and read their results, over ``session``."""

    def __init__(self, session: Session, app: App | str) -> None:
        if not isinstance(session, Session):
            raise errors.ConfigurationError(
                f"Client needs a framework Session, got {type(session).__name__}"
            )
        self.session = session
        self.app = app if isinstance(app, App) else App(app)
        self._queue: WorkQueue | None = None
        self._submit: Submitter | None = None

    async def _work_queue(self) -> WorkQueue:
        if self._queue is None:
            await ensure_layout(self.session, self.app, self.app.tasks, self.app.running)
            self._queue = WorkQueue(self.session, self.app.tasks, dead_letter=self.app.dead)
        return self._queue

    async def _submitter(self) -> Submitter:
        if self._submit is None:
            self._submit = Submitter(self.session, self.app, await self._work_queue())
        return self._submit

    async def submit(self, name: str, payload: Any = None, *, key: str | None = None,
                     time_limit: float | None = None, priority: int | None = None,
                     countdown: float | None = None, eta: Any = None) -> Task:
        """Queue one task of type ``name`` (``payload``: any JSON value), now or at its time
        (``countdown`` seconds from now, or ``eta``: an aware datetime or epoch seconds);
        returns it with its id.

        ``key`` names the task (id and idempotency key): a key that already has a successful
        result is not run again.  Lower ``priority`` values are taken first (default: the
        task type's).  Raises :class:`ConfigurationError` for a task type the app's workers
        do not have (once one has registered its types) and for an app that was cancelled
        (``framework cancel``)."""
        if await self.session.exists(self.app.cancel) is not None:
            raise errors.ConfigurationError(
                f"application {self.app.name!r} is cancelled: it takes no new tasks "
                f"(framework resume {self.app.name}, or purge the app to start again)"
            )
        submitter = await self._submitter()
        return await submitter.submit(name, payload, task_id=key, idempotency_key=key,
                                      time_limit=time_limit, priority=priority,
                                      countdown=countdown, eta=eta)

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
        ``False`` if it already was.  :class:`NoNodeError` if there is no such app."""
        if await self.session.exists(self.app.base) is None:
            raise errors.NoNodeError(f"no application {self.app.name!r} in this ZooKeeper")
        record = records.encode(CancelRecord(time.time(), by))
        try:
            await self.session.create(self.app.cancel, record)
        except errors.NodeExistsError:
            return False
        return True

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
        counts = []
        for path in (self.app.masters, self.app.workers):
            try:
                counts.append(len(await self.session.children(path)))
            except errors.NoNodeError:
                counts.append(0)
        return counts[0], counts[1]

    async def purge(self, *, force: bool = False) -> bool:
        """Delete the app's whole subtree (queue, results, dead letters, config...);
        ``False`` if there was none.  Refused (:class:`ConfigurationError`) while a master
        or worker is alive, unless ``force``: a live process would re-create its nodes."""
        if await self.session.exists(self.app.base) is None:
            return False
        if not force:
            masters, workers = await self.processes()
            if masters or workers:
                raise errors.ConfigurationError(
                    f"application {self.app.name!r} has {masters} master(s) and {workers} "
                    "worker(s) alive: stop them first, or pass --force"
                )
        await self.session.delete_tree(self.app.base)
        return True

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
