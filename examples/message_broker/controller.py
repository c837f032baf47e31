"""The controller: the runtime's elected master (``BrokerController``, run 2 or more).

It keeps every topic placed on two distinct live servers, balanced by load (replicas per
server).  Its inputs are ZooKeeper only (``nodes/``, ``topics/``, each topic's ``placement``),
read afresh when a term starts, so a new controller resumes exactly where the old one stopped;
its outputs are fenced multis (``check`` of its election node first), so a deposed controller
cannot write.

* A topic created by ``ctl`` (``topics/<t>`` with settings, no placement) gets a placement,
  an ``isr`` naming its first replica (that server takes the primary znode) and the two
  ``assign/<server>/<t>`` entries, in one multi per batch of topics.
* A server gone from ``nodes/`` (after the membership has been stable for ``stable_for``
  seconds: safe mode) is replaced in each of its topics by the least-loaded live server not
  already there.  The surviving replica keeps serving meanwhile (its backup took over as
  primary by itself); the new one catches up before it counts as in sync.  This repair is not
  a voluntary move: it happens with ``migration_prohibited`` too.
* A placed backup that a primary dropped from the in-sync set (it stayed behind for the lag
  limit, or its link closed: the primary lists it as ``out_of_sync`` in its ``nodes/``
  record) gets a replacement at once, as a make-before-break move: a third replica on the
  least-loaded server, and the dropped one leaves the placement once the new one is in sync.
  So a hung backup of a ``refuse`` topic holds publishing back for about the lag limit plus
  the new replica's catch-up, not until its session expires.  Not a voluntary move.
* A server that is stopping gracefully (``state: stopping`` in its record) keeps its
  replicas until it has left ``nodes/``: it hands its primaries over first, so nothing
  fails over abruptly; it gets no new replica meanwhile.
* Voluntary moves (rebalancing onto a server that joined) are made only while
  ``migration_prohibited`` does not exist, one backup at a time per topic, never a primary.
  A move under way when it appears holds where it is (the extra replica stays, the old
  backup is not removed) until it is gone.  A new term reads ``migration_prohibited`` before
  its first change.
"""

from __future__ import annotations

from typing import Any

import trio

from examples.message_broker.layout import APP_NAME, BrokerPaths, Isr, dumps, loads
from framework import errors
from framework.logs import get_logger
from framework.primitives import Group
from framework.runtime import Master, MasterContext
from framework.zk import Session, wait_exists, watch_children, watch_data

__all__ = ["BrokerController", "plan_placement"]

log = get_logger("examples.message_broker.controller")

REPLICAS = 2
#: topics per fenced multi
BATCH = 40


