"""``KattaMaster``: builds indexes as jobs and keeps every shard on R live nodes.

Run it with ``python -m framework run examples.katta_like.master:KattaMaster --app katta``
(several of them: one leads, the others stand by).

What the leader does (every write fenced by its election node, so a deposed master's late
write fails on the server):

* **build**: an index in state ``building`` gets one task per shard that has no successful
  result yet (idempotency key ``build-<index>-<shard>``, so a resubmission by a new master
  never builds a shard twice into view); once the queue is idle it checks the results and
  moves the index to ``deploying`` (or ``error``).
* **place**: for ``deploying``/``deployed`` indexes, :func:`plan_replicas` over the live
  nodes; the plan (``plan/<shard>``) and the per-node assignments (``nodes/<n>/``) are
  written in one multi.  A lost node counts as live for ``node_grace`` seconds (safe mode),
  then its shards are re-replicated.  The whole view is kept from watches (live nodes, index
  records, deployment and error records); nothing is polled.  At start the leader waits
  ``stable_for`` seconds (safe mode) and resumes from the plan in ZooKeeper.
* **remove**: an index in state ``removing`` gets an empty plan; once no node serves it any
  more its znodes (and, if asked, its store files) are deleted.
"""

from __future__ import annotations

import json
import math
import time
from typing import Any

import attrs
import trio

from examples.katta_like.layout import (
    APP_NAME,
    IndexRecord,
    KattaPaths,
    assignment_name,
    env_seconds,
    shard_name,
)
from examples.katta_like.placement import plan_replicas
from examples.katta_like.store import ShardStore
from framework import Master, MasterContext, errors, get_logger
from framework.primitives import is_fence_failure
from framework.zk import Session, watch_children, watch_data

log = get_logger("examples.katta_like.master")


@attrs.define
class _View:
    """What the leader knows, kept up to date by watches."""

    live: set[str] = attrs.Factory(set)
    lost_at: dict[str, float] = attrs.Factory(dict)
    records: dict[str, IndexRecord] = attrs.Factory(dict)
    serving: dict[str, dict[str, set[str]]] = attrs.Factory(dict)
    errors: dict[str, set[str]] = attrs.Factory(dict)
    plans: dict[str, dict[str, list[str]]] = attrs.Factory(dict)
    node_dirs: set[str] = attrs.Factory(set)  # nodes/<n> known to exist (this term)
    changed: trio.Event = attrs.Factory(trio.Event)

    def kick(self) -> None:
        self.changed.set()


