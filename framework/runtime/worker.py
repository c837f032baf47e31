"""``Worker``: subclass it and implement ``handle`` (pull mode) and/or ``serve_shard`` (push).

A worker joins the application's group with its status (address, load, health, counts), takes
tasks from the shared queue (at-least-once: an item is deleted only after ``handle`` returned
and its result was recorded), follows the ready-znode configuration, and serves the shards the
master assigns to it.

Crash safety:

* A task's claim is an ephemeral node of this worker's session: kill -9 the worker and the
  task goes back to the queue for another worker.
* A result record is written before the item is acknowledged; a task whose key already has a
  successful record is acknowledged without running again (idempotency key).
* Shards are served only while the session is trusted: on SUSPENDED past the session's trust
  deadline (or ``suspended_grace``, if set and shorter) or on LOST every shard body is
  cancelled (the master will give them to someone else), and the worker follows its
  assignments again once reconnected.

Graceful stop (SIGTERM/Ctrl-C via the runner, or :meth:`request_stop`): stop taking, let
in-flight tasks finish for up to ``drain_timeout`` seconds (then cancel them: their items are
redelivered), stop shards, leave the group.  A slot whose claim lands just as the drain
begins, before its handler starts, hands the item back unstarted (its ``running/`` marker
goes in the same transaction; no delivery is counted).
"""

from __future__ import annotations

import inspect
import json
import math
import os
import pickle
import socket
import threading
import time
import traceback
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import attrs
import trio

from framework import errors, metrics
from framework.logs import get_logger
from framework.primitives import ConfigStore, Group
from framework.primitives.queue import ClaimExtras, Finisher, QueueItem, WorkQueue
from framework.retry import Backoff
from framework.runtime.app import App, check_name, ensure_layout, ensure_result_buckets
from framework.runtime.cancel import wait_cancelled
from framework.runtime.tasks import FAILURE_RING, Task, TaskResult, new_task
from framework.zk import Session, cleanup_scope, validate_path, wait_gone, watch_children
from framework.zk.scopes import single_body_error

log = get_logger("framework.runtime.worker")


class _HandedBack(Exception):
    """A handler failed; its error is recorded and the item goes back to the queue."""


class _GivenUp(_HandedBack, errors.PermanentFailure):
    """A task failed for good (its result cannot be stored, or the handler said retrying
    cannot help): its failure is recorded and the queue dead-letters the item at once."""

#: Longest error message kept in a failure record (a record must fit in one znode).
MAX_ERROR_CHARS = 4000

#: Longest traceback kept in a failure record (its end: the frames nearest the error).
MAX_TRACEBACK_CHARS = 8000