def plan_placement(topics: list[str], current: dict[str, list[str]], live: list[str], *,
                   voluntary: bool, isr: dict[str, Isr] | None = None,
                   out_of_sync: dict[str, set[str]] | None = None,
                   draining: frozenset[str] = frozenset(),
                   stranded: dict[str, set[str]] | None = None) -> dict[str, list[str]]:
    """The new placement: every topic on ``REPLICAS`` distinct live servers when possible.

    Sticky: a live replica is never removed for a repair.  New replicas go to the least
    loaded live server (ties by name).  With ``voluntary``, a topic whose backup sits on a
    server holding more than one replica above the least loaded one gets a *third* replica
    there (make before break); a topic with three replicas drops the extra old backup only
    once ``isr[topic]`` shows the newest replica in sync, never the current primary, and
    only with ``voluntary`` (without it a move holds where it is).

    ``out_of_sync[topic]``: placed backups its primary dropped from the in-sync set; a topic
    with one gets a third replica (a repair, with or without ``voluntary``).  ``draining``:
    servers stopping gracefully - they keep their replicas (not counted as load) and get no
    new one.  A server named in any topic's ``out_of_sync`` (a hung or slow one) gets no new replica
    while it is named, not even by a voluntary move (its replicas leaving make it look
    lightest), unless no other server can take a repair.

    ``stranded[topic]``: dead replicas kept in the placement (in-sync replicas of a topic
    that has no primary: one of them may be the only server holding every acknowledged
    record, so they stay assigned to serve it when they return, and the topic makes no move
    meanwhile).
    """
    isr = isr or {}
    out_of_sync = out_of_sync or {}
    suspects = set().union(*out_of_sync.values()) if out_of_sync else set()
    stranded = stranded or {}
    load = {s: 0 for s in live}
    plan: dict[str, list[str]] = {}
    for topic in topics:
        kept = [s for s in current.get(topic, []) if s in load or s in stranded.get(topic, ())]
        kept = [s for s in current.get(topic, []) if s in kept or s in draining]
        plan[topic] = kept
        leaving = _leaving(kept, isr.get(topic), draining, suspects)
        for s in kept:
            if s != leaving and s in load:  # a replica on its way out no longer counts as load
                load[s] += 1
    for topic in sorted(topics):
        replicas = plan[topic]
        if len(replicas) > REPLICAS:  # a move in progress: finish it once the new one is in
            record = isr.get(topic)
            drop = _leaving(replicas, record, draining, suspects)
            if voluntary and record is not None and replicas[-1] in record.in_sync \
                    and drop is not None:
                replicas.remove(drop)
            continue
        while len(replicas) < REPLICAS:
            candidates = [s for s in sorted(load, key=lambda s: (s in suspects, load[s], s))
                          if s not in replicas]
            if not candidates:
                break
            replicas.append(candidates[0])
            load[candidates[0]] += 1
    for topic in sorted(topics):  # replace a backup its primary dropped (make before break)
        replicas = plan[topic]
        if len(replicas) != REPLICAS or not out_of_sync.get(topic, set()) & set(replicas):
            continue
        candidates = [s for s in sorted(load, key=lambda s: (load[s], s))
                      if s not in replicas and s not in draining and s not in suspects]
        if candidates:
            replicas.append(candidates[0])
            load[candidates[0]] += 1
    if voluntary and live:
        for topic in sorted(topics):
            replicas = plan[topic]
            if len(replicas) != REPLICAS or topic in stranded:
                continue
            leader = isr[topic].leader if topic in isr else replicas[0]
            movable = [s for s in replicas if s != leader and s in load]
            if not movable:
                continue
            targets = [s for s in sorted(load) if s not in suspects]
            if not targets:
                continue
            lightest = min(targets, key=lambda s: load[s])
            if lightest not in replicas and load[movable[0]] - load[lightest] > 1:
                replicas.append(lightest)  # make before break
                load[movable[0]] -= 1  # counted as gone: it leaves once the new one is in
                load[lightest] += 1
    return plan


def _leaving(replicas: list[str], record: Isr | None, draining: frozenset[str] = frozenset(),
             suspects: set[str] | frozenset[str] = frozenset()) -> str | None:
    """During a move (more than ``REPLICAS`` replicas), the one that will leave: a replica
    reported out of sync if there is one, else the oldest; never the primary, the newest
    replica, or a server stopping gracefully (it leaves by itself once it has handed over)."""
    if len(replicas) <= REPLICAS:
        return None
    leader = record.leader if record is not None else replicas[0]
    candidates = [s for s in replicas[:-1] if s != leader and s not in draining]
    return next((s for s in candidates if s in suspects), next(iter(candidates), None))


