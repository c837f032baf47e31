"""``Master``: subclass it and implement ``async def lead(self, ctx)``.

Every master process campaigns in the application's election; standbys wait in line, each
watching only its predecessor.  The elected one publishes its address in the rendezvous and
runs ``lead(ctx)``.  When leadership can no longer be proven (no reply from ZooKeeper for
2/3 of the session timeout, its session LOST, its election node gone) the body of ``lead``
is cancelled and the process goes back to standing by; every write made through ``ctx`` is
fenced by the leader's election node, so a deposed master's late write fails on the server.

``lead`` returning means the application's job is finished: the runtime records it in the
app's ``done`` node (a fenced write) and the process exits; a standby elected later finds that
record and exits too, without running ``lead`` again (``framework rerun APP`` starts a new
generation of the job).
``lead`` raising or being cancelled records nothing: the next leader runs it.  A new master
always resumes from ZooKeeper, never from memory.

While it leads, the master also applies the app's retention (``results/``, ``dead/``,
``failures/``: see :mod:`framework.runtime.results.retention`) every ``retention_interval`` seconds,
and every master watches the app's ``cancel`` node (:mod:`framework.runtime.operations.cancel`).
"""

from __future__ import annotations

import functools
import json
import os
import socket
import time
from collections.abc import AsyncIterator, Mapping
from datetime import datetime
from typing import Any, ClassVar, NoReturn

import attrs
import trio

from framework import errors, metrics, records
from framework.logs import get_logger
from framework.primitives import ConfigStore, Election, Group, Rendezvous, Term
from framework.primitives.queue import WorkQueue
from framework.runtime.app import (
    DEFAULT_QUEUE,
    App,
    app_of,
    check_name,
    ensure_layout,
    process_name,
)
from framework.runtime.operations.cancel import is_cancelled, wait_cancelled
from framework.runtime.placement.assignment import plan_assignment
from framework.runtime.placement.replicated import ReplicatedPlacement, StepHook, commit_fenced
from framework.runtime.records import JobDone, MasterIdentity, decode_or_none
from framework.runtime.results.retention import Retention, limits_of
from framework.runtime.scheduling.delayed import DelayedMover
from framework.runtime.scheduling.schedules import Schedule, Scheduler
from framework.runtime.submission import SubmitOptions, Submitter
from framework.runtime.tasks import FAILURE_RING, Task, TaskResult, read_result
from framework.zk import Session, cleanup_scope, gather, single_body_error

log = get_logger("framework.runtime.master")


