"""The broker's placement rules on the runtime's replicated placement (issue #25, item 7):
pure functions, no ZooKeeper.

``plan`` composes what the controller's :class:`ReplicatedPlacement` step does: the rules
from the servers' ``nodes/`` records (:func:`placement_rules`), the readiness of each topic
from its ``isr`` (:func:`topic_readiness`: ready = in sync, keep = the primary and, while
nobody is primary, the dead in-sync replicas), then :func:`plan_replicas`."""

from __future__ import annotations

from collections import Counter

from examples.message_broker.controller import (
    REPLICAS,
    BrokerController,
    placement_rules,
    topic_readiness,
)
from examples.message_broker.layout import Isr, NodeRecord, ServerState
from framework.runtime import plan_replicas


def plan(topics: list[str], current: dict[str, list[str]], live: list[str], *,
         records: dict[str, NodeRecord] | None = None, prohibited: bool = False,
         isr: dict[str, Isr] | None = None, primaryless: frozenset[str] = frozenset()
         ) -> dict[str, list[str]]:
    rules = placement_rules(records or {}, prohibited=prohibited)
    serving: dict[str, set[str]] = {}
    keep = {t: set(s) for t, s in rules.protected.items()}
    for topic, record in (isr or {}).items():
        ready, kept = topic_readiness(record, current.get(topic, []), set(live),
                                      topic not in primaryless)
        serving[topic] = set(ready)
        keep.setdefault(topic, set()).update(kept)
    return plan_replicas(topics, live, {t: list(r) for t, r in current.items()}, serving,
                         REPLICAS, keep=keep, retiring=rules.retiring & set(live),
                         avoid=rules.avoid, replace=rules.replace, moves=rules.moves,
                         keep_targets=rules.keep_targets,
                         max_moves=BrokerController.max_moves)


def reported(primary: str, topic: str, backup: str) -> dict[str, NodeRecord]:
    return {primary: NodeRecord(primary, primaries=(topic,), out_of_sync={topic: (backup,)})}


def test_placement_spreads_topics_and_repairs_without_moving_live_replicas() -> None:
    topics = [f"t{i}" for i in range(9)]
    placed = plan(topics, {}, ["a", "b", "c"])
    assert all(len(set(r)) == 2 for r in placed.values())
    load = Counter(s for r in placed.values() for s in r)
    assert max(load.values()) - min(load.values()) <= 1
    repaired = plan(topics, placed, ["a", "b"], prohibited=True)  # a repair, not a move
    for topic, replicas in repaired.items():
        assert set(replicas) == {"a", "b"}
        kept = [s for s in placed[topic] if s != "c"]
        assert replicas[: len(kept)] == kept  # live replicas stay, in place


def test_voluntary_moves_only_without_migration_prohibited_and_make_before_break() -> None:
    topics = [f"t{i}" for i in range(6)]
    current = plan(topics, {}, ["a", "b"])
    assert plan(topics, current, ["a", "b", "c"], prohibited=True) == current
    moving = plan(topics, current, ["a", "b", "c"])
    grown = [t for t in topics if len(moving[t]) == 3]
    assert grown and all(moving[t][-1] == "c" for t in grown)  # added before anything leaves
    # the old backup leaves only once the new replica is in sync, never the primary
    isr = {t: Isr(tuple(moving[t]), leader=moving[t][0]) for t in grown}
    done = plan(topics, moving, ["a", "b", "c"], isr=isr)
    for t in grown:  # (a further move may start at once: a leads every topic)
        assert done[t][:2] == [moving[t][0], "c"]
    waiting = {t: Isr(tuple(moving[t][:2]), leader=moving[t][0]) for t in grown}
    assert all(len(plan(topics, moving, ["a", "b", "c"], isr=waiting)[t]) == 3 for t in grown)
    # migration_prohibited appearing during a move: the move holds (nothing leaves)
    assert plan(topics, moving, ["a", "b", "c"], prohibited=True, isr=isr) == moving