class BrokerController(Master):
    """The broker's controller (see the module doc)."""

    app_name = APP_NAME
    stable_for = 1.0

    async def lead(self, ctx: MasterContext) -> None:
        session = ctx.session
        paths = BrokerPaths(ctx.app)
        for path in (paths.nodes, paths.topics, paths.assign):
            await session.ensure_path(path)
        log.info("controller.leading", controller=self.name, token=ctx.term.token)
        placement = await self._read_placement(session, paths)
        changes_send, changes = trio.open_memory_channel[str](100)
        state: dict[str, Any] = {"live": None, "topics": None, "prohibited": None,
                                 "isr": {}, "watching": set(), "out_of_sync": {},
                                 "draining": frozenset(), "stranded": {},
                                 "awaiting_primary": set()}
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._watch_nodes, session, paths, state, changes_send)
            nursery.start_soon(self._watch_topics, session, paths, state, changes_send)
            nursery.start_soon(self._watch_prohibited, session, paths, state, changes_send)
            while True:
                kind = await changes.receive()
                if kind == "nodes":  # safe mode: wait until membership is stable
                    while True:
                        with trio.move_on_after(self.stable_for) as quiet:
                            kind = await changes.receive()
                        if quiet.cancelled_caught:
                            break
                if None in (state["live"], state["topics"], state["prohibited"]):
                    continue  # not everything read yet (migration_prohibited included)
                for _attempt in range(3):  # a conflict re-reads the placement, then again
                    if await self._reconcile(ctx, paths, state, placement):
                        break
                for topic, replicas in placement.items():
                    if len(replicas) > REPLICAS and topic not in state["watching"]:
                        state["watching"].add(topic)
                        nursery.start_soon(self._watch_move, session, paths, topic, state,
                                           placement, changes_send)
                for topic in set(state["stranded"]) - state["awaiting_primary"]:
                    state["awaiting_primary"].add(topic)
                    nursery.start_soon(_await_primary, session, paths, topic, state,
                                       changes_send)

    async def _read_placement(self, session: Session, paths: BrokerPaths) -> dict[str, list[str]]:
        placement: dict[str, list[str]] = {}
        for topic in await session.children(paths.topics):
            try:
                data, _ = await session.get(paths.placement(topic))
            except errors.NoNodeError:
                continue
            placement[topic] = list(loads(data).get("replicas", []))
        return placement

    async def _watch_move(self, session: Session, paths: BrokerPaths, topic: str,
                          state: dict[str, Any], placement: dict[str, list[str]],
                          send: trio.MemorySendChannel[str]) -> None:
        """While ``topic`` has an extra replica (a move), follow its in-sync set."""
        try:
            async for snap in watch_data(session, paths.isr(topic)):
                if len(placement.get(topic, [])) <= REPLICAS:
                    return
                state["isr"][topic] = Isr.decode(snap.data)
                await send.send("isr")
        finally:
            state["watching"].discard(topic)
            state["isr"].pop(topic, None)

    async def _watch_nodes(self, session: Session, paths: BrokerPaths, state: dict[str, Any],
                           send: trio.MemorySendChannel[str]) -> None:
        async for members in Group(session, paths.nodes).watch():
            records = {n: loads(d) for n, d in members.items()}
            live = sorted(n for n, r in records.items() if r.get("state", "running") == "running")
            draining = frozenset(n for n, r in records.items() if r.get("state") == "stopping")
            out_of_sync: dict[str, set[str]] = {}
            for record in records.values():
                for topic, backups in (record.get("out_of_sync") or {}).items():
                    out_of_sync.setdefault(topic, set()).update(backups)
            if out_of_sync != state["out_of_sync"]:
                state["out_of_sync"] = out_of_sync
                if live == state["live"] and draining == state["draining"]:
                    await send.send("out_of_sync")  # no safe-mode wait: nobody left
            if live != state["live"] or draining != state["draining"]:
                state["live"], state["draining"] = live, draining
                await send.send("nodes")

    async def _watch_topics(self, session: Session, paths: BrokerPaths, state: dict[str, Any],
                            send: trio.MemorySendChannel[str]) -> None:
        async for snap in watch_children(session, paths.topics):
            state["topics"] = list(snap.children)
            await send.send("topics")

    async def _watch_prohibited(self, session: Session, paths: BrokerPaths,
                                state: dict[str, Any], send: trio.MemorySendChannel[str]) -> None:
        async for snap in watch_data(session, paths.migration_prohibited):
            state["prohibited"] = snap.exists
            log.info("controller.migration_prohibited", prohibited=snap.exists)
            await send.send("prohibited")

    async def _reconcile(self, ctx: MasterContext, paths: BrokerPaths, state: dict[str, Any],
                         placement: dict[str, list[str]]) -> bool:
        """Drive the written placement towards the plan; False after a conflict."""
        topics = sorted(state["topics"])
        state["stranded"] = await _stranded(ctx.session, paths, placement, state["live"])
        plan = plan_placement(topics, placement, state["live"], voluntary=not state["prohibited"],
                              isr=state["isr"], out_of_sync=state["out_of_sync"],
                              draining=state["draining"],
                              stranded=state["stranded"])
        changed = [t for t in topics if plan[t] != placement.get(t)]
        known_dirs: set[str] = set(await ctx.session.children(paths.assign))
        for start in range(0, len(changed), BATCH):
            chunk = changed[start:start + BATCH]

            def build(txn: Any, chunk: list[str] = chunk) -> None:
                for server in sorted({s for t in chunk for s in plan[t]} - known_dirs):
                    txn.create(paths.assign_dir(server))
                    known_dirs.add(server)
                for topic in chunk:
                    old, new = placement.get(topic), plan[topic]
                    doc = dumps({"replicas": new})
                    if old is None:
                        txn.create(paths.placement(topic), doc)
                        txn.create(paths.isr(topic), Isr(tuple(new[:1])).encode())
                        txn.create(paths.subscribers(topic))
                    else:
                        txn.set(paths.placement(topic), doc)
                    for server in set(old or []) - set(new):
                        txn.delete(f"{paths.assign_dir(server)}/{topic}")
                    for server in set(new) - set(old or []):
                        txn.create(f"{paths.assign_dir(server)}/{topic}")

            try:
                await ctx.term.commit(build)
            except errors.TransactionFailedError as exc:
                # a topic deleted under us, or an assign entry already there: re-read and retry
                log.warning("controller.placement_conflict", error=str(exc))
                placement.clear()
                placement.update(await self._read_placement(ctx.session, paths))
                return False
            for topic in chunk:
                log.info("controller.placed", topic=topic, replicas=plan[topic],
                         was=placement.get(topic),
                         out_of_sync=sorted(state["out_of_sync"].get(topic, ())),
                         in_sync=list(state["isr"][topic].in_sync)
                         if topic in state["isr"] else None)
                placement[topic] = list(plan[topic])
        if changed:
            log.info("controller.reconciled", topics=len(topics), changed=len(changed),
                     live=state["live"])
        return True