@attrs.define
class MasterContext:
    """What a leading master can do.  Valid only inside ``lead``; every write is fenced."""

    session: Session
    app: App
    term: Term
    master: Master
    queue: WorkQueue
    config_store: ConfigStore[Any]
    retention: Retention
    submitter: Submitter
    delayed: DelayedMover

    async def apply_retention(self) -> dict[str, int]:
        """One retention pass now (the runtime runs one every ``retention_interval``);
        returns how many records of each kind it deleted."""
        return await self.retention.apply()

    # ------------------------------------------------------------ tasks (pull mode)

    async def submit(self, name: str, payload: Any = None, *, key: str | None = None,
                     time_limit: float | None = None, priority: int | None = None,
                     countdown: float | None = None, eta: float | datetime | None = None,
                     expires: float | None = None, soft_time_limit: float | None = None,
                     on_success: str | None = None, on_failure: str | None = None,
                     queue: str | None = None) -> Task:
        """Queue one task of type ``name`` (JSON payload) for the workers, now or at its
        time; returns it with its id.  The options are those of ``Client.submit``
        (:class:`~framework.runtime.submission.SubmitOptions`; each ``None`` defaults to
        the task type's), but a ``key`` that exists is queued again without a word (a new
        leader resubmitting its job; the worker skips a key whose success is recorded).
        An unknown type or a bad option is a :class:`~framework.errors.ConfigurationError`
        (see :mod:`framework.runtime.submission`)."""
        options = SubmitOptions(key=key, time_limit=time_limit, priority=priority,
                                countdown=countdown, eta=eta, expires=expires,
                                soft_time_limit=soft_time_limit, on_success=on_success,
                                on_failure=on_failure, queue=queue)
        return await self.submitter.submit(name, payload, options)

    async def submit_many(self, name: str, payloads: list[Any], *,
                          priority: int | None = None,
                          keys: list[str] | None = None,
                          queue: str | None = None) -> list[Task]:
        """Queue many tasks of type ``name`` in one pipelined burst, into ``queue``
        (default: the type's).  ``keys`` (one per payload) are their task ids and
        idempotency keys: submitting the same keys again (a new leader resubmitting the
        job, say) runs nothing twice."""
        return await self.submitter.submit_many(name, payloads, priority=priority, keys=keys,
                                                queue=queue)

    async def result(self, key: str, *, wait: bool = False) -> TaskResult | None:
        """The result record of a task id (or idempotency key), if it finished; with
        ``wait``, once it has (a watch on the record, no polling)."""
        return await read_result(self.session, self.app.result_path(key), wait=wait)

    async def is_running(self, task_id: str) -> bool:
        """Whether a worker is handling task ``task_id`` now (its ``running/`` marker)."""
        return await self.session.exists(f"{self.app.running}/{task_id}") is not None

    async def wait_idle(self) -> None:
        """Return once every queue (the default one and each named queue) is empty, no
        task is running and no delayed task is still to come (watches, no polling).

        Cost: while items are queued, two or three reads per wait for the newest item to
        go (not per task); then the last running tasks' ends, one listing each.

        A worker removes a task's ``running/`` marker only after the item left the queue (or
        went back to it), so while something runs, a change of ``running/`` is the moment
        to look again.  An item can also leave the queue with nothing running: one whose
        deliveries were used up by consumers that died is dead-lettered by the next consumer
        without being claimed.  So while nothing runs and items are queued, the queue's
        buckets are watched as well.
        """
        session = self.session
        while True:
            changed = trio.Event()
            try:
                # delayed tasks still to come: wait until the mover has queued them all
                # (it drops each minute's bucket once empty)
                try:
                    waiting = await session.children(self.app.delayed,
                                                     watch=session.waker(changed))
                except errors.NoNodeError:
                    waiting = []
                if waiting:
                    await changed.wait()
                    continue
                # while a queue holds items, the moment to look again is when its newest
                # one has gone (acknowledged or dead-lettered): one watch for a whole
                # backlog, rather than a look at every task's start and end
                queues = await self._queues(changed)
                newest = None
                for queue in queues:
                    newest = await queue.newest_item()
                    if newest is not None:
                        break
                if newest is not None:
                    if await session.exists(newest, watch=session.waker(changed)) is not None:
                        await changed.wait()
                    continue
                running = await session.children(self.app.running,
                                                 watch=session.waker(changed))
                if not running and all([await q.size(changed=changed) == 0
                                        for q in queues]):
                    return
            except (errors.ConnectionLossError, errors.SessionExpiredError):
                await session.wait_connected()
                continue
            await changed.wait()

    async def _queues(self, changed: trio.Event) -> list[WorkQueue]:
        """The app's queues now (the default one, then each named queue), with a watch on
        ``queues/`` that sets ``changed`` when a named queue is made."""
        session = self.session
        try:
            named = await session.children(self.app.queues, watch=session.waker(changed))
        except errors.NoNodeError:
            if await session.exists(self.app.queues, watch=session.waker(changed)) is not None:
                changed.set()  # made meanwhile: look again
            named = []
        return [self.queue, *(self.submitter.queues.get(n) for n in sorted(named)
                              if n != DEFAULT_QUEUE)]

    # ------------------------------------------------------------ configuration

    async def publish_config(self, config: Any) -> int:
        """Publish a new configuration to every worker (ready-znode protocol, fenced)."""
        return await self.config_store.write(config, fence=self.term)

    # ------------------------------------------------------------ workers

    async def workers(self) -> dict[str, dict[str, Any]]:
        """Live workers and the status each one reports."""
        members = await Group(self.session, self.app.workers).members()
        return {name: _json(data) for name, data in members.items()}

    async def watch_workers(self) -> AsyncIterator[dict[str, dict[str, Any]]]:
        async for members in Group(self.session, self.app.workers).watch():
            yield {name: _json(data) for name, data in members.items()}

    # ------------------------------------------------------------ shards (push mode)

    async def run_shards(self, shards: Mapping[str, bytes]) -> None:
        """Keep ``shards`` assigned to live workers, forever (Katta/Helix style).

        Writes the desired shards, then drives ``assignments/`` towards a sticky, balanced
        plan over the live workers.  After any change of the live set it waits until the set
        has been stable for ``Master.stable_for`` seconds (safe mode, also at start-up), so a
        worker that blips does not cause a storm of moves.  Every write is fenced.
        """
        for shard in shards:
            check_name("shard name", shard)
        await self._write_shards(shards)
        send, receive = trio.open_memory_channel[dict[str, dict[str, Any]]](1)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._feed_workers, send)
            latest = await receive.receive()
            while True:
                with trio.move_on_after(self.master.stable_for):
                    latest = await receive.receive()
                    continue  # changed again: restart the stability timer
                await self.rebalance(set(shards), set(latest))
                latest = await receive.receive()

    def replicated(self, *, node_grace: float, max_moves: int = 2,
                   stable_for: float | None = None) -> ReplicatedPlacement:
        """A replicated placement loop for shards that change while it runs: call its
        ``set_shards`` whenever the wanted shards change, and ``await`` its ``run``."""
        return ReplicatedPlacement(
            self, node_grace=node_grace, max_moves=max_moves,
            stable_for=self.master.stable_for if stable_for is None else stable_for)

    async def run_replicated(self, shards: Mapping[str, bytes],
                             replication: int | Mapping[str, int], *, node_grace: float,
                             max_moves: int = 2, stable_for: float | None = None,
                             on_step: StepHook | None = None) -> NoReturn:
        """Keep ``replication`` serving replicas of every shard on live workers, forever
        (replicated push mode; see :mod:`framework.runtime.placement.replicated`).

        Workers serve with ``serve_shard`` and say when a replica is ready with
        ``async with self.ready(shard, info)``; the plan never lowers the number of
        serving replicas to move one (the new one serves before the old one goes, at most
        ``max_moves`` moves at a time), a lost worker keeps its replicas for ``node_grace``
        seconds, a new leader waits ``stable_for`` (default ``Master.stable_for``) and
        resumes from ZooKeeper.  Every write is one multi fenced by the election node."""
        placement = self.replicated(node_grace=node_grace, max_moves=max_moves,
                                    stable_for=stable_for)
        placement.set_shards(shards, replication)
        await placement.run(on_step)

    async def _feed_workers(self, send: trio.MemorySendChannel[Any]) -> None:
        async for workers in self.watch_workers():
            await send.send(workers)

    async def _write_shards(self, shards: Mapping[str, bytes]) -> None:
        await self.session.ensure_path(self.app.shards)
        existing = set(await self.session.children(self.app.shards))
        txn = self.term.fenced()
        for name, spec in shards.items():
            path = f"{self.app.shards}/{name}"
            txn.set(path, spec) if name in existing else txn.create(path, spec)
        for name in existing - set(shards):
            txn.delete(f"{self.app.shards}/{name}")
        await _commit(txn)

    async def assignments(self) -> dict[str, str]:
        """The current shard -> worker map as written in ZooKeeper."""
        current: dict[str, str] = {}
        await self.session.ensure_path(self.app.assignments)
        for worker in await self.session.children(self.app.assignments):
            try:
                for shard in await self.session.children(self.app.assignment_dir(worker)):
                    current[shard] = worker
            except errors.NoNodeError:
                continue
        return current

    async def rebalance(self, shards: set[str], live: set[str]) -> dict[str, str]:
        """Move the written assignment to the plan for ``live``; one fenced transaction."""
        current = await self.assignments()
        plan = plan_assignment(shards, live, current)
        txn = self.term.fenced()
        moves = 0
        for worker in live:
            if await self.session.exists(self.app.assignment_dir(worker)) is None:
                txn.create(self.app.assignment_dir(worker))
        for shard, worker in current.items():
            if plan.get(shard) != worker:
                txn.delete(f"{self.app.assignment_dir(worker)}/{shard}")
        for shard, worker in plan.items():
            if current.get(shard) != worker:
                txn.create(f"{self.app.assignment_dir(worker)}/{shard}")
                moves += 1
        await _commit(txn)
        log.info("master.rebalanced", app=self.app.name, shards=len(plan), workers=len(live),
                 moves=moves)
        return plan


