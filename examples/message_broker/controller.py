"""The controller: the runtime's elected master (``BrokerController``, run 2 or more).

It keeps every topic on two distinct live servers with the runtime's replicated placement
(:class:`framework.runtime.ReplicatedPlacement`: sticky, least-loaded, make before break,
fenced multis, resumed from ZooKeeper by a new controller).  A topic is one of its shards:
``plan/<topic>`` lists the servers placed for it (the primary's znode is the broker's own
business), ``assignments/<server>/<topic>`` is what each server serves
(``Worker.serve_shard``).  What the broker adds, through the placement's generic hooks:

* **ready = in the in-sync set** (the ready rule :func:`in_sync_ready`): a replica may leave a
  topic only while every replica that stays is in the topic's ``isr``, and the multi that
  drops it checks the ``isr`` version it read - make before break means "the new backup
  holds every acknowledged record", not "it runs".  The primary named in ``isr`` is never
  the one to leave (nor moved by a rebalance: the servers' ``nodes/`` records name their
  primaries).
* **A topic without a primary keeps its dead in-sync replicas placed** (the same rule, which
  reads ``isr`` and ``primary`` of a topic with a replica gone): one of them may be the only
  server holding every acknowledged record, so it stays assigned to serve the topic when it
  returns, and the topic makes no move meanwhile.
* **A new topic** (``topics/<t>`` created by ``ctl``) gets, in the multi that creates its
  placement, an ``isr`` naming its first replica (that server takes the primary znode) and
  its ``subscribers`` directory (``on_new_shard``).
* **A backup its primary reported** (``out_of_sync`` in the primary's ``nodes/`` record:
  dropped from the in-sync set for lag or a closed link, or ``slow``) is replaced at once -
  a third replica, not a voluntary move - and leaves once the others are in sync; a
  reported server gets no new replica while it is reported (``avoid``), unless no other
  server can take a missing one.
* **A server stopping gracefully** (``state: stopping``) keeps its replicas until it has
  left, gets no new one and is never the one to leave (``retiring``): it hands its
  primaries over first, so nothing fails over abruptly.
* **Voluntary moves** only while ``migration_prohibited`` does not exist (``moves``); a move
  under way when it appears holds where it is until it is gone.  The controller reads the
  flag and the servers' records before its first step.

A server gone from the group counts as live for ``node_grace`` seconds (safe mode), then its
topics get a replacement (a repair, with ``migration_prohibited`` too); the surviving replica
took over as primary by itself meanwhile.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from collections.abc import Set as AbstractSet
from typing import Any

import attrs
import trio

from examples.message_broker.layout import (
    APP_NAME,
    BrokerPaths,
    Isr,
    NodeRecord,
    ServerState,
    decode,
)
from framework import errors, records
from framework.logs import get_logger
from framework.primitives import Group
from framework.runtime import (
    Master,
    MasterContext,
    PlacementRules,
    Readiness,
    ReplicatedPlacement,
)
from framework.zk import watch_children, watch_data

__all__ = ["BrokerController", "in_sync_ready", "placement_rules", "topic_readiness"]

log = get_logger("examples.message_broker.controller")

REPLICAS = 2


def placement_rules(nodes: dict[str, NodeRecord], *, prohibited: bool) -> PlacementRules:
    """The broker's placement rules from the servers' ``nodes/`` records (pure): stopping
    servers retire, reported backups are replaced and avoided, primaries are protected,
    moves only without ``migration_prohibited``."""
    replace: dict[str, set[str]] = {}
    protected: dict[str, set[str]] = {}
    for server, record in nodes.items():
        for topic, backups in record.out_of_sync.items():
            replace.setdefault(topic, set()).update(backups)
        for topic in record.primaries:
            protected.setdefault(topic, set()).add(server)
    return PlacementRules(
        retiring=frozenset(s for s, r in nodes.items() if r.state is ServerState.STOPPING),
        avoid=frozenset().union(*replace.values()) if replace else frozenset(),
        replace={t: frozenset(b) for t, b in replace.items()},
        protected={t: frozenset(s) for t, s in protected.items()},
        moves=not prohibited, keep_targets=True)


def topic_readiness(record: Isr, planned: Sequence[str], candidates: AbstractSet[str],
                    has_primary: bool) -> tuple[frozenset[str], frozenset[str]]:
    """(ready, keep) of a topic (pure): ready = the planned servers in its in-sync set; keep =
    the primary it names, and - while nobody is primary - its dead in-sync replicas."""
    keep = {record.leader} if record.leader in planned else set()
    if not has_primary:
        keep.update(s for s in planned if s not in candidates and s in record.in_sync)
    return frozenset(s for s in planned if s in record.in_sync), frozenset(keep)


def in_sync_ready(paths: BrokerPaths) -> Any:
    """The broker's ready rule for :class:`ReplicatedPlacement` (see the module doc): reads
    the topic's ``isr`` (and, with a placed server gone, its ``primary``) with watches, and
    has the dropping multi check both versions.  An ``isr`` that is not a record
    (``broker.record_corrupt``) makes no replica ready and keeps every one: no move."""

    async def rule(placement: ReplicatedPlacement, topic: str, planned: Sequence[str],
                   candidates: AbstractSet[str]) -> Readiness | None:
        session = placement.ctx.session
        isr_path = paths.isr(topic)
        try:
            data, stat = await session.get(isr_path, watch=placement.wake_on(isr_path))
        except errors.NoNodeError:
            return None
        checks = [(isr_path, stat.version)]
        has_primary = True
        if any(s not in candidates for s in planned):
            primary_path = paths.primary(topic)
            primary = await session.exists(primary_path, watch=placement.wake_on(primary_path))
            has_primary = primary is not None
            if primary is not None:
                checks.append((primary_path, primary.version))
        try:
            record = decode(data, Isr)
        except records.CorruptRecord as exc:
            log.error("broker.record_corrupt", path=isr_path, error=str(exc))
            return Readiness(frozenset(), keep=frozenset(planned), checks=tuple(checks))
        ready, keep = topic_readiness(record, planned, candidates, has_primary)
        return Readiness(ready, keep=keep, checks=tuple(checks))

    return rule


@attrs.define
class _Known:
    """What the controller has read of the servers and the flag (``None``: not yet)."""

    nodes: dict[str, NodeRecord] | None = None
    prohibited: bool | None = None


def _node_records(members: dict[str, bytes]) -> dict[str, NodeRecord]:
    """The servers' ``nodes/`` records; one that is not a record is left out (logged)."""
    found: dict[str, NodeRecord] = {}
    for name, data in members.items():
        try:
            found[name] = decode(data, NodeRecord)
        except records.CorruptRecord as exc:
            log.error("broker.record_corrupt", server=name, error=str(exc))
    return found


