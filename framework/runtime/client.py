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

import functools
import time
from datetime import datetime
from typing import Any

import attrs
import trio

from framework import errors, records
from framework.logs import get_logger
from framework.primitives.queue import WorkQueue
from framework.records import CorruptRecord
from framework.runtime.app import App, ensure_layout
from framework.runtime.operations import actions
from framework.runtime.operations.task_lookup import where_is
from framework.runtime.payloads import PayloadStore
from framework.runtime.records import CancelRecord, PastRun, Revocation, RevokeRecord
from framework.runtime.submission import Existing, SubmitOptions, Submitter
from framework.runtime.task_types import TypeInfo
from framework.runtime.tasks import Outcome, Task, TaskResult, read_result
from framework.zk import Session, gather, validate_name

log = get_logger("framework.runtime.client")


class UnknownTask(errors.FrameworkError):
    """``revoke`` of a task id that is not queued, delayed or running and has no result:
    nothing was revoked (a revoke never waits for a task submitted later)."""


@attrs.frozen
class DeadLetter:
    """A task given up (``dead/<name>``): ``name`` is what requeue and discard take;
    ``error`` is that of its final failure (from its result record), if recorded.
    ``older``: the names of earlier dead letters of the same task key (it was submitted
    again and given up again): this one supersedes them."""

    name: str
    task_id: str | None
    key: str | None
    attempts: int
    priority: int
    error: str | None
    payload: Any
    older: tuple[str, ...] = ()


