"""The queue's public counts (framework/primitives/queue/counts.py): what a caller above the
queue reads instead of its layout - items queued, claimed, buckets - and a watch that fires
at the next change."""

from __future__ import annotations

import trio

from framework import Session
from framework.primitives.queue import QueueCounts, WorkQueue, queue_counts, watch_queue_counts


async def test_counts_of_items_claims_and_buckets(session: Session) -> None:
    queue = WorkQueue(session, "/q", bucket_size=2)
    assert await queue.counts() == QueueCounts(0, 0, 0)  # no queue yet: empty
    for n in range(3):
        await queue.put(f"{n}".encode())
    assert await queue.counts() == QueueCounts(3, 0, 2)
    async with queue.take() as item:
        assert item.data == b"0"
        counts = await queue.counts()
        assert (counts.queued, counts.claimed, counts.waiting) == (3, 1, 2)
        assert await queue.size() == 3
    assert await queue_counts(session, "/q", claims=False) == QueueCounts(2, None, 2)


async def test_a_watched_count_is_told_of_the_next_put(session: Session) -> None:
    queue = WorkQueue(session, "/q")
    await queue.put(b"a")
    changed = trio.Event()
    assert (await queue.counts(changed=changed)).queued == 1
    assert not changed.is_set()
    await queue.put(b"b")
    with trio.fail_after(10):  # a hang guard only
        await changed.wait()
    assert (await queue.counts()).queued == 2


async def test_watched_counts_follow_puts_claims_acks_and_new_buckets(session: Session) -> None:
    """The dashboard's view: counts now, then again after each change - from a queue that
    does not exist yet, through a new bucket, a claim and an ack."""
    queue = WorkQueue(session, "/q", bucket_size=2)
    seen: list[QueueCounts] = []
    step = trio.Event()

    async def follow() -> None:
        nonlocal step
        async for counts in watch_queue_counts(session, "/q"):
            seen.append(counts)
            step.set()

    async def until(expected: QueueCounts) -> None:
        nonlocal step
        with trio.fail_after(10):  # a hang guard only
            while not seen or seen[-1] != expected:
                await step.wait()
                step = trio.Event()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(follow)
        await until(QueueCounts(0, 0, 0))
        await queue.put_many([b"0", b"1", b"2"])
        await until(QueueCounts(3, 0, 2))
        async with queue.take() as item:
            assert item.data == b"0"
            await until(QueueCounts(3, 1, 2))
        await until(QueueCounts(2, 0, 2))
        nursery.cancel_scope.cancel()