class KattaMaster(Master):
    """The Katta master (see the module docstring)."""

    app_name = APP_NAME
    max_moves = 2

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: seconds a new leader waits for the live set to settle (safe mode)
        self.stable_for = env_seconds("KATTA_SAFE_MODE", 1.0)
        #: seconds a lost node still counts as live before its shards are re-replicated
        self.node_grace = env_seconds("KATTA_NODE_GRACE", 1.0)

    async def lead(self, ctx: MasterContext) -> None:
        paths = KattaPaths(self.app)
        session = ctx.session
        for path in (paths.indexes, paths.nodes, paths.aliases):
            await session.ensure_path(path)
        view = _View()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._watch_nodes, ctx, view)
            nursery.start_soon(self._watch_indexes, session, paths, view, nursery)
            await trio.sleep(self.stable_for)  # safe mode: let the live set settle
            log.info("katta.master.leading", master=self.name, nodes=len(view.live))
            builders: dict[str, trio.CancelScope] = {}
            while True:
                view.changed = trio.Event()
                now = trio.current_time()
                for name, record in list(view.records.items()):
                    if record.state == "building" and name not in builders:
                        builders[name] = await nursery.start(self._build, ctx, paths, record)
                    elif record.state != "building" and name in builders:
                        builders.pop(name).cancel()
                    if record.state in ("deploying", "deployed", "removing"):
                        try:
                            await self._place(ctx, paths, view, record, now)
                        except (errors.TransactionFailedError, errors.NoNodeError) as exc:
                            # the index changed under us (removed, say): its watch kicks
                            # us again with the new state; a lost fence is LeadershipLost
                            log.warning("katta.place_failed", index=name, error=str(exc))
                # a lost node's grace that ended has been acted on: forget it; wake up
                # when the next one ends (a timer, not polling: nothing else changes then)
                for node, lost in list(view.lost_at.items()):
                    if lost + self.node_grace <= now:
                        del view.lost_at[node]
                expiries = [t + self.node_grace for t in view.lost_at.values()]
                with trio.move_on_at(min(expiries, default=math.inf)):
                    await view.changed.wait()

    # ------------------------------------------------------------ watches

    async def _watch_nodes(self, ctx: MasterContext, view: _View) -> None:
        async for workers in ctx.watch_workers():
            live = {n for n, doc in workers.items() if doc.get("state") != "stopped"}
            for gone in view.live - live:
                view.lost_at[gone] = trio.current_time()
                log.warning("katta.node_lost", node=gone, grace=self.node_grace)
            for new in live - view.live:
                view.lost_at.pop(new, None)
                log.info("katta.node_joined", node=new)
            view.live = live
            view.kick()

    async def _watch_indexes(self, session: Session, paths: KattaPaths, view: _View,
                             nursery: trio.Nursery) -> None:
        scopes: dict[str, trio.CancelScope] = {}
        async for snap in watch_children(session, paths.indexes):
            names = set(snap.children)
            for gone in set(scopes) - names:
                scopes.pop(gone).cancel()
                for table in (view.records, view.serving, view.errors, view.plans):
                    table.pop(gone, None)
            for name in names - set(scopes):
                scopes[name] = await nursery.start(self._watch_index, session, paths, view, name)
            view.kick()

    async def _watch_index(self, session: Session, paths: KattaPaths, view: _View, name: str,
                           task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        with trio.CancelScope() as scope:
            task_status.started(scope)
            # resume from the plan in ZooKeeper (a new master never starts from memory)
            plan: dict[str, list[str]] = {}
            try:
                for shard in await session.children(paths.plan(name)):
                    plan[shard] = json.loads((await session.get(f"{paths.plan(name)}/{shard}"))[0])
            except errors.NoNodeError:
                pass
            view.plans[name] = plan
            async with trio.open_nursery() as nursery:
                watching: set[int] = set()
                nursery.start_soon(self._watch_errors, session, paths, view, name)
                async for snap in watch_data(session, paths.index(name)):
                    if snap.data is None:
                        continue
                    try:
                        record = IndexRecord.decode(snap.data)
                    except (ValueError, KeyError, TypeError, errors.ConfigurationError) as exc:
                        log.error("katta.bad_index_record", index=name, error=str(exc))
                        continue
                    view.records[name] = record
                    for shard in range(record.shards):
                        if shard not in watching:
                            watching.add(shard)
                            nursery.start_soon(self._watch_deployed, session, paths, view,
                                               name, shard)
                    view.kick()

    async def _watch_deployed(self, session: Session, paths: KattaPaths, view: _View,
                              name: str, shard: int) -> None:
        async for snap in watch_children(session, paths.deployed(name, shard)):
            view.serving.setdefault(name, {})[shard_name(shard)] = set(snap.children)
            view.kick()

    async def _watch_errors(self, session: Session, paths: KattaPaths, view: _View,
                            name: str) -> None:
        async for snap in watch_children(session, paths.errors(name)):
            view.errors[name] = set(snap.children)
            view.kick()

    # ------------------------------------------------------------ build (pull mode)

    async def _build(self, ctx: MasterContext, paths: KattaPaths, record: IndexRecord,
                     task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        with trio.CancelScope() as scope:
            task_status.started(scope)
            started = time.monotonic()
            payload_record = json.loads(record.encode())
            missing = [s for s in range(record.shards)
                       if not _ok(await ctx.result(_build_key(record.name, s)))]
            for shard in missing:
                await ctx.submit({"record": payload_record, "shard": shard},
                                 idempotency_key=_build_key(record.name, shard))
            log.info("katta.build_submitted", index=record.name, tasks=len(missing))
            await ctx.wait_idle()
            failed = []
            for shard in range(record.shards):
                result = await ctx.result(_build_key(record.name, shard))
                if not _ok(result):
                    failed.append(f"{shard}: {getattr(result, 'error', 'no result')}")
            state = "error" if failed else "deploying"
            await self._set_record(ctx, paths, record.evolve(
                state=state, error="; ".join(failed)[:2000]))
            log.info("katta.build_done", index=record.name, state=state,
                     seconds=round(time.monotonic() - started, 3))

    async def _set_record(self, ctx: MasterContext, paths: KattaPaths,
                          record: IndexRecord) -> None:
        txn = ctx.term.fenced()
        txn.set(paths.index(record.name), record.encode())
        await _commit(txn)

    # ------------------------------------------------------------ placement (push mode)

    async def _place(self, ctx: MasterContext, paths: KattaPaths, view: _View,
                     record: IndexRecord, now: float) -> None:
        name = record.name
        grace = {n for n, t in view.lost_at.items() if now < t + self.node_grace}
        live = sorted(view.live | grace)
        shards = [shard_name(s) for s in range(record.shards)]
        current = view.plans.get(name, {})
        serving = view.serving.get(name, {})
        excluded: dict[str, set[str]] = {}
        for entry in view.errors.get(name, set()):
            shard, _, node = entry.partition("~")
            excluded.setdefault(shard, set()).add(node)
        if record.state == "removing":
            target: dict[str, list[str]] = {s: [] for s in shards}
        else:
            target = plan_replicas(shards, live, current, serving, record.replication,
                                   excluded=excluded, max_moves=self.max_moves)
        if target != {s: list(current.get(s, [])) for s in shards}:
            await self._write_plan(ctx, paths, view, name, current, target)
            view.plans[name] = target
        if record.state == "removing":
            if not any(serving.get(s) for s in shards):
                await self._remove(ctx, paths, view, record)
            return
        hopeless = [s for s in shards if not target[s] and excluded.get(s)]
        if hopeless:
            await self._set_record(ctx, paths, record.evolve(
                state="error", error=f"corrupt shards: {', '.join(hopeless)}"))
            log.error("katta.index_error", index=name, shards=hopeless)
            return
        wanted = min(record.replication, len(view.live))
        if record.state == "deploying" and wanted and all(
                len(serving.get(s, set()) & view.live) >= wanted for s in shards):
            await self._set_record(ctx, paths, record.evolve(state="deployed"))
            log.info("katta.index_deployed", index=name)

    async def _write_plan(self, ctx: MasterContext, paths: KattaPaths, view: _View,
                          name: str, current: dict[str, list[str]],
                          target: dict[str, list[str]], *, retry: bool = True) -> None:
        """Write the plan and the per-node assignments in one fenced multi.  Round trips:
        1 list of plan/ + the multi, + 1 create for a node first planned in this term."""
        session = ctx.session
        for node in sorted({n for nodes in target.values() for n in nodes} - view.node_dirs):
            await session.ensure_path(paths.node(node))
            view.node_dirs.add(node)
        try:
            existing = set(await session.children(paths.plan(name)))
        except errors.NoNodeError:  # an index added without its directories
            await session.ensure_path(paths.plan(name))
            existing = set()
        txn = ctx.term.fenced()
        for shard, nodes in target.items():
            old = set(current.get(shard, []))
            data = json.dumps(nodes).encode()
            path = f"{paths.plan(name)}/{shard}"
            txn.set(path, data) if shard in existing else txn.create(path, data)
            for node in old - set(nodes):
                txn.delete(f"{paths.node(node)}/{assignment_name(name, int(shard))}")
            for node in set(nodes) - old:
                txn.create(f"{paths.node(node)}/{assignment_name(name, int(shard))}")
        try:
            await _commit(txn)
        except errors.TransactionFailedError:
            # our memory of the plan disagrees with ZooKeeper (e.g. a write whose reply was
            # lost): re-read the assignments and write the difference again
            if not retry:
                raise
            current = await _read_plan(session, paths, name, target)
            view.node_dirs.clear()  # a node directory may be gone too
            await self._write_plan(ctx, paths, view, name, current, target, retry=False)
            return
        log.info("katta.plan_written", index=name,
                 moves=sum(len(set(target[s]) ^ set(current.get(s, []))) for s in target))

    async def _remove(self, ctx: MasterContext, paths: KattaPaths, view: _View,
                      record: IndexRecord) -> None:
        """Delete the index's znodes in one fenced multi (nobody serves it any more)."""
        session = ctx.session
        txn = ctx.term.fenced()
        index = paths.index(record.name)
        for sub in ("plan", "deployed", "errors"):
            try:
                kids = await session.children(f"{index}/{sub}")
            except errors.NoNodeError:
                continue
            for kid in kids:
                txn.delete(f"{index}/{sub}/{kid}")
            txn.delete(f"{index}/{sub}")
        txn.delete(index)
        if record.purge:  # nobody serves it any more; files go before the record does
            await trio.to_thread.run_sync(ShardStore(record.store).remove_index, record.name)
        try:
            await _commit(txn)
        except errors.TransactionFailedError as exc:
            if await session.exists(index) is not None:
                # something changed under us (a late record): the watches will call again
                log.warning("katta.remove_retry", index=record.name, error=str(exc))
                return
        view.records.pop(record.name, None)  # gone: the index watcher will forget the rest
        log.info("katta.index_removed", index=record.name)


def _build_key(index: str, shard: int) -> str:
    return f"build-{index}-{shard}"


def _ok(result: Any) -> bool:
    return result is not None and bool(result.ok)


async def _read_plan(session: Session, paths: KattaPaths, name: str,
                     shards: dict[str, list[str]]) -> dict[str, list[str]]:
    """The assignments as they are in ZooKeeper (from the per-node directories)."""
    plan: dict[str, list[str]] = {s: [] for s in shards}
    for node in await session.children(paths.nodes):
        for entry in await session.children(paths.node(node)):
            index, _, shard = entry.rpartition("~")
            if index == name and shard in plan:
                plan[shard].append(node)
    return plan


async def _commit(txn: Any) -> None:
    try:
        await txn.commit()
    except errors.TransactionFailedError as exc:
        if is_fence_failure(exc):
            raise errors.LeadershipLost("fenced write refused: no longer the leader") from exc
        raise
