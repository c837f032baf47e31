"""Pure parts of the runtime: the assignment plan, names, tasks."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from framework import ConfigurationError
from framework.runtime import App, Task, new_task, plan_assignment

names = st.lists(st.text("abcdefgh", min_size=1, max_size=3), unique=True, max_size=12)


@given(shards=names, workers=names, data=st.data())
def test_plan_is_complete_balanced_and_sticky(shards, workers, data) -> None:
    current = {s: data.draw(st.sampled_from([*workers, "gone"])) for s in shards} if workers else {}
    plan = plan_assignment(shards, workers, current)
    if not workers:
        assert plan == {}
        return
    assert set(plan) == set(shards) and set(plan.values()) <= set(workers)
    loads = [list(plan.values()).count(w) for w in workers]
    assert max(loads) - min(loads) <= 1
    # a shard moves only if its worker is gone or its worker had more than its fair share
    ceiling = -(-len(shards) // len(workers))
    for shard, worker in current.items():
        if worker in workers and list(current.values()).count(worker) <= ceiling - 1:
            assert plan[shard] == worker


def test_plan_moves_only_the_lost_workers_shards() -> None:
    current = {"s1": "a", "s2": "a", "s3": "b", "s4": "b", "s5": "c", "s6": "c"}
    plan = plan_assignment(current, ["a", "b"], current)
    assert {s: plan[s] for s in ("s1", "s2", "s3", "s4")} == {k: current[k] for k in
                                                            ("s1", "s2", "s3", "s4")}
    assert sorted(plan.values()) == ["a", "a", "a", "b", "b", "b"]


@pytest.mark.parametrize("bad", ["", "has space", "a/b", "../x", "x" * 101])
def test_bad_names_give_clear_errors(bad: str) -> None:
    with pytest.raises(ConfigurationError, match="invalid"):
        App(bad)


def test_task_round_trip_and_validation() -> None:
    task = new_task({"url": "http://x"}, task_id="t1", idempotency_key="k1", time_limit=2)
    again = Task.decode(task.encode(), attempts=3)
    assert again == Task("t1", {"url": "http://x"}, "k1", 2, 3) and again.key == "k1"
    with pytest.raises(ConfigurationError, match="JSON"):
        new_task({"bad": object()})
    with pytest.raises(ConfigurationError, match="time_limit"):
        new_task(1, time_limit=0)
