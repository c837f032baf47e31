"""Replicated shard placement as a pure function (the master's "ideal state").

:func:`plan_replicas` takes the current plan (shard -> nodes), the live nodes, which replicas
are *serving* (observed from the nodes' deployment records) and the replication level R, and
returns the next plan.  Every master computes the same plan from the same inputs (ties break
by name).  Guarantees, for every output (checked by a hypothesis property test):

* the replicas of a shard are distinct live nodes;
* a shard has ``min(R, live nodes)`` replicas or more: missing replicas are added at once;
* never more than ``R + 1`` replicas: a move first *adds* the new replica (R+1), and the old
  one is removed in a later step only once the new one is serving, so a move never lowers
  the number of serving replicas;
* gradual rebalancing: at most ``max_moves`` moves are started per step, only when node
  loads differ by more than one; a shard with R+1 replicas whose extra one is not serving
  yet is left alone.

Nodes listed in ``excluded[shard]`` (they reported the shard corrupt) are never chosen for it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

Plan = dict[str, list[str]]


def plan_replicas(
    shards: Sequence[str],
    live: Sequence[str],
    current: Mapping[str, Sequence[str]],
    serving: Mapping[str, set[str]],
    replication: int,
    *,
    excluded: Mapping[str, set[str]] | None = None,
    max_moves: int = 2,
) -> Plan:
    """The next plan; see the module docstring for what it guarantees."""
    excluded = excluded or {}
    nodes = sorted(set(live))
    alive = set(nodes)
    plan: Plan = {}
    for shard in sorted(set(shards)):
        bad = excluded.get(shard, set())
        plan[shard] = [n for n in dict.fromkeys(current.get(shard, ())) if n in alive
                       and n not in bad]
    load = {n: 0 for n in nodes}
    for replicas in plan.values():
        for n in replicas:
            load[n] += 1

    def least_loaded(candidates: list[str]) -> str:
        return min(candidates, key=lambda n: (load[n], n))

    # 1. finish moves: R+1 replicas and all of them serving -> drop the most loaded one
    for shard, replicas in plan.items():
        while len(replicas) > replication:
            up = serving.get(shard, set())
            if not all(n in up for n in replicas):
                break
            victim = max(replicas, key=lambda n: (load[n], n))
            replicas.remove(victim)
            load[victim] -= 1
        while len(replicas) > replication + 1:  # never more than R+1 (e.g. R was lowered)
            victim = max(replicas, key=lambda n: (n not in serving.get(shard, set()),
                                                  load[n], n))
            replicas.remove(victim)
            load[victim] -= 1

    # 2. fill: every shard gets min(R, eligible nodes) replicas, on the least loaded nodes
    for shard, replicas in plan.items():
        bad = excluded.get(shard, set())
        while len(replicas) < replication:
            candidates = [n for n in nodes if n not in replicas and n not in bad]
            if not candidates:
                break
            target = least_loaded(candidates)
            replicas.append(target)
            load[target] += 1

    # 3. rebalance gradually: start at most max_moves moves from the heaviest to the lightest
    moving = sum(1 for r in plan.values() if len(r) > replication)
    while moving < max_moves and nodes:
        heavy = max(nodes, key=lambda n: (load[n], n))
        light = min(nodes, key=lambda n: (load[n], n))
        if load[heavy] - load[light] <= 1:
            break
        choice = None
        for shard in sorted(plan):
            replicas = plan[shard]
            if (heavy in replicas and light not in replicas and len(replicas) == replication
                    and light not in excluded.get(shard, set())):
                choice = shard
                break
        if choice is None:
            break
        plan[choice].append(light)  # the old replica goes once this one serves (step 1)
        load[light] += 1
        load[heavy] -= 1  # counted as gone already, so one step starts one move per gap
        moving += 1
    return plan
