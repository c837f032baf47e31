"""submit_many's task encoder: the tasks new_task builds, the bytes Task.encode writes."""

from __future__ import annotations

import enum

import pytest

from framework.errors import ConfigurationError
from framework.runtime.submission import TaskEncoder
from framework.runtime.tasks import Task, new_task


class Colour(enum.IntEnum):
    RED = 1


PAYLOADS = [None, 0, -1.5, "plain", 'quote " percent %s %(id)s back \\ slash', "héllo ✓",
            {"n": 1}, {"nested": {"list": [1, None, True, "x"]}}, [1, (2, 3)], {1: "int key"},
            Colour.RED, [], {}]


@pytest.mark.parametrize("keyed", [False, True])
def test_items_are_the_bytes_task_encode_writes(keyed: bool) -> None:
    encoder = TaskEncoder("handle")
    keys = [f"k-{n}" for n in range(len(PAYLOADS))] if keyed else None
    built = encoder.build(PAYLOADS, keys)
    assert len(built) == len(PAYLOADS)
    for n, (payload, (task, item)) in enumerate(zip(PAYLOADS, built, strict=True)):
        assert item == task.encode()
        assert Task.decode(item).id == task.id
        assert task.name == "handle" and task.payload is payload
        if keyed:
            assert (task.id, task.idempotency_key) == (f"k-{n}", f"k-{n}")
        else:
            assert task.idempotency_key is None and len(task.id) == 32
            int(task.id, 16)
    if not keyed:
        assert len({task.id for task, _item in built}) == len(PAYLOADS)


def test_tasks_are_those_new_task_builds() -> None:
    (task, _item), = TaskEncoder("handle").build([{"n": 1}], ["key-1"])
    assert task == new_task({"n": 1}, name="handle", task_id="key-1", idempotency_key="key-1")


def test_the_same_checks_as_new_task() -> None:
    with pytest.raises(ConfigurationError, match="JSON-serialisable"):
        TaskEncoder("handle").build([{"n": 1}, {"bad": object()}], None)
    with pytest.raises(ConfigurationError):
        TaskEncoder("handle").build([1], ["not a valid/key"])
    with pytest.raises(ConfigurationError):
        TaskEncoder("bad name/")