class Client:
    """Submit tasks to application ``app`` and read their results, over ``session``.

    ``create``: ``False`` (the default, like ``framework submit``) refuses to submit to an
    app that does not exist (:class:`~framework.runtime.operations.actions.UnknownApp`, naming the
    known apps: a typo does not make an app); ``True`` creates it at the first submit
    (tasks may wait for its first worker).  ``payload_store``: where payloads over the
    queue's limit go (:mod:`framework.runtime.payloads`; default:
    ``FRAMEWORK_PAYLOAD_STORE``, else they are refused)."""

    def __init__(self, session: Session, app: App | str, *, create: bool = False,
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
        #: the app's catalog was seen listing task types (then a name is always checked)
        self._types_seen = False

    async def _work_queue(self) -> WorkQueue:
        if self._queue is None:
            if not self.create:
                await actions.require_app(self.session, self.app,
                                          hint="Client(..., create=True) creates it")
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
                     countdown: float | None = None, eta: float | datetime | None = None,
                     expires: float | None = None, soft_time_limit: float | None = None,
                     on_success: str | None = None, on_failure: str | None = None,
                     queue: str | None = None) -> Task:
        """Queue one task of type ``name`` (``payload``: any JSON value), now or at its time
        (``countdown`` seconds from now, or ``eta``: an aware datetime or epoch seconds);
        returns it with its id.

        ``key`` names the task (id and idempotency key): a key that exists raises
        :class:`~framework.runtime.submission.TaskExists` (its result succeeded, or it is
        queued or running: see :meth:`existing`); one that failed for good is queued again.
        Lower ``priority`` values are taken first (default: the task type's).  ``expires``:
        seconds from its due time by which it must have started, else it is recorded with
        outcome ``expired`` and never run; ``soft_time_limit``: seconds before
        :class:`~framework.runtime.worker_parts.soft_limit.SoftTimeLimitExceeded` is raised in an
        ``async def`` handler; ``on_success`` / ``on_failure``: task types queued with its
        result or final error (:mod:`framework.runtime.workflows.callbacks`); ``queue``: the named
        queue it goes into (:mod:`framework.runtime.queues`; a worker takes it only if it
        serves that queue).  Each defaults to the task type's (``@task(...)``).  These options are
        :class:`~framework.runtime.submission.SubmitOptions`, the same for every submit
        surface.  Raises :class:`ConfigurationError` for a bad option (one line naming it),
        for a task type the app's workers do not have (once one
        has registered its types) and for an app that was cancelled (``framework cancel``);
        :class:`~framework.errors.DataTooLargeError` for a task over the queue's 64 KiB
        without a payload store; :class:`~framework.runtime.operations.actions.UnknownApp` for a
        missing app with ``create=False``.  While no worker of the app has registered its
        task types, ``name`` cannot be checked: the task is queued and a
        ``client.task_type_unchecked`` warning says so (:meth:`task_types` tells it
        beforehand); one more read per submit until a worker has registered."""
        if await self.session.exists(self.app.cancel) is not None:
            raise errors.ConfigurationError(
                f"application {self.app.name!r} is cancelled: it takes no new tasks "
                f"(framework resume {self.app.name}, or purge the app to start again)"
            )
        options = SubmitOptions(key=key, time_limit=time_limit, priority=priority,
                                countdown=countdown, eta=eta, expires=expires,
                                soft_time_limit=soft_time_limit, on_success=on_success,
                                on_failure=on_failure, queue=queue)
        submitter = await self._submitter()
        task = await submitter.submit(name, payload, options, check_existing=True)
        if not self._types_seen and not await self.task_types():
            self.unchecked(self.app.name, name)
        return task

    @staticmethod
    def unchecked(app: str, name: str) -> None:
        """Called when a task of type ``name`` was queued unchecked (no worker of ``app``
        has registered its types yet): a ``client.task_type_unchecked`` warning.  Replace
        it on an instance to say it otherwise (``framework submit`` prints one line)."""
        log.warning("client.task_type_unchecked", app=app, task_type=name,
                    why="no worker of the app has registered its task types yet",
                    queue="default until a worker registers the type, then the type's")

    async def task_types(self) -> dict[str, TypeInfo]:
        """The task types the app's workers registered (its catalog: one read); empty
        while no worker of the app has started, when a submitted name cannot be checked."""
        types = (await Submitter(self.session, self.app, WorkQueue(
            self.session, self.app.tasks)).catalog.read()).types
        self._types_seen = self._types_seen or bool(types)
        return types

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
        :class:`trio.TooSlowError` after ``timeout`` seconds (``None``: no limit), saying
        which task it waited for."""
        validate_name("task key", key)
        path = self.app.result_path(key)
        if not wait or timeout is None:
            return await read_result(self.session, path, wait=wait)
        with trio.move_on_after(timeout):
            return await read_result(self.session, path, wait=True)
        raise trio.TooSlowError(f"no result for task {key!r} of {self.app.name!r} within "
                                f"{timeout:g}s")

    async def cancel(self, *, by: str = "") -> bool:
        """Mark the app cancelled (its ``cancel`` node, which masters and workers watch);
        ``False`` if it already was.  :class:`~framework.runtime.operations.actions.UnknownApp` (a
        :class:`NoNodeError`) if there is no such app."""
        return await actions.cancel(self.session, self.app, by=by)

    async def resume(self) -> CancelRecord | None:
        """Undo a cancel (delete the ``cancel`` node): new tasks are taken again and masters
        and workers started from now on run.  Returns the cancel record deleted, ``None``
        if the app was not cancelled; :class:`~framework.runtime.operations.actions.UnknownApp` if
        there is no such app."""
        return await actions.resume(self.session, self.app)

    async def rerun(self, *, by: str = "") -> PastRun:
        """Start a new generation of the app's finished job (see
        :func:`framework.runtime.operations.actions.rerun`); returns the generation kept in
        history."""
        return await actions.rerun(self.session, self.app, by=by)

    async def revoke(self, task_id: str, *, by: str = "") -> Revocation:
        """Revoke task ``task_id``: a queued (or delayed) one is acknowledged without running
        when a worker takes it, a running one has its handler cancelled at once (each
        worker watches ``revoked/``); either way it is recorded with outcome ``revoked``
        and never retried.  Returns what was done: :attr:`Revocation.FINISHED` (its result
        record exists: nothing to revoke), :attr:`Revocation.ALREADY` or
        :attr:`Revocation.REVOKED`.

        Only a task that is there can be revoked (as RQ's ``cancel_job``): an id that is not
        queued, delayed or running and has no result raises :class:`UnknownTask`, and
        nothing is recorded, so a task submitted later with that id (or key) runs.  Looking
        for it costs a few reads, and for an id submitted without a key one read per queued
        item (:mod:`framework.runtime.operations.task_lookup`).  If the task finishes while it is
        revoked, the revoke is taken back (:attr:`Revocation.FINISHED`).
        :class:`~framework.runtime.operations.actions.UnknownApp` (a :class:`NoNodeError`) if there
        is no such app."""
        validate_name("task id", task_id)
        await actions.require_app(self.session, self.app)
        result_path = self.app.result_path(task_id)
        node = f"{self.app.revoked}/{task_id}"
        if await self.session.exists(result_path) is not None:
            return Revocation.FINISHED
        if await self.session.exists(node) is not None:
            return Revocation.ALREADY
        if await where_is(self.session, self.app, task_id) is None:
            if await self.session.exists(result_path) is not None:
                return Revocation.FINISHED  # it finished while we looked
            raise UnknownTask(
                f"no task {task_id!r} of {self.app.name!r} is queued, delayed or running, "
                f"and it has no result: nothing revoked (framework status {self.app.name})")
        await self.session.ensure_path(self.app.revoked)
        record = records.encode(RevokeRecord(time.time(), by))
        try:
            await self.session.create(node, record)
        except errors.NodeExistsError:
            return Revocation.ALREADY
        ended = await read_result(self.session, result_path)
        if ended is not None and ended.outcome is not Outcome.REVOKED:
            # it finished meanwhile: a revoke left behind would stop a later resubmission
            await self.session.delete(node, missing_ok=True)
            return Revocation.FINISHED
        return Revocation.REVOKED

    async def processes(self) -> tuple[int, int]:
        """How many masters (leader and standbys) and workers of the app are alive."""
        return await actions.processes(self.session, self.app)

    async def purge(self, *, force: bool = False, grace: float = 30.0, by: str = "") -> bool:
        """Delete the app's whole subtree (queue, results, dead letters, config...);
        ``False`` if there was none.  Refused (:class:`~framework.runtime.operations.actions.
        ActionError`) while a master or worker is alive, unless ``force``: then the app is
        cancelled first and the delete waits (watches) until its processes have drained and
        left, for at most ``grace`` seconds (see
        :func:`framework.runtime.operations.actions.purge`)."""
        return await actions.purge(self.session, self.app, force=force, grace=grace, by=by)

    async def purge_queue(self, queue: str, *, by: str = "") -> int:
        """Delete every task waiting in queue ``queue`` (``default`` or a named one; Celery's
        ``purge -Q``); returns how many.  Refused
        (:class:`~framework.runtime.operations.actions.ActionError`) while a live worker serves it
        (see :func:`framework.runtime.operations.actions.purge_queue`)."""
        await actions.require_app(self.session, self.app)
        return await actions.purge_queue(self.session, self.app, queue, by=by)

    async def requeue(self, dead_letter: str) -> str:
        """Put dead letter ``dead_letter`` (a :attr:`DeadLetter.name`) back in the queue
        with a fresh count of deliveries; returns the new item's name.  At-least-once: the
        put comes before the dead letter's delete."""
        return await actions.requeue(self.session, self.app.name, dead_letter)

    async def discard(self, dead_letter: str) -> None:
        """Delete dead letter ``dead_letter`` for good."""
        await actions.discard(self.session, self.app.name, dead_letter)

    async def dead_letters(self) -> list[DeadLetter]:
        """The app's dead letters, oldest first, each with the error of its final failure:
        one per task key, the newest (a key given up again after a resubmission names its
        earlier dead letters in :attr:`DeadLetter.older`; requeue the newest, discard the
        older ones)."""
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
        return newest_per_key(await self._oldest_first(out))

    async def _oldest_first(self, letters: list[DeadLetter]) -> list[DeadLetter]:
        """``letters`` in the order they were made (their nodes' creation zxids, read
        together); one deleted meanwhile is dropped."""
        made: dict[str, int] = {}

        async def stat(name: str) -> None:
            found = await self.session.exists(f"{self.app.dead}/{name}")
            if found is not None:
                made[name] = found.czxid

        await gather(*[functools.partial(stat, d.name) for d in letters])
        return sorted((d for d in letters if d.name in made), key=lambda d: made[d.name])


def newest_per_key(letters: list[DeadLetter]) -> list[DeadLetter]:
    """``letters`` (oldest first) with one per task key: the last, naming the others in
    ``older``; letters without a key (undecodable) are all kept."""
    last: dict[str, int] = {}
    for n, letter in enumerate(letters):
        if letter.key is not None:
            last[letter.key] = n
    kept = []
    for n, letter in enumerate(letters):
        if letter.key is None:
            kept.append(letter)
        elif last[letter.key] == n:
            older = tuple(d.name for d in letters[:n] if d.key == letter.key)
            kept.append(attrs.evolve(letter, older=older))
    return kept
