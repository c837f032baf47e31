"""WorkQueue.put(also=...): the caller's operations ride in the multi that creates the item
(the delayed-task mover and the periodic scheduler rely on it), against a real server."""

from __future__ import annotations

import pytest
import trio

from framework import Session
from framework.errors import ConfigurationError, LeadershipLost, TransactionFailedError
from framework.primitives.queue import WorkQueue
from framework.primitives.queue import producer as queue_producer


async def test_item_and_the_callers_operations_are_applied_together(session: Session) -> None:
    await session.create("/moving", b"x")
    queue = WorkQueue(session, "/q")
    name = await queue.put(b"task", also=lambda txn: txn.delete("/moving"))
    assert await session.exists("/moving") is None
    assert await queue.item_data(name) == b"task"


async def test_a_refused_operation_applies_nothing_and_is_raised(session: Session) -> None:
    queue = WorkQueue(session, "/q")
    with trio.fail_after(30), pytest.raises(TransactionFailedError) as refused:
        await queue.put(b"task", also=lambda txn: txn.create("/made").delete("/absent"))
    assert refused.value.failed_index == 1  # counted from the first of the caller's
    assert await queue.size() == 0 and await session.exists("/made") is None


async def test_the_fence_still_holds_after_the_callers_operations(session: Session) -> None:
    await session.create("/term", b"")
    queue = WorkQueue(session, "/q", fence=("/term", 0))
    await session.set("/term", b"new leader")
    with pytest.raises(LeadershipLost):
        await queue.put(b"task", also=lambda txn: txn.create("/made"))
    assert await session.exists("/made") is None and await queue.size() == 0


async def test_a_lost_reply_is_recovered_once(session: Session,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The multi is applied but its reply lost: the item is found by its GUID token and
    neither it nor the caller's operations are applied twice."""
    await session.create("/moving", b"x")
    queue = WorkQueue(session, "/q", fence=None)
    original = queue_producer.Producer._send
    lost = []

    async def send_and_lose(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        outcome = await original(self, *args, **kwargs)
        if not lost:
            lost.append(outcome)
            from framework.errors import ConnectionLossError
            return ConnectionLossError("reply lost (test)")
        return outcome

    monkeypatch.setattr(queue_producer.Producer, "_send", send_and_lose)
    name = await queue.put(b"task", also=lambda txn: txn.delete("/moving"))
    assert lost and await queue.size() == 1 and await queue.item_data(name) == b"task"
    assert await session.exists("/moving") is None


async def test_also_takes_one_item(session: Session) -> None:
    with pytest.raises(ConfigurationError, match="exactly one item"):
        await WorkQueue(session, "/q").put_many([b"a", b"b"], also=lambda txn: None)
