"""What an application says about the replicated placement: readiness and rules.

A *ready rule* tells the placement loop (:class:`~framework.runtime.placement.replicated.
ReplicatedPlacement`) which replicas of a shard count as ready, so that another may leave
(:class:`Readiness`); :func:`confirmed_records` is the default (Katta's confirmed deployment
records).  :class:`PlacementRules` constrain where replicas go and which may leave.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import TYPE_CHECKING, Any

import attrs

if TYPE_CHECKING:
    from framework.runtime.placement.replicated import ReplicatedPlacement


@attrs.frozen
class Readiness:
    """What a ready rule says of one shard at one step.

    ``ready``: the planned replicas that count as ready (a replica may leave a shard only
    while every replica that stays is ready).  ``keep``: replicas never dropped now - a
    live one is never the one to leave, one that is not live stays planned.  ``records``:
    worker -> (path, version) read now, checked in the multi that drops a live replica, for
    each worker that stays; ``checks``: (path, version) pairs checked in any multi that
    drops a replica of the shard.  A version that changed meanwhile fails the multi: the
    step is retried from a fresh read."""

    ready: frozenset[str] = frozenset()
    keep: frozenset[str] = frozenset()
    records: Mapping[str, tuple[str, int]] = attrs.field(factory=dict)
    checks: tuple[tuple[str, int], ...] = ()


#: The ready rule: ``(placement, shard, planned, candidates)`` -> the shard's readiness, or
#: ``None`` (no opinion: the deployment records as watched count, nothing kept or checked).
#: ``candidates`` are the workers that may hold replicas now (live, or lost in grace).  Asked
#: only while the loop runs, after every change; it may arm watches with
#: :meth:`ReplicatedPlacement.wake_on` so that a change of what it read wakes the loop.
ReadyRule = Callable[["ReplicatedPlacement", str, Sequence[str], AbstractSet[str]],
                     Awaitable["Readiness | None"]]

#: Adds operations to the multi that creates a shard: ``(txn, shard, planned workers)``.
NewShardHook = Callable[[Any, str, list[str]], None]


@attrs.frozen
class PlacementRules:
    """Constraints an application puts on the placement (see
    :func:`~framework.runtime.placement.assignment.plan_replicas` for their exact meaning).

    ``retiring``: workers on their way out - they keep their replicas until they leave the
    group, get no new one and are never the one dropped.  ``avoid``: workers that get a new
    replica only when nobody else can take a missing one.  ``replace``: shard -> replicas to
    replace now (an extra replica at once; they leave first, once the others are ready).
    ``protected``: shard -> replicas never chosen to leave nor moved.  ``moves``: whether
    rebalancing moves start and moves finish (False: they hold where they are).
    ``keep_targets``: a move's new replica is never the one dropped to finish it."""

    retiring: frozenset[str] = frozenset()
    avoid: frozenset[str] = frozenset()
    replace: Mapping[str, frozenset[str]] = attrs.field(factory=dict)
    protected: Mapping[str, frozenset[str]] = attrs.field(factory=dict)
    moves: bool = True
    keep_targets: bool = False


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
