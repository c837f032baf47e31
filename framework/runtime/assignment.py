"""Shard assignment as pure functions: sticky, balanced, deterministic.

:func:`plan_assignment` places each shard on one worker (``MasterContext.run_shards``);
:func:`plan_replicas` places R replicas of each shard, moving them without ever lowering the
number of serving replicas (``MasterContext.run_replicated``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence


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


Plan = dict[str, list[str]]


def plan_replicas(
    shards: Iterable[str],
    live: Iterable[str],
    current: Mapping[str, Sequence[str]],
    serving: Mapping[str, set[str]],
    replication: int | Mapping[str, int],
    *,
    excluded: Mapping[str, set[str]] | None = None,
    max_moves: int = 2,
) -> Plan:
    """Replicated placement: the next plan (shard -> workers) from the current one.

    ``live`` are the workers that may hold replicas, ``serving[shard]`` the workers that
    say they serve it (their deployment records), ``replication`` the number of replicas R
    (one for all shards, or one per shard), ``excluded[shard]`` workers never to choose for
    it (they refused it).  Every master computes the same plan from the same inputs (ties
    break by name).  Guarantees, for every output (a hypothesis property test checks them):

    * the replicas of a shard are distinct live workers, none excluded for it;
    * a shard has ``min(R, eligible workers)`` replicas or more: missing ones are added at
      once, on the least loaded workers;
    * never more than ``R + 1``: a move first *adds* the new replica (R+1), and drops the
      old one in a later step, once every replica of the shard serves, so a move never
      lowers the number of serving replicas;
    * gradual rebalancing: at most ``max_moves`` moves in flight, started only while
      worker loads differ by more than one; a stable live set converges to R replicas per
      shard with loads within one.
    """
    excluded = excluded or {}
    nodes = sorted(set(live))
    alive = set(nodes)
    plan: Plan = {}
    want: dict[str, int] = {}
    for shard in sorted(set(shards)):
        want[shard] = replication if isinstance(replication, int) else replication[shard]
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
        while len(replicas) > want[shard]:
            up = serving.get(shard, set())
            if not all(n in up for n in replicas):
                break
            victim = max(replicas, key=lambda n: (load[n], n))
            replicas.remove(victim)
            load[victim] -= 1
        while len(replicas) > want[shard] + 1:  # never more than R+1 (R was lowered)
            victim = max(replicas, key=lambda n: (n not in serving.get(shard, set()),
                                                  load[n], n))
            replicas.remove(victim)
            load[victim] -= 1

    # 2. fill: every shard gets min(R, eligible nodes) replicas, on the least loaded nodes
    for shard, replicas in plan.items():
        bad = excluded.get(shard, set())
        while len(replicas) < want[shard]:
            candidates = [n for n in nodes if n not in replicas and n not in bad]
            if not candidates:
                break
            target = least_loaded(candidates)
            replicas.append(target)
            load[target] += 1

    # 3. rebalance gradually: start at most max_moves moves from the heaviest to the lightest
    moving = sum(1 for s, r in plan.items() if len(r) > want[s])
    while moving < max_moves and nodes:
        heavy = max(nodes, key=lambda n: (load[n], n))
        light = min(nodes, key=lambda n: (load[n], n))
        if load[heavy] - load[light] <= 1:
            break
        choice = None
        for shard in sorted(plan):
            replicas = plan[shard]
            if (heavy in replicas and light not in replicas and len(replicas) == want[shard]
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