class Master:
    """Base class of an application's masters; override :meth:`lead`.

    ``stable_for`` is the safe-mode period for shard assignment; ``suspended_grace`` how
    long a disconnected leader may keep leading (``None``, the default: until the session's
    trust deadline, which rides through a ZooKeeper leader change and still stops the body a
    third of the session timeout before the server can elect another master; a number
    stops it sooner).  ``<kind>_retention_count`` / ``<kind>_retention_seconds`` bound the
    app's result records, dead letters and failure records (``retention_interval``,
    ``retention_batch``: how often, and how many deletions at most per pass);
    ``canvas_retention_*`` the ended canvas records, trimmed by the duty holder's canvas
    driver (a worker's setting of the same name wins there).

    When ``lead`` returns, the job-done record also says how it ended (``results``: result
    records, ``dead_letters``: tasks that used up their deliveries), the master logs it, and
    :attr:`summary` holds it; ``framework run`` prints it and exits 1 if tasks were
    dead-lettered, unless ``fail_on_dead_letters`` is False.

    ``schedules`` (:func:`~framework.runtime.scheduling.schedules.every`,
    :func:`~framework.runtime.scheduling.schedules.cron`) are fired by the leader while it
    leads, each slot exactly once across failovers (see
    :mod:`framework.runtime.scheduling.schedules`).
    """

    app_name: str | None = None
    stable_for: float = 2.0
    suspended_grace: float | None = None
    # retention (None: no limit); applied by the active master every retention_interval
    # seconds (None: never), at most retention_batch deletions per pass
    result_retention_count: int | None = 100_000
    result_retention_seconds: float | None = 7 * 86400.0
    dead_retention_count: int | None = 10_000
    dead_retention_seconds: float | None = 30 * 86400.0
    failure_retention_count: int | None = FAILURE_RING
    failure_retention_seconds: float | None = 7 * 86400.0
    # ended canvas records (canvas/<id>) kept by the duty holder's canvas driver
    canvas_retention_count: int | None = 10_000
    canvas_retention_seconds: float | None = 7 * 86400.0
    retention_interval: float | None = 60.0
    retention_batch: int = 1000
    #: ``framework run`` exits 1 when the finished job dead-lettered tasks
    fail_on_dead_letters: bool = True
    #: periodic jobs fired by the leader (``every(...)``, ``cron(...)``)
    schedules: ClassVar[list[Schedule]] = []

    def __init__(self, app: App | str | None = None, *, name: str | None = None,
                 address: str = "") -> None:
        self.app = app_of(app, self.app_name, type(self))
        self.name = process_name("master", name)
        self.address = address
        self.retention_limits = limits_of(self)  # checked now, not at the first pass
        if self.retention_interval is not None and not self.retention_interval > 0:
            raise errors.ConfigurationError(
                f"retention_interval must be positive seconds or None: "
                f"{self.retention_interval!r}"
            )
        names = [schedule.name for schedule in self.schedules]
        if len(set(names)) != len(names) or not all(
                isinstance(s, Schedule) for s in self.schedules):
            raise errors.ConfigurationError(
                f"{type(self).__name__}.schedules must be every()/cron() schedules with "
                f"distinct names, got {self.schedules!r}")
        self.terms_led = 0
        #: how the job ended (set when ``lead`` returns in this process): results, dead letters
        self.summary: dict[str, int] | None = None
        #: True once this master stopped because the app is cancelled (``framework cancel``)
        self.stopped_by_cancel = False
        self._stopping = False
        self._scope: trio.CancelScope | None = None

    async def lead(self, ctx: MasterContext) -> None:
        """The leader's work.  Return when the job is finished."""
        raise NotImplementedError(f"{type(self).__name__} must implement lead(ctx)")

    def request_stop(self) -> None:
        """Resign (or stop standing by) at once; a standby takes over immediately."""
        self._stopping = True
        if self._scope is not None:
            self._scope.cancel()

    async def run(self, session: Session) -> None:
        """Campaign, lead, and stand by again after a lost term, until done or stopped."""
        app = self.app
        await ensure_layout(session, app, app.masters, app.tasks, app.running, app.results,
                            app.workers)
        identity = records.encode(MasterIdentity(self.name, self.address, os.getpid(),
                                                 socket.gethostname()))
        election = Election(session, app.masters, identity,
                            suspended_grace=self.suspended_grace)
        with single_body_error():
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._follow_cancel, session)
                await self._campaign(session, election, identity)
                nursery.cancel_scope.cancel()
        log.info("master.stopped", app=app.name, master=self.name)

    async def _campaign(self, session: Session, election: Election, identity: bytes) -> None:
        app = self.app
        with trio.CancelScope() as self._scope:
            while not self._stopping:
                log.info("master.standby", app=app.name, master=self.name)
                try:
                    async with election.leadership() as term:
                        await self._lead_term(session, term, identity)
                        return
                except errors.LeadershipLost as exc:
                    log.warning("master.deposed", app=app.name, master=self.name,
                                reason=exc.reason)
                    await session.wait_connected()

    async def _follow_cancel(self, session: Session) -> None:
        """Resign (or stop standing by) and exit once the app is cancelled."""
        await wait_cancelled(session, self.app)
        log.warning("master.cancelled", app=self.app.name, master=self.name)
        self.stopped_by_cancel = True
        self.request_stop()

    async def _lead_term(self, session: Session, term: Term, identity: bytes) -> None:
        finished, cancelled = await _job_done(session, self.app)
        if cancelled:
            # our predecessor may have resigned on the cancel: never start lead() again
            log.info("master.job_cancelled", app=self.app.name, master=self.name)
            self.stopped_by_cancel = True
            self._stopping = True  # returning resigns; the campaign ends
            return
        if finished is not None:
            # `framework run` says so on the terminal; `framework rerun` starts a new
            # generation (it deletes done), so a master started after it leads again
            log.info("master.job_already_done", app=self.app.name, master=self.name,
                     finished_by=finished.master, at=finished.at)
            self.already_done = finished  # the record found: this master did not lead
            return
        self.terms_led += 1
        started = time.monotonic()
        log.info("master.elected", app=self.app.name, master=self.name, token=term.token)
        metrics.leadership_changed(self.app.name, True)
        try:
            rendezvous = Rendezvous(session, self.app.rendezvous)
            await rendezvous.publish(identity, ephemeral=True)
            queue = WorkQueue(session, self.app.tasks, dead_letter=self.app.dead,
                              fence=(term.node, term.version))
            ctx = MasterContext(
                session=session,
                app=self.app,
                term=term,
                master=self,
                queue=queue,
                config_store=ConfigStore(session, self.app.config),
                retention=Retention(session, self.app, term, queue,
                                    batch=self.retention_batch, **self.retention_limits),
                submitter=Submitter(session, self.app, queue),
                delayed=DelayedMover(session, self.app, queue),
            )
            with single_body_error():
                async with trio.open_nursery() as nursery:
                    if self.retention_interval is not None:
                        nursery.start_soon(ctx.retention.run, self.retention_interval)
                    nursery.start_soon(ctx.delayed.run)
                    nursery.start_soon(Scheduler(session, self.app, queue, self.schedules,
                                                 ctx.submitter).run)
                    await self.lead(ctx)
                    nursery.cancel_scope.cancel()
            self.summary = await _job_summary(session, self.app)
            record = records.encode(JobDone(self.name, time.time(), term.token,
                                            **self.summary))
            try:
                await _commit(term.fenced().create(self.app.done, record))
            except errors.TransactionFailedError as exc:
                if not isinstance(exc.cause, errors.NodeExistsError):
                    raise
            log.info("master.finished", app=self.app.name, master=self.name,
                     seconds=round(time.monotonic() - started, 3), **self.summary)
        finally:
            metrics.leadership_changed(self.app.name, False)
            with cleanup_scope(session):
                try:  # withdraw our address, never a successor's
                    stat = await session.exists(self.app.rendezvous)
                    if stat is not None and stat.ephemeralOwner == term.session_id:
                        await session.delete(self.app.rendezvous, version=stat.version)
                except errors.ZooKeeperError:
                    pass