class Worker:
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
    :meth:`ready`).

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

    app_name: str | None = None
    concurrency: int = 1
    max_attempts: int = 5
    backoff_base: float = 0.2
    backoff_max: float = 10.0
    time_limit: float | None = None
    drain_timeout: float = 30.0
    status_interval: float = 1.0
    suspended_grace: float | None = None  # None: until the session's trust deadline
    lease: float | None = 30.0  # a task's claim is renewed within this (None: no lease)
    handler_pool: str = "thread"  # where a plain-def handle runs: "thread" or "process"
    confirm_after: float | None = 1.0  # seconds until a serving record is confirmed (ready)

    def __init__(self, app: App | str | None = None, *, name: str | None = None,
                 address: str = "") -> None:
        app = app if app is not None else self.app_name
        if app is None:
            raise errors.ConfigurationError(
                f"{type(self).__name__} needs an application: set app_name or pass --app"
            )
        self.app = app if isinstance(app, App) else App(app)
        self._blocking = _blocking_handler(type(self))
        self.name = check_name("worker name", name or f"{socket.gethostname()}-{os.getpid()}")
        self.address = address
        self.config: Any = None
        self.session: Session | None = None
        self.tasks_done = 0
        self.tasks_failed = 0
        self._in_flight = 0
        self._shards: set[str] = set()
        self._assigned: frozenset[str] = frozenset()
        self._draining = False
        self._waiting: set[trio.CancelScope] = set()
        self._stop_requested = trio.Event()
        self._status_dirty = trio.Event()
        self._markers: dict[str, _Marker] = {}  # running/ path -> this worker's marker
        self._stuck_threads = 0  # handler threads abandoned at their time limit, still running
        self._threads_lock = threading.Lock()
        self._processes: Any = None  # the trio-parallel context of a process pool

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

    @asynccontextmanager
    async def ready(self, shard: str, info: Any = None) -> AsyncIterator[bool]:
        """Say that this worker serves ``shard`` for as long as the block runs: the runtime
        creates the ephemeral ``deployed/<shard>/<worker>`` record with ``info`` (bytes, or
        JSON), and withdraws it when the block ends (unassigned, error, stop) - before
        the code after the block runs, so a serving record never outlives the serving.
        When the session cannot be trusted the block is cancelled at once and nothing
        waits on ZooKeeper: the record goes with the session, or, if the session survives,
        is withdrawn as soon as it is connected again (:meth:`Session.delete_later`).
        Yields False, creating nothing, when the shard is no longer wanted (its
        ``deployed/<shard>`` directory is gone): return then.

        One record per block (incarnation): a JSON object ``info`` gets an
        ``"incarnation"`` key, a record of ours left from an earlier block is deleted and
        created anew (never adopted), and a withdrawal of an earlier block still pending
        (:meth:`Session.delete_later`) is waited for first - so a late clean-up can never
        delete the record of the block that runs now.

        Confirmation: ``confirm_after`` seconds into the block, if the session is still
        trusted, the record is written again (version 0 -> 1).  The leader drops a replica
        of a shard only when every replica that stays has a confirmed record, checked in
        the same transaction (:mod:`framework.runtime.replicated`): a worker that froze
        right after it announced (a pause with its session still alive) is never left as
        the only replica."""
        session = self.session
        if session is None:
            raise errors.NotConnectedError("the worker is not running")
        path = f"{self.app.deployed_dir(shard)}/{self.name}"
        if isinstance(info, bytes):
            data = info
        else:
            doc = info or {}
            if isinstance(doc, dict):
                doc = {**doc, "incarnation": os.urandom(8).hex()}
            data = json.dumps(doc).encode()
        while any(p.path == path for p in session.leftovers):
            await session.wait_leftovers_done()  # an earlier block's withdrawal first
        listed = False
        created_in: int | None = None
        try:
            listed = await _announce(session, path, data)
            created_in = session.session_id
            if listed:
                log.info("shard.ready", worker=self.name, shard=shard)
            with single_body_error():
                async with trio.open_nursery() as nursery:
                    if listed and self.confirm_after is not None:
                        nursery.start_soon(self._confirm, session, shard, path, data,
                                           created_in)
                    yield listed
                    nursery.cancel_scope.cancel()
        finally:
            withdrawn = False
            if listed and session.connected and session.session_id == created_in:
                with trio.CancelScope(shield=True), trio.move_on_after(2):
                    try:
                        await session.delete(path, missing_ok=True)
                        withdrawn = True
                    except errors.ZooKeeperError:
                        pass
            if listed and not withdrawn and created_in is not None:
                # not now (suspended, or no reply in time): as soon as the session is back,
                # if it survived; if it did not, the record went with it
                session.delete_later(path, data=data, session_id=created_in)

    async def _confirm(self, session: Session, shard: str, path: str, data: bytes,
                       created_in: int | None) -> None:
        """Write our serving record again ``confirm_after`` seconds after announcing it,
        if the session is still trusted (see :meth:`ready`).  Never raises: an
        untrusted session ends the block through the guard anyway."""
        assert self.confirm_after is not None
        await trio.sleep(self.confirm_after)
        try:
            session.ensure_trusted(created_in)
            await session.set(path, data, version=0)
        except (errors.SessionInterrupted, errors.ZooKeeperError) as exc:
            log.warning("shard.confirm_failed", worker=self.name, shard=shard,
                        error=f"{type(exc).__name__}: {exc}")
            return
        log.info("shard.confirmed", worker=self.name, shard=shard)

    @property
    def assigned_shards(self) -> frozenset[str]:
        """The shards assigned to this worker in the newest listing of its assignments
        (push mode).  Unchanged while the session cannot be trusted (the worker does not
        know better then): a shard whose ``serve_shard`` is cancelled but still listed here
        was stopped by the session, not unassigned - keep what it needs to serve again."""
        return self._assigned

    async def on_assignments(self, shards: frozenset[str]) -> None:
        """Called with each new listing of this worker's assignments (push mode), before
        the shards that left it are cancelled and the new ones started.  Keep it short
        (the next listing waits for it).  Default: nothing."""

    async def on_config(self, config: Any) -> None:
        """Called with each new complete configuration (the paper's ready-znode protocol)."""

    def health(self) -> dict[str, Any]:
        """Reported in the worker's group node; override to add checks."""
        return {"ok": True}

    def status_changed(self) -> None:
        """Ask for the group status (with :meth:`health`) to be published again soon.

        The runtime republishes on its own when the task load changes; call this when
        something else that :meth:`health` reports changed (a new configuration applied...).
        """
        self._status_dirty.set()

    @property
    def backoff(self) -> Backoff:
        """The retry delays of this worker (``backoff_base`` doubling up to ``backoff_max``,
        with jitter): a failed task's retry, a slot in trouble, a shard that failed."""
        return Backoff(self.backoff_base, self.backoff_max)

    @property
    def takes_tasks(self) -> bool:
        """Whether this worker pulls from the task queue (it does if it overrides handle)."""
        return type(self).handle is not Worker.handle

    async def report_progress(self, task: Task, done: float, total: float | None = None,
                              message: str = "") -> None:
        """Publish progress of a running task (shown by ``framework status``)."""
        assert self.session is not None
        marker = self._markers.get(f"{self.app.running}/{task.id}")
        if marker is None:
            raise errors.ConfigurationError(
                f"report_progress() for task {task.id!r}, which this worker is not running"
            )
        progress = {"done": done, "total": total, "message": message, "at": time.time()}
        try:
            stat = await self.session.set(marker.path, marker.encode(progress),
                                          version=marker.version)
        except (errors.BadVersionError, errors.NoNodeError):
            return  # the marker is no longer ours: this delivery lost its claim
        marker.version = stat.version

    async def submit(self, payload: Any, *, task_id: str | None = None,
                     idempotency_key: str | None = None, time_limit: float | None = None,
                     priority: int = 0) -> Task:
        """Queue a follow-up task (a crawler queues the links it found, say)."""
        if self.session is None:
            raise errors.NotConnectedError("the worker is not running")
        task = new_task(payload, task_id=task_id, idempotency_key=idempotency_key,
                        time_limit=time_limit)
        await WorkQueue(self.session, self.app.tasks).put(task.encode(), priority=priority)
        return task

    def request_stop(self) -> None:
        """Begin a graceful stop (idempotent)."""
        if not self._draining:
            log.info("worker.draining", app=self.app.name, worker=self.name,
                     in_flight=self._in_flight)
        self._draining = True
        self._stop_requested.set()
        for scope in list(self._waiting):
            scope.cancel()
        self._status_dirty.set()

    # ------------------------------------------------------------ runtime

    def status(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "address": self.address,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "state": "draining" if self._draining else "running",
            "load": self._in_flight / max(self.concurrency, 1),
            "in_flight": self._in_flight,
            "done": self.tasks_done,
            "failed": self.tasks_failed,
            "shards": sorted(self._shards),
            "stuck_threads": self._stuck_threads,
            "health": self.health(),
            "at": time.time(),
        }

    async def run(self, session: Session) -> None:
        """Serve until :meth:`request_stop`; returns after a graceful drain."""
        self.session = session
        app = self.app
        await ensure_layout(session, app, app.tasks, app.running, app.results, app.failures,
                            app.dead, app.assignment_dir(self.name), app.shards)
        group = Group(session, app.workers)
        queue = WorkQueue(session, app.tasks, max_attempts=self.max_attempts,
                          dead_letter=app.dead, lease=self.lease,
                          claim_with=self._claim_extras)
        if self.takes_tasks:
            await ensure_result_buckets(session, app)  # before the first claim's probe
        async with self._handler_pool(), \
                group.join(self.name, json.dumps(self.status()).encode()) as member:
            log.info("worker.joined", app=app.name, worker=self.name)
            async with trio.open_nursery() as background:
                background.start_soon(self._report_status, member)
                background.start_soon(self._follow_config, session)
                background.start_soon(self._follow_assignments, session)
                background.start_soon(self._follow_cancel, session)
                if self.takes_tasks:
                    async with trio.open_nursery() as slots:
                        for _ in range(self.concurrency):
                            slots.start_soon(self._slot, session, queue)
                        # the timer lives outside the slots: a quick drain exits at once
                        background.start_soon(self._drain_deadline, slots.cancel_scope)
                else:
                    await self._stop_requested.wait()
                background.cancel_scope.cancel()
            with cleanup_scope(session):
                try:
                    await member.update(
                        json.dumps(self.status() | {"state": "stopped"}).encode()
                    )
                except errors.ZooKeeperError:
                    pass  # the group node is ephemeral: it goes with the session
        log.info("worker.stopped", app=app.name, worker=self.name, done=self.tasks_done,
                 failed=self.tasks_failed)

    @asynccontextmanager
    async def _handler_pool(self) -> AsyncIterator[None]:
        """The pool a plain-def ``handle`` runs in, for as long as the worker runs.  Its
        limiter is unbounded: the slots bound the calls, and an abandoned thread keeps its
        token until it returns."""
        self._pool_limiter = trio.CapacityLimiter(math.inf)
        if not (self._blocking and self.handler_pool == "process"):
            yield
            return
        import trio_parallel  # only a process pool needs it

        async with trio_parallel.open_worker_context(grace_period=1.0) as context:
            self._processes = context
            try:
                yield
            finally:
                self._processes = None

    async def _follow_cancel(self, session: Session) -> None:
        """Drain and leave once the app is cancelled (``framework cancel``)."""
        await wait_cancelled(session, self.app)
        log.warning("worker.cancelled", app=self.app.name, worker=self.name)
        self.request_stop()

    async def _drain_deadline(self, slots: trio.CancelScope) -> None:
        await self._stop_requested.wait()
        await trio.sleep(self.drain_timeout)
        log.warning("worker.drain_timeout", worker=self.name, in_flight=self._in_flight)
        slots.cancel()

    async def _slot(self, session: Session, queue: WorkQueue) -> None:
        trouble = 0  # consecutive failures of the slot itself (not of handlers)
        while not self._draining:
            if trouble:
                # a persistent problem (e.g. the app's znodes deleted under us) must not
                # turn into a busy loop: back off, exponentially, up to backoff_max
                await self.backoff.sleep(trouble)
            marker: list[_Marker] = []
            try:
                with trio.CancelScope() as slot:
                    # request_stop cancels only slots still waiting for an item
                    self._waiting.add(slot)
                    try:
                        async with queue.take() as item:
                            self._waiting.discard(slot)
                            # an exception leaving this block hands the item back
                            await self._handle_item(session, queue, item, marker)
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
                log.warning("task.released", worker=self.name, error=str(exc), retry=trouble)
            except Exception:
                trouble += 1
                log.exception("worker.slot_error", worker=self.name, retry=trouble)

    async def _mark_running(self, session: Session, running: str, task: Task,
                            item: QueueItem, marker: list[_Marker]) -> None:
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
                owner = await _marker_owner(session, running)
                if owner is None:
                    continue
                delivery, owner_session, version = owner
                if (delivery, owner_session) == (mine.delivery,
                                                 await session.wait_connected()):
                    mine.version = version
                    marker.append(mine)
                    return
                if _earlier_delivery_of(delivery, item):
                    log.warning("task.stale_marker_taken_over", task=task.id,
                                worker=self.name, other=delivery)
                    try:
                        await session.delete(running, version=version)
                    except (errors.BadVersionError, errors.NoNodeError):
                        pass
                    continue
                log.info("task.same_id_running", task=task.id, worker=self.name,
                         other=delivery)
                await wait_gone(session, running)
        except BaseException:
            # interrupted while our create may have been applied: never leave an orphan
            # marker behind, it would hold up every later delivery of this task id
            with cleanup_scope(session):
                try:
                    owner = await _marker_owner(session, running)
                    if owner is not None and owner[0] == mine.delivery:
                        await session.delete(running, version=owner[2])
                except errors.ZooKeeperError:
                    pass  # the session ended (so did its ephemeral marker), or not ours
            raise

    async def _clear_running(self, session: Session, marker: list[_Marker]) -> None:
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
                    owner = await _marker_owner(session, mine.path)
                    if owner is not None and owner[0] == mine.delivery:
                        await session.delete(mine.path, version=owner[2])
                except errors.ZooKeeperError:
                    pass  # not ours any more, or the session (and the marker) ended

    def _claim_extras(self, item: QueueItem) -> ClaimExtras | None:
        """What a task's claim commits with it: the delivery's ``running/`` marker, and
        a probe that the task has no result record (created and deleted again in the same
        transaction: refused if one exists).  Refused (another delivery of the same id
        runs, an earlier one's marker is left, a record exists), the task is claimed
        alone and :meth:`_handle_item` takes the slow path (marker, then record read)."""
        try:
            task = Task.decode(item.data, item.attempts)
            running = f"{self.app.running}/{task.id}"
            record = self.app.result_path(task.key)
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

    def _new_marker(self, running: str, task: Task, item: QueueItem) -> _Marker:
        return _Marker(running, f"{self.name}/{item.name}/{item.attempts}",
                       {"worker": self.name, "started": time.time(), "attempt": task.attempts})

    async def _handle_item(self, session: Session, queue: WorkQueue, item: QueueItem,
                           marker: list[_Marker]) -> None:
        """Run one delivery.  ``item.attempts`` counts deliveries, this one included."""
        previous_version: int | None = None  # the result record's version, if one exists
        if item.extras is not None:
            # claimed with its marker, and no result record existed then
            task, mine = item.extras.payload
            marker.append(mine)
            running = mine.path
        else:
            task = Task.decode(item.data, item.attempts)
            running = f"{self.app.running}/{task.id}"
        limit = task.time_limit or self.time_limit
        if limit:
            # past its limit (and the retry backoff) a handler that did not stop is stuck:
            # stop renewing the claim's lease, so the task goes to another worker
            queue.renew_for(item, limit + self.backoff_max + 1.0)
        if item.extras is None:
            await self._mark_running(session, running, task, item, marker)
        self._markers[running] = marker[0]
        record = self.app.result_path(task.key)
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
        self._in_flight += 1
        self._status_dirty.set()
        metrics.task_started(self.app.name)
        started = time.time()
        try:
            value = await self._call_within(task, limit)
        except Exception as exc:
            await self._failed(session, task, exc, started)
            # leaving take() with an error hands the item back (or buries it for good)
            handed_back = _GivenUp() if isinstance(exc, errors.PermanentFailure) else _HandedBack()
            raise handed_back from exc
        finally:
            self._in_flight -= 1
            self._status_dirty.set()
            metrics.task_ended(self.app.name)
        result = TaskResult(task.id, True, self.name, task.attempts, value, started_at=started,
                            key=task.key)
        try:
            encoded = result.encode()
        except errors.PermanentFailure as exc:
            await self._failed(session, task, exc, started)
            raise _GivenUp() from None
        # the result is written in the transaction that acknowledges the item (and deletes
        # our marker), combined with the other slots' acks; if the server refuses the
        # record's part (a record written meanwhile), it is written alone before the ack
        mine = marker[0]

        def build(txn: Any) -> None:
            if previous_version is None:
                txn.create(record, encoded)
            else:
                txn.set(record, encoded, version=previous_version)
            txn.delete(mine.path, version=mine.version)

        async def fallback() -> None:
            await _put(session, record, encoded)

        finisher = Finisher(build, fallback)
        queue.finish_with(item, finisher)
        mine.finisher = finisher
        self.tasks_done += 1
        metrics.task_finished(self.app.name, True, time.time() - started)
        log.info("task.done", task=task.id, worker=self.name, attempt=task.attempts,
                 seconds=round(time.time() - started, 3))

    async def _call_within(self, task: Task, limit: float | None) -> Any:
        """``handle(task)`` within ``limit`` seconds, or :class:`trio.TooSlowError`.

        A handler that did not stop at its limit (an ``async def`` blocked in a thread it
        does not abandon, or one that swallowed the cancellation) fails all the same once it
        returns: its result is never recorded as a success."""
        call = _ThreadCall()
        if not limit:
            return await self._call_handler(task, call)
        deadline = trio.current_time() + limit
        ends_by = time.monotonic() + limit
        with trio.CancelScope(deadline=deadline) as limited:
            value = await self._call_handler(task, call)
        if call.returned_at is not None and call.returned_at <= ends_by:
            # a thread that returned in time, picked up late (a busy event loop)
            if call.error is not None:
                raise call.error
            return call.value
        if limited.cancelled_caught:
            raise trio.TooSlowError
        ended = time.monotonic() if call.returned_at is None else call.returned_at
        overran = ended - ends_by
        if overran > 0:
            log.warning("task.time_limit_ignored", task=task.id, worker=self.name,
                        limit=limit, overran=round(overran, 3))
            raise trio.TooSlowError
        return value

    async def _call_handler(self, task: Task, call: _ThreadCall) -> Any:
        """``handle(task)``: awaited, or a plain ``def`` run in the thread or process pool
        (a thread records in ``call`` when it returned, and what)."""
        if not self._blocking:
            return await self.handle(task)
        if self._processes is not None:
            fields = {"app": self.app, "name": self.name, "address": self.address,
                      "config": self.config}
            # cancelled (time limit, drain timeout): the process is killed
            return await self._processes.run_sync(_handle_in_process, type(self), fields,
                                                  task, kill_on_cancel=True,
                                                  limiter=self._pool_limiter)

        def run() -> Any:
            try:
                call.value = _returned(type(self), self.handle(task))
                return call.value
            except BaseException as exc:
                call.error = exc
                raise
            finally:
                with self._threads_lock:
                    call.finished = True
                    call.returned_at = time.monotonic()
                    if call.abandoned:
                        self._stuck_threads -= 1

        try:
            return await trio.to_thread.run_sync(run, abandon_on_cancel=True,
                                                 limiter=self._pool_limiter)
        except trio.Cancelled:
            # a thread cannot be killed: it runs on, its result will be dropped
            with self._threads_lock:
                if not call.finished:
                    call.abandoned = True
                    self._stuck_threads += 1
            if call.abandoned:
                log.warning("task.thread_abandoned", task=task.id, worker=self.name,
                            stuck_threads=self._stuck_threads)
            raise

    async def _failed(self, session: Session, task: Task, exc: Exception,
                      started: float) -> None:
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
        final = task.attempts >= self.max_attempts or isinstance(exc, errors.PermanentFailure)
        metrics.task_finished(self.app.name, False, time.time() - started, final=final)
        trace = "".join(traceback.format_exception(exc))
        if len(trace) > MAX_TRACEBACK_CHARS:
            trace = f"... ({len(trace):,} characters)\n" + trace[-MAX_TRACEBACK_CHARS:]
        log.warning("task.failed", task=task.id, key=task.key, worker=self.name, error=error,
                    attempt=task.attempts, final=final, exc_info=exc)
        result = TaskResult(task.id, False, self.name, task.attempts, None, error,
                            started_at=started, finished_at=ended, key=task.key,
                            traceback=trace)
        with cleanup_scope(session):
            try:
                node = await session.create(f"{self.app.failures}/f-", result.encode(),
                                            sequence=True)
                old = int(node[-10:]) - FAILURE_RING
                if old >= 0:
                    await session.delete(f"{self.app.failures}/f-{old:010d}", missing_ok=True)
                if final:
                    await _put(session, self.app.result_path(task.key), result.encode())
            except errors.ZooKeeperError:
                pass
        if not final:
            # hold the claim for a while so the retry is delayed (exponential backoff)
            await self.backoff.sleep(task.attempts)

    async def _report_status(self, member: Any) -> None:
        last = None
        while True:
            await self._status_dirty.wait()
            self._status_dirty = trio.Event()
            doc = self.status()
            comparable = {k: v for k, v in doc.items() if k != "at"}
            if comparable != last:
                last = comparable
                try:
                    await member.update(json.dumps(doc).encode())
                except errors.ZooKeeperError as exc:
                    log.warning("worker.status_failed", error=str(exc))
            await trio.sleep(self.status_interval)  # rate limit, not synchronisation

    async def _follow_config(self, session: Session) -> None:
        store: ConfigStore[Any] = ConfigStore(session, self.app.config)
        async for config in store.watch():
            self.config = config
            log.info("worker.config", worker=self.name)
            await self.on_config(config)

    async def _follow_assignments(self, session: Session) -> None:
        """Serve exactly the shards assigned to us, and only while our session is trusted."""
        mine = self.app.assignment_dir(self.name)
        while True:
            await session.wait_connected()
            try:
                async with session.guard(suspended_grace=self.suspended_grace):
                    async with trio.open_nursery() as nursery:
                        scopes: dict[str, trio.CancelScope] = {}
                        async for snap in watch_children(session, mine):
                            wanted = set(snap.children)
                            self._assigned = frozenset(wanted)
                            await self.on_assignments(self._assigned)
                            for shard in set(scopes) - wanted:
                                scopes.pop(shard).cancel()
                            for shard in wanted - set(scopes):
                                scopes[shard] = await nursery.start(self._serve, session, shard)
            except errors.SessionInterrupted as exc:
                log.warning("worker.shards_dropped", worker=self.name, reason=exc.reason)
                self._shards.clear()
                self._status_dirty.set()

    async def _serve(self, session: Session, shard: str,
                     task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Serve one assigned shard until it is unassigned.  ``serve_shard`` raising does not
        stop the worker (nor its other shards): the error is logged and the shard served
        again after a backoff, as long as it stays assigned to us."""
        with trio.CancelScope() as scope:
            task_status.started(scope)
            failures = 0
            while True:
                try:
                    await self._serve_once(session, shard)
                    return
                except errors.SessionInterrupted:
                    raise  # the session cannot be trusted: every shard stops
                except errors.PermanentFailure as exc:
                    await self._refuse(session, shard, exc)
                    await trio.sleep_forever()  # until unassigned: never retried here
                except Exception as exc:
                    failures += 1
                    delay = self.backoff.delay(failures)
                    log.error("shard.failed", worker=self.name, shard=shard,
                              error=f"{type(exc).__name__}: {exc}", retry_in=delay,
                              exc_info=exc)
                    await trio.sleep(delay)

    async def _refuse(self, session: Session, shard: str, exc: Exception) -> None:
        """Record that this worker cannot serve ``shard`` (replicated push mode): a
        persistent ``refused/<shard>/<worker>``, never creating parents."""
        log.error("shard.refused", worker=self.name, shard=shard, error=str(exc))
        data = json.dumps({"worker": self.name, "error": str(exc)[:MAX_ERROR_CHARS]}).encode()
        path = f"{self.app.refused_dir(shard)}/{self.name}"
        try:
            await session.create(path, data)
        except errors.NodeExistsError:
            await session.set(path, data)
        except errors.NoNodeError:
            pass  # not a replicated shard, or no longer wanted

    async def _serve_once(self, session: Session, shard: str) -> None:
        try:
            spec, _ = await session.get(f"{self.app.shards}/{shard}")
        except errors.NoNodeError:
            spec = b""
        self._shards.add(shard)
        self._status_dirty.set()
        log.info("shard.serving", worker=self.name, shard=shard)
        try:
            await self.serve_shard(shard, spec)
        finally:
            self._shards.discard(shard)
            self._status_dirty.set()
            log.info("shard.released", worker=self.name, shard=shard)


#: Where a plain-def ``handle`` can run (``Worker.handler_pool``).
HANDLER_POOLS = ("thread", "process")


def _blocking_handler(cls: type[Worker]) -> bool:
    """Whether ``cls.handle`` is a plain ``def`` (run in the handler pool) rather than an
    ``async def``; a mistake in either is a one-line :class:`ConfigurationError` at start."""
    name = cls.__name__
    for method in ("serve_shard", "on_config"):
        if not inspect.iscoroutinefunction(getattr(cls, method, None)):
            raise errors.ConfigurationError(
                f"{name}.{method} must be 'async def' (it is not): the runtime awaits it"
            )
    if cls.handler_pool not in HANDLER_POOLS:
        raise errors.ConfigurationError(
            f"{name}.handler_pool must be 'thread' or 'process', got {cls.handler_pool!r}"
        )
    handle = getattr(cls, "handle", None)
    if not callable(handle):
        raise errors.ConfigurationError(
            f"{name}.handle must be a method ('async def' or 'def'), got a "
            f"{type(handle).__name__}"
        )
    if inspect.iscoroutinefunction(handle):
        if cls.handler_pool == "process":
            raise errors.ConfigurationError(
                f"{name}.handle is 'async def' but handler_pool is 'process': a process "
                "pool runs a plain 'def handle' (drop the 'async', or the process pool)"
            )
        return False
    if inspect.isasyncgenfunction(handle) or inspect.isgeneratorfunction(handle):
        raise errors.ConfigurationError(
            f"{name}.handle must return its result, not yield (it is a generator)"
        )
    if inspect.iscoroutinefunction(inspect.unwrap(handle)):
        raise errors.ConfigurationError(
            f"{name}.handle is a plain function wrapping an 'async def' (a decorator hides "
            "the coroutine): make the wrapper 'async def' too"
        )
    if cls.handler_pool == "process":
        try:
            pickle.dumps(cls)
        except (pickle.PicklingError, AttributeError, TypeError) as exc:
            raise errors.ConfigurationError(
                f"{name} uses handler_pool = 'process', so it must be importable by name "
                f"(a class at module level): {exc}"
            ) from None
    return True


def _returned(cls: type[Worker], value: Any) -> Any:
    """A plain-def handler's value; a coroutine (an async-ness mistake) fails for good."""
    if inspect.isawaitable(value):
        if inspect.iscoroutine(value):
            value.close()  # never awaited: no "coroutine was never awaited" warning
        raise errors.PermanentFailure(
            f"{cls.__name__}.handle is a plain 'def' but returned {type(value).__name__}: "
            "declare it 'async def', or return the result itself"
        )
    return value


def _handle_in_process(cls: type[Worker], fields: dict[str, Any], task: Task) -> Any:
    """Run ``cls.handle`` in a pool process, on a bare copy of the worker (no session)."""
    worker = cls.__new__(cls)
    worker.__dict__.update(fields)
    return _returned(cls, cls.handle(worker, task))


@attrs.define
class _ThreadCall:
    """A handler thread: abandoned (its task failed on time) before it finished?  When it
    returned (monotonic) and with what."""

    finished: bool = False
    abandoned: bool = False
    returned_at: float | None = None
    value: Any = None
    error: BaseException | None = None


@attrs.define
class _Marker:
    """This worker's ``running/<task id>`` node: its delivery token
    (``worker/item name/attempt``) and the version we last wrote."""

    path: str
    delivery: str
    doc: dict[str, Any]
    version: int = 0
    finisher: Finisher | None = None  # when set and applied, the ack deleted the marker

    def encode(self, progress: dict[str, Any] | None = None) -> bytes:
        return json.dumps({**self.doc, **(progress or {}), "delivery": self.delivery}).encode()


def _earlier_delivery_of(delivery: str, item: QueueItem) -> bool:
    """Whether ``delivery`` (a marker's token) is an earlier delivery of ``item``: that
    delivery's claim has ended, since ours holds the item now."""
    head, _, attempt = delivery.rpartition("/")
    _worker, _, name = head.partition("/")
    return name == item.name and attempt.isdigit() and int(attempt) < item.attempts


async def _marker_owner(session: Session, path: str) -> tuple[str, int, int] | None:
    """The delivery token, owning session and version of a ``running/`` marker (``None``:
    there is none)."""
    while True:
        try:
            await session.sync(path)
            data, stat = await session.get(path)
        except errors.NoNodeError:
            return None
        except errors.ConnectionLossError:
            await session.wait_connected()
            continue
        try:
            delivery = str(json.loads(data).get("delivery", ""))
        except (ValueError, AttributeError):
            delivery = ""
        return delivery, stat.ephemeralOwner, stat.version


async def _announce(session: Session, path: str, data: bytes) -> bool:
    """Create our ephemeral serving record (replacing a record left by an earlier block or
    session of ours); ``False`` if its directory is gone.  Never creates parents."""
    while True:
        try:
            await session.create(path, data, ephemeral=True)
            return True
        except errors.NoNodeError:
            return False
        except errors.NodeExistsError:
            # ours from an earlier block, or of an earlier session of this worker: one
            # record per block, never adopted (a clean-up pending for it must not hit ours)
            stat = await session.exists(path)
            if stat is not None:
                await session.delete(path, version=stat.version, missing_ok=True)


async def _put(session: Session, path: str, data: bytes) -> None:
    """Create or overwrite a persistent record."""
    try:
        await session.create(path, data, makepath=True)
    except errors.NodeExistsError:
        await session.set(path, data)
