"""The queue's public counts (framework/primitives/queue/counts.py): what a caller above the
queue reads instead of its layout - items queued, claimed, buckets - and a watch that fires
at the next change."""

from __future__ import annotations

import trio

from framework import Session
from framework.primitives.queue import QueueCounts, WorkQueue, queue_counts


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