async def _job_summary(session: Session, app: App) -> dict[str, int]:
    """Result records and dead letters of ``app`` now (once per job: a listing of ``dead/``
    and one ``exists`` per result bucket, pipelined)."""
    counts: list[int] = []

    async def count(path: str) -> None:
        stat = await session.exists(path)
        counts.append(stat.numChildren if stat else 0)

    try:
        buckets = await session.children(app.results)
    except errors.NoNodeError:
        buckets = []
    await gather(*[functools.partial(count, f"{app.results}/{b}") for b in buckets])
    dead = await session.exists(app.dead)
    return {"results": sum(counts), "dead_letters": dead.numChildren if dead else 0}


async def _job_done(session: Session, app: App) -> tuple[JobDone | None, bool]:
    """The job-done record of ``app`` (``None`` while the job is not finished), and whether
    the app is cancelled: two reads in one round trip.  A ``done`` node that holds no
    readable record still means done."""
    found: dict[str, Any] = {}

    async def done() -> None:
        try:
            data = (await session.get(app.done))[0]
        except errors.NoNodeError:
            return
        found["done"] = decode_or_none(data, JobDone, path=app.done) or JobDone()

    async def cancelled() -> None:
        found["cancelled"] = await is_cancelled(session, app)

    await gather(done, cancelled)
    return found.get("done"), found["cancelled"]


_commit = commit_fenced


def _json(data: bytes) -> dict[str, Any]:
    try:
        value = json.loads(data) if data else {}
    except ValueError:
        return {"raw": data.decode(errors="replace")}
    return value if isinstance(value, dict) else {"value": value}
