"""Priority across buckets: each priority value has its lane of buckets, so an urgent item
put behind thousands of older items is taken in the next claim round (real server)."""

from __future__ import annotations

import trio

from framework import Session
from framework.primitives.queue import WorkQueue
from framework.primitives.queue.view import (
    bucket_index,
    bucket_lane,
    bucket_name,
    bucket_order,
    is_bucket,
)


def test_bucket_names_carry_their_lane() -> None:
    assert bucket_name(3) == "b-0000000003"  # lane 0: the names of every older queue
    assert bucket_name(3, -5) == "b-5-0000000003" and bucket_name(1, 7) == "b+7-0000000001"
    for name, lane in [("b-0000000003", 0), ("b-5-0000000003", -5), ("b+7-0000000001", 7)]:
        assert is_bucket(name) and bucket_lane(name) == lane
    assert bucket_index("b-5-0000000003") == 3
    assert not any(map(is_bucket, ["b-", "b5-0000000001", "b--0000000001", "x-0000000001",
                                   "b-000000000a"]))
    names = ["b-0000000002", "b+1-0000000000", "b-3-0000000001", "b-0000000001"]
    assert sorted(names, key=bucket_order) == ["b-3-0000000001", "b-0000000001",
                                               "b-0000000002", "b+1-0000000000"]


async def test_an_urgent_item_behind_three_full_buckets_is_taken_next(
        session: Session) -> None:
    queue = WorkQueue(session, "/lanes", bucket_size=10)
    await queue.put_many([f"old{n}".encode() for n in range(30)])  # three buckets, and more
    assert len([b for b in await session.children("/lanes/items") if is_bucket(b)]) >= 3
    await queue.put(b"urgent", priority=-5)
    await queue.put(b"later", priority=3)
    taken = []
    with trio.fail_after(30):
        for _ in range(3):
            async with queue.take() as item:
                taken.append(item.data)
    assert taken == [b"urgent", b"old0", b"old1"]  # then lane 0 in order
    with trio.fail_after(30):
        while taken[-1] != b"later":
            async with queue.take() as item:
                taken.append(item.data)
    assert taken[3:-1] == [f"old{n}".encode() for n in range(2, 30)]  # 'later' comes last


async def test_a_lane_keeps_its_own_buckets_and_drops_empty_old_ones(session: Session) -> None:
    queue = WorkQueue(session, "/lanes2", bucket_size=4)
    await queue.put_many([b"u"] * 9, priority=-1)  # three buckets of lane -1
    await queue.put(b"n")
    buckets = sorted(b for b in await session.children("/lanes2/items") if is_bucket(b))
    assert {bucket_lane(b) for b in buckets} == {-1, 0}
    assert len([b for b in buckets if bucket_lane(b) == -1]) >= 3
    with trio.fail_after(30):
        for _ in range(10):
            async with queue.take():
                pass
        assert await queue.size() == 0
        await queue.put(b"again", priority=-1)  # a new put after the drain
        async with queue.take() as item:
            assert item.data == b"again"
    left = [b for b in await session.children("/lanes2/items") if is_bucket(b)]
    assert len([b for b in left if bucket_lane(b) == -1]) <= 2  # old empty ones dropped
