"""Replicated push mode: keep R serving replicas of every shard on the live workers.

The leading master runs a :class:`ReplicatedPlacement` (``MasterContext.run_replicated``, or
``MasterContext.replicated()`` for a set of shards that changes while it runs).  It keeps,
under the app (see :mod:`framework.runtime.app`)::

    shards/<shard>                  the shard's spec (bytes for the workers)       (fenced)
    plan/<shard>                    JSON list of the workers planned for it         (fenced)
    assignments/<worker>/<shard>    the same plan per worker                        (fenced)
    deployed/<shard>/<worker>       EPHEMERAL, by the worker once it serves the shard
    refused/<shard>/<worker>        by a worker whose serve_shard raised PermanentFailure

Its view comes from watches only: group membership (live workers), each shard's
``deployed/`` and ``refused/`` children.  On any change it computes the next plan with
:func:`~framework.runtime.placement.plan_replicas` and writes what differs - new shards with
their directories, plans, assignment changes - in one multi fenced by the leader's election
node.  A worker that leaves still counts as live for ``node_grace`` seconds (safe mode; the
only timer); at start the leader waits ``stable_for`` seconds and resumes from ZooKeeper.
A shard no longer wanted gets an empty plan; once nobody serves it, its znodes go (one more
fenced multi).  Workers never create the parents of their records, so a record written late
cannot bring back a removed shard.

Pluggable pieces, all optional (the defaults are Katta's model):

* the *ready* rule (``ready=``): which replicas of a shard count as ready, so that another
  may leave.  It is asked, at each step, about every shard where a replica may be dropped
  (more planned live replicas than R, or a planned replica no longer live); the default,
  :func:`confirmed_records`, reads the deployment records of a shard in a move and counts
  the confirmed ones.  A rule also says which replicas must stay (:attr:`Readiness.keep`)
  and what the dropping multi must ``check`` (:attr:`Readiness.checks`), so a readiness
  that changed since it was read refuses the drop on the server;
* :class:`PlacementRules` (``set_rules``): workers retiring, to avoid, replicas to replace
  now, replicas never moved, whether moves may start or finish;
* ``on_new_shard``: operations added to the multi that creates a shard's znodes.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

import trio

from framework import errors
from framework.logs import get_logger
from framework.primitives import is_fence_failure
from framework.records import CorruptRecord
from framework.retry import Backoff
from framework.runtime.app import check_name
from framework.runtime.placement.assignment import plan_replicas
from framework.runtime.placement.placement_rules import NewShardHook, PlacementRules, Readiness
from framework.runtime.records import Plan
from framework.zk import SessionState, watch_children

if TYPE_CHECKING:
    from framework.primitives import Term
    from framework.runtime.app import App
    from framework.zk import Session


class LeaderContext(Protocol):
    """What the placement loop needs of the leading master (``MasterContext`` is one):
    the app's layout, the leader's session and term (writes are fenced by it), and the
    live group members."""

    app: App
    session: Session
    term: Term

    def watch_workers(self) -> AsyncIterator[dict[str, dict[str, Any]]]: ...


#: The ready rule: ``(placement, shard, planned, candidates)`` -> the shard's readiness, or
#: ``None`` (no opinion: the deployment records as watched count, nothing kept or checked).
#: ``candidates`` are the workers that may hold replicas now (live, or lost in grace).  Asked
#: only while the loop runs, after every change; it may arm watches with
#: :meth:`ReplicatedPlacement.wake_on` so that a change of what it read wakes the loop.
ReadyRule = Callable[["ReplicatedPlacement", str, Sequence[str], AbstractSet[str]],
                     Awaitable["Readiness | None"]]

log = get_logger("framework.runtime.placement.replicated")

#: Delays before re-reading ZooKeeper after a failed placement step.
STEP_RETRY = Backoff(0.1, 2.0)

#: Changed shards per fenced multi of a step.
STEP_BATCH = 100

#: Called after every placement step (the view is current): react to serving records.
StepHook = Callable[["ReplicatedPlacement"], Awaitable[None]]


class ReplicatedPlacement:
    """The leader's replicated placement loop (see the module docstring).

    Readable view, kept by watches: :attr:`live` (workers in the group, not stopped),
    :attr:`plan` (shard -> workers), :attr:`serving` (shard -> workers with a deployment
    record), :attr:`refused` (shard -> workers), :attr:`known` (shards with znodes).

    ``ready`` is the ready rule (default :func:`confirmed_records`), ``on_new_shard`` adds
    operations to the multi that creates a shard (module docstring)."""

    def __init__(self, ctx: LeaderContext, *, node_grace: float, stable_for: float,
                 max_moves: int = 2, ready: ReadyRule | None = None,
                 on_new_shard: NewShardHook | None = None) -> None:
        if not 0 <= node_grace < math.inf:
            raise errors.ConfigurationError(f"node_grace must be finite seconds >= 0, "
                                            f"not {node_grace!r}")
        if max_moves < 1:
            raise errors.ConfigurationError(f"max_moves must be 1 or more, not {max_moves!r}")
        self.ctx = ctx
        self.node_grace = node_grace
        self.max_moves = max_moves
        self.stable_for = stable_for
        self.ready_rule: ReadyRule = ready or confirmed_records
        self.on_new_shard = on_new_shard
        self.rules = PlacementRules()
        self.live: set[str] = set()
        self.plan: dict[str, list[str]] = {}
        self.serving: dict[str, set[str]] = {}
        self.refused: dict[str, set[str]] = {}
        self.known: dict[str, bytes] = {}  # shard -> spec as written
        self._wanted: dict[str, bytes] = {}
        self._replication: dict[str, int] = {}
        self._lost_at: dict[str, float] = {}
        self._workers_known = trio.Event()  # the first listing of the workers is in
        self._dirs: set[str] = set()  # assignments/<w> known to exist (this term)
        self._watchers: dict[str, trio.CancelScope] = {}
        self._changed = trio.Event()
        self._nursery: trio.Nursery | None = None
        #: shard -> its readiness as read this step (for the multi's checks)
        self._readiness: dict[str, Readiness] = {}
        self._armed: set[str] = set()  # paths with a wake-up watch armed (wake_on)

    # ------------------------------------------------------------ the desired state

    def set_shards(self, shards: Mapping[str, bytes], replication: int | Mapping[str, int]
                   ) -> None:
        """The shards wanted now (name -> spec) and R (one for all, or per shard); the
        loop writes the difference at its next step.  Shards left out are unplaced, then
        their znodes deleted once nobody serves them."""
        for shard in shards:
            check_name("shard name", shard)
        wanted = {s: replication if isinstance(replication, int) else replication[s]
                  for s in shards}
        for shard, r in wanted.items():
            if r < 1:
                raise errors.ConfigurationError(f"replication of {shard!r} must be 1 or more")
        self._wanted = dict(shards)
        self._replication = wanted
        self._changed.set()

    def set_rules(self, rules: PlacementRules) -> None:
        """The application's constraints from now on (see :class:`PlacementRules`); the
        loop takes them into account at its next step, which happens at once."""
        if rules != self.rules:
            self.rules = rules
            self._changed.set()

    def replication_of(self, shard: str) -> int:
        """The R wanted for ``shard`` now (0 if it is not wanted)."""
        return self._replication.get(shard, 0)

    def wake_on(self, path: str) -> Callable[..., None] | None:
        """A watch callback for ``path`` that wakes the loop when it fires, or ``None`` if
        one is armed already (pass it as ``watch=`` to ``get``/``exists``/``children``).
        Armed again after a reconnection (kazoo drops watches with a connection)."""
        if path in self._armed:
            return None
        self._armed.add(path)
        return self._record_watcher(path)

    # ------------------------------------------------------------ the loop

    async def run(self, on_step: StepHook | None = None) -> NoReturn:
        """Place forever (until the term ends); ``on_step`` runs after every step."""
        session = self.ctx.session
        app = self.ctx.app
        for path in (app.shards, app.plan, app.deployed, app.refused, app.assignments):
            await session.ensure_path(path)
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            await self._load()
            nursery.start_soon(self._watch_workers)
            nursery.start_soon(self._rearm_after_reconnect)
            # never plan from an empty live set: wait for the first listing of the workers,
            # and give every planned worker missing from it the grace of a lost one
            await self._workers_known.wait()
            started = trio.current_time()
            for worker in {w for ws in self.plan.values() for w in ws} - self.live:
                self._lost_at.setdefault(worker, started)
            await trio.sleep(self.stable_for)  # safe mode: let the live set settle
            log.info("replicated.leading", app=app.name, workers=len(self.live),
                     shards=len(self.known))
            failures = 0
            while True:
                self._changed = trio.Event()
                now = trio.current_time()
                try:
                    await self._step(now)
                    failures = 0
                except (errors.TransactionFailedError, errors.NoNodeError,
                        errors.NodeExistsError, errors.ConnectionLossError) as exc:
                    # our memory disagrees with ZooKeeper (a reply lost, say): re-read it
                    failures += 1
                    log.warning("replicated.step_failed", app=app.name, error=str(exc))
                    await STEP_RETRY.sleep(failures)
                    await self._reload()
                    continue
                if on_step is not None:
                    await on_step(self)
                # a lost worker whose grace ended has been acted on: forget it; wake up when
                # the next grace ends (a timer, not polling: nothing else changes then)
                for worker, lost in list(self._lost_at.items()):
                    if lost + self.node_grace <= now:
                        del self._lost_at[worker]
                expiries = [t + self.node_grace for t in self._lost_at.values()]
                with trio.move_on_at(min(expiries, default=math.inf)):
                    await self._changed.wait()

    async def _reload(self) -> None:
        """:meth:`_load` again, as often as the connection drops while it reads."""
        while True:
            await self.ctx.session.wait_connected()
            try:
                await self._load()
                return
            except errors.ConnectionLossError:
                continue

    async def _load(self) -> None:
        """Resume from ZooKeeper: the shards, their plans (never from memory)."""
        session = self.ctx.session
        app = self.ctx.app
        self.known, self.plan = {}, {}
        for shard in await session.children(app.shards):
            try:
                self.known[shard] = (await session.get(f"{app.shards}/{shard}"))[0]
                data = (await session.get(app.plan_path(shard)))[0]
                self.plan[shard] = list(Plan.decode(data).workers)
            except errors.NoNodeError:
                pass
            except CorruptRecord as exc:
                log.warning("replicated.plan_corrupt", shard=shard, error=str(exc))
                self.plan[shard] = []
            if shard not in self.plan:  # written by run_shards, say: give it directories
                for path in (app.plan_path(shard), app.deployed_dir(shard),
                             app.refused_dir(shard)):
                    await session.ensure_path(path)
                await session.set(app.plan_path(shard), b"[]")
                self.plan[shard] = []
        # the assignments that exist are what a step's creates and deletes must match (a
        # plan written by someone else, or lost with a reply, may say otherwise): keep the
        # recorded order, drop what is not assigned, add what is
        assigned: dict[str, set[str]] = {}
        for worker in await session.children(app.assignments):
            try:
                for shard in await session.children(app.assignment_dir(worker)):
                    assigned.setdefault(shard, set()).add(worker)
            except errors.NoNodeError:
                pass
        for shard, recorded in self.plan.items():
            actual = assigned.get(shard, set())
            self.plan[shard] = [w for w in recorded if w in actual] + sorted(
                actual - set(recorded))
        self._dirs.clear()
        for shard in set(self._watchers) - set(self.known):
            self._watchers.pop(shard).cancel()
        for shard in self.known:
            self._watch_shard(shard)

    def _watch_shard(self, shard: str) -> None:
        if shard in self._watchers or self._nursery is None:
            return
        scope = trio.CancelScope()
        self._watchers[shard] = scope

        async def follow(path: str, table: dict[str, set[str]]) -> None:
            async for snap in watch_children(self.ctx.session, path):
                table[shard] = set(snap.children)
                self._changed.set()

        async def both() -> None:
            with scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(follow, self.ctx.app.deployed_dir(shard), self.serving)
                    nursery.start_soon(follow, self.ctx.app.refused_dir(shard), self.refused)

        self._nursery.start_soon(both)

    async def _watch_workers(self) -> None:
        async for workers in self.ctx.watch_workers():
            live = {w for w, doc in workers.items() if doc.get("state") != "stopped"}
            for gone in self.live - live:
                self._lost_at[gone] = trio.current_time()
                log.warning("replicated.worker_lost", app=self.ctx.app.name, worker=gone,
                            grace=self.node_grace)
            for new in live - self.live:
                self._lost_at.pop(new, None)
            self.live = live
            self._workers_known.set()
            self._changed.set()

    # ------------------------------------------------------------ one step

    async def _step(self, now: float) -> None:
        """Compute the next plan and write what differs: one fenced multi per
        :data:`STEP_BATCH` changed shards (+ one to delete shards nobody serves any more,
        + one create per worker first planned this term)."""
        app = self.ctx.app
        session = self.ctx.session
        grace = {w for w, t in self._lost_at.items() if now < t + self.node_grace}
        candidates = self.live | grace
        # a replica may be dropped only while every other one is ready (by default: has a
        # confirmed record): plan from the ready rule's answer where a drop is possible
        serving = dict(self.serving)
        self._readiness = await self._read_ready(candidates)
        rules = self.rules
        keep = {s: set(ws) for s, ws in rules.protected.items()}
        for shard, readiness in self._readiness.items():
            serving[shard] = set(readiness.ready)
            keep.setdefault(shard, set()).update(readiness.keep)
        target = plan_replicas(self._wanted, candidates, self.plan, serving,
                               self._replication, excluded=self.refused,
                               max_moves=self.max_moves, keep=keep,
                               retiring=rules.retiring & candidates,
                               # a worker in its grace is gone, most likely: it keeps its
                               # replicas, and gets a new one only if nobody else can
                               avoid=rules.avoid | grace,
                               replace=rules.replace, moves=rules.moves,
                               keep_targets=rules.keep_targets)
        for shard in set(self.known) - set(self._wanted):
            target[shard] = []  # no longer wanted: unplace it
        for worker in sorted({w for ws in target.values() for w in ws} - self._dirs):
            await session.ensure_path(app.assignment_dir(worker))
            self._dirs.add(worker)
        # one fenced multi per STEP_BATCH changed shards (a multi stays far below
        # ZooKeeper's 1 MB request limit however many shards change at once); each shard's
        # operations are in one multi, and memory follows each multi that committed
        txn = None
        chunk: list[str] = []
        moves = written = 0
        for shard, workers in sorted(target.items()):
            if txn is None:
                txn = self.ctx.term.fenced()
            if not self._shard_ops(txn, shard, workers, candidates):
                continue
            chunk.append(shard)
            written += 1
            moves += len(set(workers) ^ set(self.plan.get(shard, [])))
            if len(chunk) >= STEP_BATCH:
                await self._commit_step(txn, chunk, target)
                txn, chunk = None, []
        if chunk and txn is not None:
            await self._commit_step(txn, chunk, target)
        if written:
            log.info("replicated.plan_written", app=app.name, shards=len(target),
                     changes=moves, multis=-(-written // STEP_BATCH))
        await self._forget_unserved()

    def _shard_ops(self, txn: Any, shard: str, workers: list[str], candidates: set[str]
                   ) -> bool:
        """Add to ``txn`` what makes ``shard``'s znodes say ``workers``; False if nothing
        differs."""
        writes = self._spec_ops(txn, shard, workers)
        if workers == self.plan.get(shard, []) and shard in self.known:
            return writes
        self._replica_ops(txn, shard, workers, candidates)
        return True

    def _spec_ops(self, txn: Any, shard: str, workers: list[str]) -> bool:
        """A new shard's znodes (spec, plan, deployed/, refused/ and the application's
        own), or a changed spec; whether it wrote anything."""
        app = self.ctx.app
        if shard not in self.known:
            txn.create(f"{app.shards}/{shard}", self._wanted[shard])
            txn.create(app.plan_path(shard), Plan(tuple(workers)).encode())
            txn.create(app.deployed_dir(shard))
            txn.create(app.refused_dir(shard))
            if self.on_new_shard is not None:
                self.on_new_shard(txn, shard, list(workers))
            return True
        if shard in self._wanted and self._wanted[shard] != self.known[shard]:
            txn.set(f"{app.shards}/{shard}", self._wanted[shard])
            return True
        return False

    def _replica_ops(self, txn: Any, shard: str, workers: list[str],
                     candidates: set[str]) -> None:
        """The plan's new replicas: the plan record, the assignments added and removed,
        and - when a replica goes - checks that what made the others ready is unchanged."""
        app = self.ctx.app
        old = self.plan.get(shard, [])
        if shard in self.known:
            txn.set(app.plan_path(shard), Plan(tuple(workers)).encode())
        dropped = set(old) - set(workers)
        if dropped and workers:
            self._readiness_checks(txn, shard, workers, old, bool(dropped & candidates))
        if dropped & candidates and workers:
            log.info("replicated.replica_dropped", app=app.name, shard=shard,
                     dropped=sorted(dropped), staying=sorted(workers))
        for worker in dropped:
            txn.delete(f"{app.assignment_dir(worker)}/{shard}")
        for worker in set(workers) - set(old):
            txn.create(f"{app.assignment_dir(worker)}/{shard}")

    def _readiness_checks(self, txn: Any, shard: str, workers: list[str], old: list[str],
                          candidate_dropped: bool) -> None:
        """A replica goes: in the same multi, what made the others ready must be as we read
        it (else refused, re-read, retried): the ready rule's checks, and - a candidate
        dropped - the serving records of the replicas that stay."""
        readiness = self._readiness.get(shard)
        if readiness is None:
            return
        for path, version in readiness.checks:
            txn.check(path, version)
        if candidate_dropped:
            for worker in sorted(set(workers) & set(old)):
                record = readiness.records.get(worker)
                if record is not None:
                    txn.check(*record)

    async def _commit_step(self, txn: Any, chunk: list[str],
                           target: Mapping[str, list[str]]) -> None:
        """Commit one multi of a step, then remember what it wrote."""
        await commit_fenced(txn)
        for shard in chunk:
            if shard not in self.known:
                self.known[shard] = self._wanted[shard]
                self._watch_shard(shard)
            elif shard in self._wanted:
                self.known[shard] = self._wanted[shard]
            self.plan[shard] = list(target[shard])

    async def _read_ready(self, candidates: set[str]) -> dict[str, Readiness]:
        """Ask the ready rule about every wanted shard where a replica may be dropped: more
        planned live replicas than its R, or a planned replica that is not a candidate."""
        out: dict[str, Readiness] = {}
        for shard, planned in sorted(self.plan.items()):
            if shard not in self._wanted or not planned:
                continue
            live = [w for w in planned if w in candidates]
            if len(live) <= self._replication.get(shard, 0) and len(live) == len(planned):
                continue
            readiness = await self.ready_rule(self, shard, list(planned), candidates)
            if readiness is not None:
                out[shard] = readiness
        return out

    def _record_watcher(self, path: str) -> Callable[..., None]:
        """A watch on a deployment record: wakes the loop (watches run in trio)."""

        def fired(*_: Any) -> None:
            self._record_changed(path)

        return fired

    async def _rearm_after_reconnect(self) -> None:
        """kazoo drops watches with a connection: after each reconnection the records'
        watches are armed again at the next step."""
        async for change in self.ctx.session.states():
            if change.state is SessionState.CONNECTED:
                self._armed.clear()
                self._changed.set()

    def _record_changed(self, path: str) -> None:
        self._armed.discard(path)
        self._changed.set()

    async def _forget_unserved(self) -> None:
        """Delete the znodes of shards no longer wanted that nobody serves (one multi)."""
        app = self.ctx.app
        gone = sorted(s for s in set(self.known) - set(self._wanted)
                      if not self.plan.get(s) and not self.serving.get(s))
        if not gone:
            return
        txn = self.ctx.term.fenced()
        for shard in gone:
            for worker in sorted(self.refused.get(shard, ())):
                txn.delete(f"{app.refused_dir(shard)}/{worker}")
            txn.delete(app.refused_dir(shard))
            txn.delete(app.deployed_dir(shard))  # fails if a record came meanwhile: retried
            txn.delete(app.plan_path(shard))
            txn.delete(f"{app.shards}/{shard}")
        await commit_fenced(txn)
        for shard in gone:
            self._watchers.pop(shard).cancel()
            for table in (self.known, self.plan, self.serving, self.refused):
                table.pop(shard, None)
        log.info("replicated.shards_removed", app=app.name, shards=gone)


async def commit_fenced(txn: Any) -> None:
    """Commit a fenced transaction; a refused fence is :class:`LeadershipLost`."""
    try:
        await txn.commit()
    except errors.TransactionFailedError as exc:
        if is_fence_failure(exc):
            raise errors.LeadershipLost("fenced write refused: no longer the leader") from exc
        raise


async def confirmed_records(placement: ReplicatedPlacement, shard: str,
                            planned: Sequence[str], candidates: AbstractSet[str]
                            ) -> Readiness | None:
    """The default ready rule: for a shard with more planned live replicas than its R (a
    drop is possible), the workers whose deployment record is confirmed (version 1 or more,
    see ``Worker.ready``), each record's version read now (checked in the multi).  An
    unconfirmed record gets a watch, so its confirmation (or end) wakes the loop."""
    live = [w for w in planned if w in candidates]
    if len(live) <= placement.replication_of(shard):
        return None
    session = placement.ctx.session
    ready: set[str] = set()
    records: dict[str, tuple[str, int]] = {}
    for worker in live:
        if worker not in placement.serving.get(shard, set()):
            continue
        path = f"{placement.ctx.app.deployed_dir(shard)}/{worker}"
        stat = await session.exists(path, watch=placement.wake_on(path))
        if stat is not None and stat.version >= 1:
            records[worker] = (path, stat.version)
            ready.add(worker)
    return Readiness(frozenset(ready), records=records)
