"""``KattaMaster``: builds indexes as jobs and keeps every shard on R live nodes.

Run it with ``python -m framework run examples.katta_like.master:KattaMaster --app katta``
(several of them: one leads, the others stand by).  ``KATTA_SAFE_MODE`` and
``KATTA_NODE_GRACE`` (seconds, see :func:`env_seconds`) are read when it is built: a bad
value is a :class:`ConfigurationError`.

What the leader guarantees (every write fenced by its election node, so a deposed master's
late write fails on the server):

* **build**: an index in state ``building`` gets one task per shard that has no successful
  result yet (idempotency key ``build-<index>-<incarnation>-<shard>``, the incarnation being
  the index record's czxid: a new master never builds a shard
  twice into view); once the queue is idle the index moves to ``deploying``, or to
  ``error`` naming the failed shards.
* **place**: the shards of a placed index (:attr:`IndexRecord.placed`) are the runtime's
  replicated shards ``<index>.<shard>`` (:meth:`MasterContext.replicated`); ``deploying``
  moves to ``deployed`` once every shard has ``min(R, live nodes)`` serving replicas, and
  to ``error`` when every eligible node refused a shard as corrupt.
* **remove**: an index in state ``removing`` is no longer placed; once the runtime deleted
  its last shard its store files (if ``purge``) and then its record are deleted.
* An index record that is not an :class:`IndexRecord` is a ``katta.bad_record`` event; the
  leader keeps what it last read of that index until the record is rewritten.

**SUSPENDED** past the trust deadline, or **LOST**: the runtime ends the term
(``lead`` is cancelled, the builds it waits for stay queued) and the master campaigns
again; a write that raced the end is refused by the fence.  A new leader resumes from
ZooKeeper: the index records, the build results, the plan.
"""

from __future__ import annotations

import time
from typing import Any

import attrs
import trio

from examples.katta_like.layout import (
    APP_NAME,
    BuildTask,
    IndexRecord,
    IndexState,
    KattaPaths,
    ShardSpec,
    decode_logged,
    env_seconds,
    replica_name,
)
from examples.katta_like.store import ShardStore
from framework import Master, MasterContext, errors, get_logger, records
from framework.runtime import ReplicatedPlacement, commit_fenced
from framework.zk import watch_children, watch_data

log = get_logger("examples.katta_like.master")


