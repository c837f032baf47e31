"""Shard assignment as pure functions: sticky, balanced, deterministic.

:func:`plan_assignment` places each shard on one worker (``MasterContext.run_shards``);
:func:`plan_replicas` places R replicas of each shard, moving them without ever lowering the
number of serving replicas (``MasterContext.run_replicated``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet


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
    keep: Mapping[str, AbstractSet[str]] | None = None,
    retiring: AbstractSet[str] = frozenset(),
    avoid: AbstractSet[str] = frozenset(),
    replace: Mapping[str, AbstractSet[str]] | None = None,
    moves: bool = True,
    keep_targets: bool = False,
) -> Plan:
    """Replicated placement: the next plan (shard -> workers) from the current one.

    ``live`` are the workers that may hold replicas, ``serving[shard]`` the workers whose
    replica counts as *ready* (a confirmed deployment record by default; the application's
    own rule otherwise, see :class:`~framework.runtime.placement.replicated.ReplicatedPlacement`),
    ``replication`` the number of replicas R (one for all shards, or one per shard),
    ``excluded[shard]`` workers never to choose for it (they refused it).  Every master
    computes the same plan from the same inputs (ties break by name).  Guarantees, for every
    output (a hypothesis property test checks them):

    * the replicas of a shard are distinct live workers, none excluded for it;
    * a shard has ``min(R, eligible workers)`` replicas or more: missing ones are added at
      once, on the least loaded workers;
    * never more than ``R + 1``: a move first *adds* the new replica (R+1), and drops the
      old one in a later step, once every replica of the shard is ready, so a move never
      lowers the number of ready replicas;
    * gradual rebalancing: at most ``max_moves`` moves in flight, started only while
      worker loads differ by more than one; a stable live set converges to R replicas per
      shard with loads within one.

    Optional rules (all empty by default, which is the plain algorithm above):

    * ``keep[shard]``: workers never dropped from the shard: a live one is never chosen to
      leave, nor moved by a rebalance; one that is not live stays planned (it may hold what
      nobody else holds), and a shard with such a replica starts no rebalancing move;
    * ``retiring``: workers on their way out: they keep the replicas they have until they
      leave ``live``, get no new one, and are never chosen to leave; their replicas are
      not counted when deciding that a shard has more than R;
    * ``avoid``: workers that get a new replica only when no other worker can take a
      missing one (no replacement, no rebalancing move goes to them);
    * ``replace[shard]``: replicas to replace now: a shard with R replicas, one of them
      listed, gets an extra one at once (make before break, whatever ``moves`` says), and
      a listed replica is the first to leave - it need not be ready itself, every other
      replica must be;
    * ``moves=False``: no rebalancing move starts and no replica leaves a shard with R+1
      (moves hold where they are; missing replicas are still added);
    * ``keep_targets``: the newest replica of a shard with R+1 (the one a move added, last
      in the plan) is never the one dropped to finish it, unless listed in ``replace``
      (by default the most loaded replica leaves, which after other drops may be the
      newest).
    """
    planner = _ReplicaPlanner(
        sorted(set(live)), serving, excluded or {}, keep or {}, replace or {}, retiring,
        avoid, keep_targets)
    planner.start(shards, current, replication)
    planner.finish_moves(moves)
    planner.fill()
    planner.replace_now()
    if moves:
        planner.rebalance(max_moves)
    return planner.plan


class _ReplicaPlanner:
    """The state of one :func:`plan_replicas` call (its options, the plan and each live
    worker's load as it is built), and its steps in order: :meth:`start`,
    :meth:`finish_moves`, :meth:`fill`, :meth:`replace_now`, :meth:`rebalance`."""

    def __init__(self, nodes: list[str], serving: Mapping[str, set[str]],
                 excluded: Mapping[str, set[str]], keep: Mapping[str, AbstractSet[str]],
                 replace: Mapping[str, AbstractSet[str]], retiring: AbstractSet[str],
                 avoid: AbstractSet[str], keep_targets: bool) -> None:
        self.nodes, self.alive = nodes, set(nodes)
        self.serving, self.excluded, self.keep, self.replace = serving, excluded, keep, replace
        self.retiring, self.avoid, self.keep_targets = retiring, avoid, keep_targets
        self.choosable = [n for n in nodes if n not in retiring]
        self.plan: Plan = {}
        self.want: dict[str, int] = {}
        self.load = {n: 0 for n in nodes}

    def start(self, shards: Iterable[str], current: Mapping[str, Sequence[str]],
              replication: int | Mapping[str, int]) -> None:
        """The current replicas that may stay (live or kept, not excluded), and the loads."""
        for shard in sorted(set(shards)):
            self.want[shard] = (replication if isinstance(replication, int)
                                else replication[shard])
            bad = self.excluded.get(shard, set())
            kept = self.keep.get(shard, frozenset())
            self.plan[shard] = [n for n in dict.fromkeys(current.get(shard, ()))
                                if (n in self.alive or n in kept) and n not in bad]
        for replicas in self.plan.values():
            for n in replicas:
                if n in self.load:
                    self.load[n] += 1

    def _counted(self, replicas: list[str]) -> int:
        return sum(1 for n in replicas if n not in self.retiring)

    def _droppable(self, shard: str, replicas: list[str]) -> list[str]:
        kept = self.keep.get(shard, frozenset())
        leaving = self.replace.get(shard, frozenset())
        return [n for i, n in enumerate(replicas) if n not in kept and n not in self.retiring
                and not (self.keep_targets and i == len(replicas) - 1 and n not in leaving)]

    def _drop(self, replicas: list[str], victim: str) -> None:
        replicas.remove(victim)
        if victim in self.load:
            self.load[victim] -= 1

    def _add(self, replicas: list[str], target: str) -> None:
        replicas.append(target)
        self.load[target] += 1

    def finish_moves(self, moves: bool) -> None:
        """1. A shard with R+1 replicas, every staying one ready: drop the most loaded one
        (with ``moves``); never more than R+1 (R was lowered)."""
        for shard, replicas in self.plan.items():
            up = self.serving.get(shard, set())
            leaving = self.replace.get(shard, frozenset())
            while moves and self._counted(replicas) > self.want[shard]:
                choices = self._droppable(shard, replicas)
                if not choices:
                    break
                victim = max(choices, key=lambda n: (n in leaving, self.load.get(n, 0), n))
                if not all(n in up for n in replicas if n != victim) or (
                        victim not in up and victim not in leaving):
                    break
                self._drop(replicas, victim)
            while self._counted(replicas) > self.want[shard] + 1:
                choices = self._droppable(shard, replicas)
                if not choices:
                    break
                victim = max(choices, key=lambda n: (n not in up, self.load.get(n, 0), n))
                self._drop(replicas, victim)

    def fill(self) -> None:
        """2. Every shard gets min(R, eligible workers) replicas, on the least loaded."""
        for shard, replicas in self.plan.items():
            bad = self.excluded.get(shard, set())
            while len(replicas) < self.want[shard]:
                candidates = [n for n in self.choosable if n not in replicas and n not in bad]
                if not candidates:
                    break
                self._add(replicas, min(candidates,
                                        key=lambda n: (n in self.avoid, self.load[n], n)))

    def replace_now(self) -> None:
        """2b. A shard with R replicas, one of them to be replaced, gets one more now."""
        for shard, replicas in self.plan.items():
            leaving = self.replace.get(shard, frozenset())
            if self._counted(replicas) != self.want[shard] or not leaving & set(replicas):
                continue
            bad = self.excluded.get(shard, set())
            candidates = [n for n in self.choosable if n not in replicas and n not in bad
                          and n not in self.avoid]
            if candidates:
                self._add(replicas, min(candidates, key=lambda n: (self.load[n], n)))

    def rebalance(self, max_moves: int) -> None:
        """3. Start at most ``max_moves`` moves (counting those in flight) from the most
        loaded worker to the least loaded while their loads differ by more than one."""
        load = self.load
        moving = sum(1 for s, r in self.plan.items() if self._counted(r) > self.want[s])
        targets = [n for n in self.choosable if n not in self.avoid]
        while moving < max_moves and targets:
            light = min(targets, key=lambda n: (load[n], n))
            found = self._movable(light)
            if found is None:
                return
            choice, heavy = found
            self.plan[choice].append(light)  # the old replica goes once this one serves
            load[light] += 1
            load[heavy] -= 1  # counted as gone already, so one step starts one move per gap
            moving += 1

    def _movable(self, light: str) -> tuple[str, str] | None:
        """(shard, worker): a replica the most loaded worker may give to ``light`` (one
        kept there, say a primary, stays: then the next worker down), or ``None``."""
        load = self.load
        for worker in sorted(self.choosable, key=lambda n: (-load[n], n)):
            if load[worker] - load[light] <= 1:
                return None
            for shard in sorted(self.plan):
                replicas = self.plan[shard]
                if (worker in replicas and light not in replicas
                        and len(replicas) == self.want[shard]
                        and light not in self.excluded.get(shard, set())
                        and worker not in self.keep.get(shard, frozenset())
                        and all(n in self.alive for n in replicas)):
                    return shard, worker
        return None
