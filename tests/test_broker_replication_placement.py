"""The controller's placement rules for out-of-sync backups and stopping servers (issue #25):
pure function, no ZooKeeper."""

from __future__ import annotations

from examples.message_broker.controller import plan_placement
from examples.message_broker.layout import Isr


def test_a_dropped_backup_gets_a_replacement_on_a_healthy_server() -> None:
    plan = plan_placement(["t"], {"t": ["s1", "s2"]}, ["s1", "s2", "s3"], voluntary=False,
                          out_of_sync={"t": {"s2"}})
    assert plan == {"t": ["s1", "s2", "s3"]}  # make before break, even without voluntary


def test_the_replacement_in_sync_sends_the_out_of_sync_backup_away() -> None:
    isr = {"t": Isr(("s1", "s2", "s3"), "s1", 2)}
    plan = plan_placement(["t"], {"t": ["s1", "s2", "s3"]}, ["s1", "s2", "s3"],
                          voluntary=True, isr=isr, out_of_sync={"t": {"s2"}})
    assert plan == {"t": ["s1", "s3"]}


def test_a_reported_server_gets_no_new_replica_even_when_it_looks_lightest() -> None:
    current = {"a": ["s1", "s3"], "b": ["s3", "s1"], "c": ["s1", "s3"], "d": ["s1", "s2"]}
    plan = plan_placement(sorted(current), {k: list(v) for k, v in current.items()},
                          ["s1", "s2", "s3"], voluntary=True, out_of_sync={"d": {"s2"}})
    assert all("s2" not in plan[t] for t in ("a", "b", "c"))  # no voluntary move onto it
    assert plan["d"] == ["s1", "s2", "s3"]  # d's backup on s2 is replaced


def test_a_stopping_server_keeps_its_replicas_and_is_never_the_one_to_leave() -> None:
    isr = {"t": Isr(("s1", "s2", "s3"), "s2", 3)}  # s1 handed t over to s2
    plan = plan_placement(["t", "u"], {"t": ["s1", "s2", "s3"], "u": ["s1", "s3"]},
                          ["s2", "s3", "s4"], voluntary=True, isr=isr,
                          draining=frozenset({"s1"}))
    assert "s1" in plan["t"] and "s1" in plan["u"]  # kept until it has left nodes/
    assert plan["t"] == ["s1", "s2", "s3"]  # the move waits: s1 leaves by itself
    assert all(s != "s1" for t in plan for s in plan[t][2:])  # no new replica on it