class BrokerController(Master):
    """The broker's controller (see the module doc)."""

    app_name = APP_NAME
    stable_for = 1.0
    #: seconds a server gone from the group still counts as live (safe mode)
    node_grace = 1.0
    #: voluntary moves at once (each one copies a topic's log to its new backup)
    max_moves = 1000

    async def lead(self, ctx: MasterContext) -> None:
        session = ctx.session
        paths = BrokerPaths(ctx.app)
        for path in (paths.nodes, paths.topics):
            await session.ensure_path(path)
        log.info("controller.leading", controller=self.name, token=ctx.term.token)

        def new_topic(txn: Any, topic: str, replicas: list[str]) -> None:
            txn.create(paths.isr(topic), records.encode(Isr(tuple(replicas[:1]))))
            txn.create(paths.subscribers(topic))

        placement = ReplicatedPlacement(ctx, node_grace=self.node_grace,
                                        stable_for=self.stable_for, max_moves=self.max_moves,
                                        ready=in_sync_ready(paths), on_new_shard=new_topic)
        state = _Known()
        known = trio.Event()

        def update() -> None:
            if state.nodes is None or state.prohibited is None:
                return
            placement.set_rules(placement_rules(state.nodes, prohibited=state.prohibited))
            known.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._watch_nodes, session, paths, state, update)
            nursery.start_soon(self._watch_prohibited, session, paths, state, update)
            nursery.start_soon(self._watch_topics, session, paths, placement)
            await known.wait()  # migration_prohibited and the servers before any step

            async def placed(p: ReplicatedPlacement) -> None:
                log.debug("controller.step", topics=len(p.plan), live=sorted(p.live))

            await placement.run(placed)

    async def _watch_nodes(self, session: Any, paths: BrokerPaths, state: _Known,
                           update: Callable[[], None]) -> None:
        async for members in Group(session, paths.nodes).watch():
            state.nodes = _node_records(members)
            update()

    async def _watch_topics(self, session: Any, paths: BrokerPaths,
                            placement: ReplicatedPlacement) -> None:
        async for snap in watch_children(session, paths.topics):
            placement.set_shards({t: b"" for t in snap.children}, REPLICAS)

    async def _watch_prohibited(self, session: Any, paths: BrokerPaths,
                                state: _Known, update: Callable[[], None]) -> None:
        async for snap in watch_data(session, paths.migration_prohibited):
            state.prohibited = snap.exists
            log.info("controller.migration_prohibited", prohibited=snap.exists)
            update()
