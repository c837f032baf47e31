"""Shard assignment as a pure function: sticky, balanced, deterministic."""

from __future__ import annotations

from collections.abc import Iterable, Mapping


def plan_assignment(
    shards: Iterable[str], workers: Iterable[str], current: Mapping[str, str]
) -> dict[str, str]:
    """Map every shard to one live worker.

    Keeps every shard where it is when its worker is alive (sticky), gives orphaned and new
    shards to the least-loaded workers, then moves shards off the most loaded workers until
    loads differ by at most one.  Ties break by name, so every master computes the same plan.
    """
    live = sorted(set(workers))
    wanted = sorted(set(shards))
    if not live:
        return {}
    plan = {s: current[s] for s in wanted if current.get(s) in live}
    load = {w: 0 for w in live}
    for w in plan.values():
        load[w] += 1
    for shard in wanted:
        if shard not in plan:
            target = min(live, key=lambda w: (load[w], w))
            plan[shard] = target
            load[target] += 1
    while True:
        heavy = max(live, key=lambda w: (load[w], w))
        light = min(live, key=lambda w: (load[w], w))
        if load[heavy] - load[light] <= 1:
            return plan
        shard = max(s for s, w in plan.items() if w == heavy)
        plan[shard] = light
        load[heavy] -= 1
        load[light] += 1