@attrs.define
class _Leading:
    """The leader's index records (kept by watches) and what it does with them."""

    ctx: MasterContext
    paths: KattaPaths
    placement: ReplicatedPlacement
    nursery: trio.Nursery
    records: dict[str, IndexRecord] = attrs.Factory(dict)
    builders: dict[str, trio.CancelScope] = attrs.Factory(dict)
    #: each index record's creation zxid: which incarnation of a name it is (an index
    #: removed and added again under the same name builds again)
    incarnations: dict[str, int] = attrs.Factory(dict)


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
        for path in (paths.indexes, paths.aliases):
            await ctx.session.ensure_path(path)
        placement = ctx.replicated(node_grace=self.node_grace, max_moves=self.max_moves,
                                   stable_for=self.stable_for)
        async with trio.open_nursery() as nursery:
            leading = _Leading(ctx, paths, placement, nursery)
            nursery.start_soon(self._watch_indexes, leading)
            await placement.run(lambda p: self._after_step(leading))

    # ------------------------------------------------------------ index records

    def _records_changed(self, leading: _Leading) -> None:
        """Start or stop builds, and tell the placement which shards are wanted now."""
        shards: dict[str, bytes] = {}
        replication: dict[str, int] = {}
        for name, record in leading.records.items():
            building = record.state is IndexState.BUILDING
            if building and name not in leading.builders:
                scope = leading.builders[name] = trio.CancelScope()
                leading.nursery.start_soon(self._build, leading, record, scope)
            elif not building and name in leading.builders:
                leading.builders.pop(name).cancel()
            if record.placed:
                for shard in range(record.shards):
                    key = replica_name(name, shard)
                    shards[key] = records.encode(ShardSpec(name, shard, record.store))
                    replication[key] = record.replication
        leading.placement.set_shards(shards, replication)

    async def _watch_indexes(self, leading: _Leading) -> None:
        session = leading.ctx.session
        scopes: dict[str, trio.CancelScope] = {}
        async with trio.open_nursery() as nursery:
            async for snap in watch_children(session, leading.paths.indexes):
                names = set(snap.children)
                for gone in set(scopes) - names:
                    scopes.pop(gone).cancel()
                    leading.records.pop(gone, None)
                for name in names - set(scopes):
                    scopes[name] = await nursery.start(self._watch_index, leading, name)
                self._records_changed(leading)

    async def _watch_index(self, leading: _Leading, name: str,
                           task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        with trio.CancelScope() as scope:
            task_status.started(scope)
            path = leading.paths.index(name)
            async for snap in watch_data(leading.ctx.session, path):
                if snap.data is None:
                    continue
                record = decode_logged(snap.data, IndexRecord, path)
                if record is None:
                    continue  # kept as it was until the record is rewritten
                assert snap.stat is not None
                leading.incarnations[name] = snap.stat.czxid
                leading.records[name] = record
                self._records_changed(leading)

    # ------------------------------------------------------------ build (pull mode)

    async def _build(self, leading: _Leading, record: IndexRecord,
                     scope: trio.CancelScope) -> None:
        ctx = leading.ctx
        with scope:
            started = time.monotonic()
            incarnation = leading.incarnations.get(record.name, 0)
            missing = [s for s in range(record.shards)
                       if not _ok(await ctx.result(_build_key(record.name, incarnation, s)))]
            for shard in missing:
                await ctx.submit("handle", records.unstructure(BuildTask(record, shard)),
                                 key=_build_key(record.name, incarnation, shard))
            log.info("katta.build_submitted", index=record.name, tasks=len(missing))
            await ctx.wait_idle()
            failed = []
            for shard in range(record.shards):
                result = await ctx.result(_build_key(record.name, incarnation, shard))
                if not _ok(result):
                    failed.append(f"{shard}: {getattr(result, 'error', 'no result')}")
            state = IndexState.ERROR if failed else IndexState.DEPLOYING
            await self._set_record(leading, record.evolve(
                state=state, error="; ".join(failed)[:2000], built=not failed))
            log.info("katta.build_done", index=record.name, state=state.value,
                     seconds=round(time.monotonic() - started, 3))

    async def _set_record(self, leading: _Leading, record: IndexRecord) -> None:
        txn = leading.ctx.term.fenced()
        txn.set(leading.paths.index(record.name), records.encode(record))
        await commit_fenced(txn)

    # ------------------------------------------------------------ placement (push mode)

    async def _after_step(self, leading: _Leading) -> None:
        """After each step of the runtime's placement: index states follow the serving
        records; a removed index whose shards are all gone is deleted."""
        placement = leading.placement
        for name, record in list(leading.records.items()):
            keys = [replica_name(name, s) for s in range(record.shards)]
            try:
                if record.state is IndexState.REMOVING:
                    if not any(k in placement.known for k in keys):
                        await self._remove(leading, record)
                    continue
                if record.state not in (IndexState.DEPLOYING, IndexState.DEPLOYED):
                    continue
                hopeless = [k.rpartition(".")[2] for k in keys if k in placement.known
                            and not placement.plan.get(k) and placement.refused.get(k)]
                if hopeless:
                    await self._set_record(leading, record.evolve(
                        state=IndexState.ERROR, error=f"corrupt shards: {', '.join(hopeless)}"))
                    log.error("katta.index_error", index=name, shards=hopeless)
                    continue
                wanted = min(record.replication, len(placement.live))
                if record.state is IndexState.DEPLOYING and wanted and all(
                        len(placement.serving.get(k, set()) & placement.live) >= wanted
                        for k in keys):
                    await self._set_record(leading, record.evolve(state=IndexState.DEPLOYED))
                    log.info("katta.index_deployed", index=name)
            except (errors.TransactionFailedError, errors.NoNodeError) as exc:
                # the index changed under us (removed, say): its watch tells us the new
                # state; a lost fence is LeadershipLost
                log.warning("katta.update_failed", index=name, error=str(exc))

    async def _remove(self, leading: _Leading, record: IndexRecord) -> None:
        """Delete the index record (nobody serves its shards any more; the runtime deleted
        their znodes), after its store files if asked (fenced)."""
        if record.purge:  # nobody serves it any more; files go before the record does
            await trio.to_thread.run_sync(ShardStore(record.store).remove_index, record.name)
        txn = leading.ctx.term.fenced()
        txn.delete(leading.paths.index(record.name))
        await commit_fenced(txn)
        leading.records.pop(record.name, None)
        log.info("katta.index_removed", index=record.name)


def _build_key(index: str, incarnation: int, shard: int) -> str:
    """The build task of ``shard`` of this incarnation of ``index`` (its record's czxid):
    a new master finds it done; an index added again under the same name does not."""
    return f"build-{index}-{incarnation:x}-{shard}"


def _ok(result: Any) -> bool:
    return result is not None and bool(result.ok)
