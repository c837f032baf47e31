"""What an application says about the replicated placement: readiness and rules.

A *ready rule* (:data:`~framework.runtime.placement.replicated.ReadyRule`, asked by the
placement loop) says which replicas of a shard count as ready, so that another may leave: its
answer is a :class:`Readiness`.  :class:`PlacementRules` constrain where replicas go and which
may leave.  Data only: the rules' types are here, the loop that applies them in
:mod:`~framework.runtime.placement.replicated`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import attrs


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
