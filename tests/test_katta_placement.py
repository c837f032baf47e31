"""Property test of the runtime's replicated placement (``framework.runtime.plan_replicas``,
used by the Katta example): random join/leave sequences, with nodes that take their time to
serve what they are given (a new replica serves only some steps later)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from framework.runtime import plan_replicas

NODES = [f"n{i}" for i in range(7)]

events = st.lists(st.tuples(st.sampled_from(("join", "leave")), st.sampled_from(NODES)),
                  min_size=1, max_size=25)


@settings(max_examples=200, deadline=None)
@given(events=events, shards=st.integers(1, 12), replication=st.integers(1, 3),
       max_moves=st.integers(1, 3), data=st.data())
def test_placement_invariants(events: list[tuple[str, str]], shards: int, replication: int,
                              max_moves: int, data: st.DataObject) -> None:
    names = [f"{s:05d}" for s in range(shards)]
    live: set[str] = {"n0"}
    plan: dict[str, list[str]] = {}
    serving: dict[str, set[str]] = {}

    def step(all_come_up: bool = False) -> None:
        nonlocal plan, serving
        before = {s: set(plan.get(s, ())) & serving.get(s, set()) & live for s in names}
        plan = plan_replicas(names, sorted(live), plan, serving, replication,
                             max_moves=max_moves)
        for shard, nodes in plan.items():
            assert len(set(nodes)) == len(nodes), "replicas on distinct nodes"
            assert set(nodes) <= live, "only live nodes"
            assert len(nodes) <= replication + 1, "never more than R+1"
            assert len(nodes) >= min(replication, len(live)), "never fewer than live allows"
            # a move never lowers the serving count: what served and is still planned
            still = set(nodes) & before[shard]
            assert len(still) >= min(len(before[shard]), replication), (
                f"shard {shard}: serving {sorted(before[shard])} -> planned {nodes}")
        # the nodes follow the plan: an unassigned replica stops serving at once, a new one
        # starts serving only when it has copied and opened the shard - some steps later
        pending = sorted((s, n) for s, nodes in plan.items() for n in nodes
                         if n not in serving.get(s, set()))
        if all_come_up:
            up = set(pending)
        else:
            up = {p for p in pending if data.draw(st.booleans(), label=f"{p} serves")}
        serving = {s: {n for n in nodes if n in serving.get(s, set()) or (s, n) in up}
                   for s, nodes in plan.items()}

    for kind, node in events:
        if kind == "join":
            live.add(node)
        elif len(live) > 1:
            live.discard(node)
            serving = {s: n - {node} for s, n in serving.items()}
        step()
    for _ in range(4 * shards * replication + 4):  # a stable live set converges
        step(all_come_up=True)
    load = {n: 0 for n in live}
    for nodes in plan.values():
        assert len(nodes) == min(replication, len(live))
        for n in nodes:
            load[n] += 1
    assert max(load.values()) - min(load.values()) <= 1, load


@settings(max_examples=150, deadline=None)
@given(live=st.sets(st.sampled_from(NODES), min_size=1), shards=st.integers(1, 8),
       replication=st.integers(1, 3), data=st.data())
def test_nodes_that_found_a_shard_corrupt_are_never_chosen(
        live: set[str], shards: int, replication: int, data: st.DataObject) -> None:
    names = [f"{s:05d}" for s in range(shards)]
    excluded = {s: data.draw(st.sets(st.sampled_from(NODES)), label=f"corrupt on {s}")
                for s in names}
    plan: dict[str, list[str]] = {}
    serving: dict[str, set[str]] = {}
    for _ in range(3 * shards * replication + 3):
        plan = plan_replicas(names, sorted(live), plan, serving, replication,
                             excluded=excluded)
        for shard, nodes in plan.items():
            eligible = live - excluded[shard]
            assert set(nodes) <= eligible, "never a node that reported it corrupt"
            assert len(set(nodes)) == len(nodes) <= replication + 1
            assert len(nodes) >= min(replication, len(eligible)), "elsewhere, if possible"
        serving = {s: set(n) for s, n in plan.items()}


@settings(max_examples=100, deadline=None)
@given(live=st.sets(st.sampled_from(NODES), min_size=1),
       replication=st.lists(st.integers(1, 3), min_size=1, max_size=8), data=st.data())
def test_replication_per_shard(live: set[str], replication: list[int],
                               data: st.DataObject) -> None:
    """One R per shard (indexes of different replication share the nodes): each shard
    converges to its own min(R, live), never above R+1, loads within one at the end."""
    names = [f"s{n}" for n in range(len(replication))]
    want = dict(zip(names, replication, strict=True))
    plan: dict[str, list[str]] = {}
    serving: dict[str, set[str]] = {}
    for _ in range(4 * sum(replication) + 4):
        plan = plan_replicas(names, sorted(live), plan, serving, want)
        for shard, nodes in plan.items():
            assert len(set(nodes)) == len(nodes) and set(nodes) <= live
            assert min(want[shard], len(live)) <= len(nodes) <= want[shard] + 1
        serving = {s: {n for n in nodes if data.draw(st.booleans()) or n in serving.get(s, ())}
                   for s, nodes in plan.items()}
    for _ in range(4 * sum(replication) + 4):  # then every replica comes up
        plan = plan_replicas(names, sorted(live), plan, serving, want)
        serving = {s: set(nodes) for s, nodes in plan.items()}
    assert all(len(plan[s]) == min(want[s], len(live)) for s in names), plan
