"""Named queues (issue #39 item 3), against the real ZooKeeper: a task type names its queue
(``@task(queue=...)``, a submit may override it), a worker serves the queues it is told
(``Worker(queues=...)``, ``framework run -Q``), each slot races one take per served queue
and never holds more claims than its concurrency; everything that puts a task puts it into
its queue, everything that looks for one looks in every queue."""

from __future__ import annotations

import trio

from framework import Session, WorkQueue
from framework.primitives.queue import QueueItem


async def test_a_refused_claim_goes_back_as_never_delivered(session: Session) -> None:
    queue = WorkQueue(session, "/q", lease=5.0)
    await queue.put(b"one")
    seen: list[int] = []

    def refuse_first(item: QueueItem) -> bool:
        seen.append(item.attempts)
        return len(seen) > 1  # the first claim is handed back, the second admitted

    with trio.fail_after(30):
        async with queue.take(admit=refuse_first) as item:
            assert item.data == b"one"
            # the refused claim was not a delivery: this one is the first
            assert item.attempts == 1
    assert seen == [1, 1]
    assert await queue.size() == 0