def test_the_primary_is_never_the_one_to_leave() -> None:
    # b is the primary (it took over): the move's extra replica replaces a, not b
    current = {"t": ["a", "b", "c"]}
    isr = {"t": Isr(("a", "b", "c"), leader="b")}
    assert plan(["t"], current, ["a", "b", "c"], isr=isr)["t"] == ["b", "c"]
    # and a rebalance never moves a primary its server reports
    current = {"u": ["a", "b"], "v": ["a", "b"], "w": ["a", "b"]}
    records = {"a": NodeRecord("a", primaries=("u", "v", "w")), "b": NodeRecord("b")}
    moved = plan(["u", "v", "w"], current, ["a", "b", "c", "d"], records=records)
    assert all(moved[t][0] == "a" and "a" in moved[t] for t in moved)
    assert all(s in ("b", "c", "d") for t in moved for s in moved[t][1:])


def test_a_dropped_backup_gets_a_replacement_on_a_healthy_server() -> None:
    placed = plan(["t"], {"t": ["s1", "s2"]}, ["s1", "s2", "s3"], prohibited=True,
                  records=reported("s1", "t", "s2"))
    assert placed == {"t": ["s1", "s2", "s3"]}  # make before break, even without moves


def test_the_replacement_in_sync_sends_the_out_of_sync_backup_away() -> None:
    records = reported("s1", "t", "s2")
    current = {"t": ["s1", "s2", "s3"]}
    live = ["s1", "s2", "s3"]
    dropped = {"t": Isr(("s1", "s3"), "s1", 2)}  # s2 left the in-sync set, s3 caught up
    assert plan(["t"], current, live, records=records, isr=dropped) == {"t": ["s1", "s3"]}
    slow = {"t": Isr(("s1", "s2", "s3"), "s1", 2)}  # reported slow, still counted
    assert plan(["t"], current, live, records=records, isr=slow) == {"t": ["s1", "s3"]}
    behind = {"t": Isr(("s1",), "s1", 2)}  # the replacement is not in sync yet: it waits
    assert plan(["t"], current, live, records=records, isr=behind) == current


def test_a_reported_server_gets_no_new_replica_even_when_it_looks_lightest() -> None:
    current = {"a": ["s1", "s3"], "b": ["s3", "s1"], "c": ["s1", "s3"], "d": ["s1", "s2"]}
    placed = plan(sorted(current), current, ["s1", "s2", "s3"],
                  records=reported("s1", "d", "s2"))
    assert all("s2" not in placed[t] for t in ("a", "b", "c"))  # no voluntary move onto it
    assert placed["d"] == ["s1", "s2", "s3"]  # d's backup on s2 is replaced


def test_a_stopping_server_keeps_its_replicas_and_is_never_the_one_to_leave() -> None:
    isr = {"t": Isr(("s1", "s2", "s3"), "s2", 3)}  # s1 handed t over to s2
    records = {"s1": NodeRecord("s1", state=ServerState.STOPPING, primaries=("u",)),
               "s2": NodeRecord("s2", primaries=("t",)), "s3": NodeRecord("s3"),
               "s4": NodeRecord("s4")}
    placed = plan(["t", "u"], {"t": ["s1", "s2", "s3"], "u": ["s1", "s3"]},
                  ["s1", "s2", "s3", "s4"], records=records, isr=isr)
    assert "s1" in placed["t"] and "s1" in placed["u"]  # kept until it has left the group
    assert placed["t"] == ["s1", "s2", "s3"]  # nothing leaves: s1 leaves by itself
    assert all(s != "s1" for t in placed for s in placed[t][2:])  # no new replica on it
    gone = plan(["t", "u"], placed, ["s2", "s3", "s4"], isr=isr)  # it left: repaired
    assert all("s1" not in r and len(r) == 2 for r in gone.values())


def test_stranded_topic_stays_on_its_dead_in_sync_replicas() -> None:
    """Both replicas of ``a`` died: no other server holds its acknowledged records, so the
    placement keeps them (they serve it again when they return) instead of moving it."""
    current = {"a": ["s1", "s2"], "b": ["s1", "s3"]}
    isr = {"a": Isr(("s1", "s2"), "s1", 4), "b": Isr(("s3",), "s3", 5)}
    placed = plan(["a", "b"], current, ["s3", "s4"], isr=isr, primaryless=frozenset({"a"}))
    assert placed["a"] == ["s1", "s2"]
    assert placed["b"] == ["s3", "s4"]  # b lost s1 only: repaired
    # once a has a primary again (s1 came back), its other dead replica is replaced
    back = plan(["a", "b"], placed, ["s1", "s3", "s4"], isr=isr)
    assert back["a"][0] == "s1" and len(back["a"]) == 2 and "s2" not in back["a"]