async def _stranded(session: Session, paths: BrokerPaths, placement: dict[str, list[str]],
                    live: list[str]) -> dict[str, set[str]]:
    """Per topic with a dead in-sync replica and no primary: its dead in-sync replicas.

    Only a server can tell whether its log proves it holds every acknowledged record (its
    copy token), so while nobody serves the topic every dead in-sync replica stays placed: it
    may be the only one able to take over when it returns.  Reads ``isr`` (and ``primary``)
    of topics with a dead replica only, so only after failures."""
    alive = set(live)
    out: dict[str, set[str]] = {}
    for topic, replicas in placement.items():
        if all(s in alive for s in replicas):
            continue
        try:
            record = Isr.decode((await session.get(paths.isr(topic)))[0])
        except errors.NoNodeError:
            continue
        dead = {s for s in record.in_sync if s in replicas and s not in alive}
        if dead and await session.exists(paths.primary(topic)) is None:
            out[topic] = dead
    return out


async def _await_primary(session: Session, paths: BrokerPaths, topic: str,
                         state: dict[str, Any], send: trio.MemorySendChannel[str]) -> None:
    """A stranded topic got a primary again: reconcile (its dead replicas may go now)."""
    try:
        await wait_exists(session, paths.primary(topic))
    finally:
        state["awaiting_primary"].discard(topic)
    await send.send("primary")
