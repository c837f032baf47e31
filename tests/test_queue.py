"""WorkQueue against a real server: order, priorities, buckets, retries, dead letters,
fairness, a consumer killed with kill -9, and a property test with random consumer crashes."""

from __future__ import annotations

import sys
import uuid
from collections import Counter
from pathlib import Path

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from framework import Session
from framework.errors import ClaimLost, ConfigurationError, DataTooLargeError, NoNodeError
from framework.primitives.queue import QueueItem, WorkQueue
from framework.testing import TcpProxy, expire_session

HELPERS = Path(__file__).parent / "helpers"
ROOT = Path(__file__).parent.parent


class Boom(Exception):
    pass


async def _wait_children(s: Session, path: str, count: int) -> list[str]:
    while True:
        fired = trio.Event()
        try:
            kids = await s.children(path, watch=s.waker(fired))
            if len(kids) >= count:
                return kids
        except NoNodeError:
            if await s.exists(path, watch=s.waker(fired)) is not None:
                continue
        await fired.wait()


async def _take_data(q: WorkQueue) -> QueueItem:
    async with q.take() as item:
        return item


async def test_priority_then_fifo(session: Session) -> None:
    q = WorkQueue(session, "/q")
    await q.put(b"low-1", priority=5)
    await q.put(b"high-1", priority=-1)
    await q.put(b"mid-1")
    await q.put(b"high-2", priority=-1)
    await q.put(b"mid-2")
    with trio.fail_after(10):
        got = [(await _take_data(q)).data for _ in range(5)]
    assert got == [b"high-1", b"high-2", b"mid-1", b"mid-2", b"low-1"]
    assert await q.size() == 0


async def test_put_many_keeps_order_and_names(session: Session) -> None:
    q = WorkQueue(session, "/q")
    names = await q.put_many([f"{i}".encode() for i in range(50)], priority=2)
    assert len(set(names)) == 50 and await q.size() == 50
    with trio.fail_after(10):
        items = [await _take_data(q) for _ in range(50)]
    assert [i.data for i in items] == [f"{i}".encode() for i in range(50)]
    assert [i.name for i in items] == names
    assert all(i.priority == 2 and i.attempts == 1 for i in items)


async def test_buckets_never_exceed_their_size(session: Session) -> None:
    q = WorkQueue(session, "/q", bucket_size=5)
    await q.put_many([b"a%d" % i for i in range(12)])
    for i in range(9):
        await q.put(b"b%d" % i)
    await q.put_many([b"c%d" % i for i in range(7)])
    buckets = sorted(await session.children("/q/items"))
    assert len(buckets) >= 6
    for bucket in buckets:
        assert len(await session.children(f"/q/items/{bucket}")) <= 5
    with trio.fail_after(10):
        got = [(await _take_data(q)).data for _ in range(28)]
    assert got == [b"a%d" % i for i in range(12)] + [b"b%d" % i for i in range(9)] + [
        b"c%d" % i for i in range(7)
    ]
    # emptied old buckets are removed; at most the newest remains
    assert len(await session.children("/q/items")) <= 1


async def test_oversized_items_are_rejected_clearly(session: Session) -> None:
    q = WorkQueue(session, "/q", max_item_bytes=1000)
    with pytest.raises(DataTooLargeError, match="at most 1,000"):
        await q.put(b"x" * 1001)
    with pytest.raises(DataTooLargeError, match="must be bytes"):
        await q.put("text")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError):
        WorkQueue(session, "/q", max_item_bytes=10**9)
    assert await q.size() == 0


async def test_waiting_consumer_wakes_on_put(zk_hosts: str, chroot: str,
                                             session: Session) -> None:
    async with Session(zk_hosts, chroot=chroot) as producer:
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                got: list[bytes] = []

                async def consume() -> None:
                    got.append((await _take_data(WorkQueue(session, "/q"))).data)

                nursery.start_soon(consume)
                await WorkQueue(producer, "/q").put(b"hello")
        assert got == [b"hello"]


async def test_failed_item_is_released_and_redelivered(session: Session) -> None:
    q = WorkQueue(session, "/q")
    await q.put(b"job")
    with trio.fail_after(10):
        with pytest.raises(Boom):
            async with q.take() as item:
                assert item.attempts == 1
                raise Boom
        async with q.take() as item:
            assert item.data == b"job" and item.attempts == 2
    assert await q.size() == 0
    assert await session.children("/q/claims") == []


async def test_dead_letter_after_max_attempts(session: Session) -> None:
    q = WorkQueue(session, "/q", max_attempts=3, dead_letter="/dead")
    await q.put(b"poison", priority=1)
    await q.put(b"fine", priority=2)
    with trio.fail_after(10):
        for attempt in (1, 2, 3):
            with pytest.raises(Boom):
                async with q.take() as item:
                    assert (item.data, item.attempts) == (b"poison", attempt)
                    raise Boom
        assert (await _take_data(q)).data == b"fine"
    assert await q.size() == 0
    [dead] = await q.dead_letters()
    assert (dead.data, dead.priority, dead.attempts) == (b"poison", 1, 3)


async def test_consumers_share_the_work_fairly(zk_hosts: str, chroot: str) -> None:
    """Four consumers each block until all four hold an item: only possible if every one of
    them got one of the four items (no consumer can hog the queue)."""
    holding = 0
    all_hold = trio.Event()
    seen: dict[str, bytes] = {}

    async def consumer(name: str) -> None:
        nonlocal holding
        async with Session(zk_hosts, chroot=chroot) as s:
            async with WorkQueue(s, "/q").take() as item:
                seen[name] = item.data
                holding += 1
                if holding == 4:
                    all_hold.set()
                await all_hold.wait()

    async with Session(zk_hosts, chroot=chroot) as s:
        with trio.fail_after(15):
            async with trio.open_nursery() as nursery:
                for i in range(4):
                    nursery.start_soon(consumer, f"c{i}")
                await WorkQueue(s, "/q").put_many([b"1", b"2", b"3", b"4"])
        assert sorted(seen.values()) == [b"1", b"2", b"3", b"4"]
        assert await WorkQueue(s, "/q").size() == 0


async def test_consumer_killed_mid_item(zk_hosts: str, chroot: str, session: Session) -> None:
    """kill -9 of a consumer holding an item: the item comes back (once its session expires),
    nothing is lost, and every item is acknowledged exactly once."""
    q = WorkQueue(session, "/q")
    names = await q.put_many([b"a", b"b", b"c"])
    proc = await trio.lowlevel.open_process(
        [sys.executable, str(HELPERS / "p2_queue_consumer.py"), zk_hosts, chroot, "/q"],
        cwd=str(ROOT),
    )
    try:
        with trio.fail_after(20):
            [claim] = await _wait_children(session, "/q/claims", 1)
            proc.kill()
            await proc.wait()
            acked: list[QueueItem] = []
            while len(acked) < 3:
                async with q.take() as item:
                    pass
                acked.append(item)
    finally:
        proc.kill()
    assert sorted(i.name for i in acked) == sorted(names)
    held = next(i for i in acked if i.name.replace("/", ".") == claim)
    assert held.attempts == 2 and all(i.attempts == 1 for i in acked if i is not held)
    assert await q.size() == 0 and await session.children("/q/claims") == []


async def test_crashed_deliveries_count_towards_max_attempts(
    zk_hosts: str, chroot: str, session: Session
) -> None:
    q = WorkQueue(session, "/q", max_attempts=1)
    await q.put(b"kills-consumers")
    await q.put(b"ok")
    proc = await trio.lowlevel.open_process(
        [sys.executable, str(HELPERS / "p2_queue_consumer.py"), zk_hosts, chroot, "/q"],
        cwd=str(ROOT),
    )
    try:
        with trio.fail_after(20):
            await _wait_children(session, "/q/claims", 1)
            proc.kill()
            await proc.wait()
            assert (await _take_data(q)).data == b"ok"
            async with trio.open_nursery() as nursery:
                # a waiting consumer meets the item again once the dead claim vanishes, and
                # dead-letters it instead of delivering it a second time
                nursery.start_soon(_take_data, q)
                await _wait_children(session, "/q/dead", 1)
                nursery.cancel_scope.cancel()
    finally:
        proc.kill()
    [dead] = await q.dead_letters()
    assert dead.data == b"kills-consumers" and dead.attempts == 1
    assert await q.size() == 0


async def test_suspension_cancels_the_item_and_it_comes_back(
    zk_hosts: str, chroot: str, session: Session, proxy: TcpProxy
) -> None:
    """A consumer whose connection drops cannot prove its claim: its block is cancelled,
    ClaimLost is raised, the claim is released once it reconnects, and the item is
    delivered again."""
    q = WorkQueue(session, "/q")
    await q.put(b"job")
    async with Session(proxy.address, chroot=chroot, session_timeout=4.0) as flaky:
        with trio.fail_after(20):
            with pytest.raises(ClaimLost) as info:
                async with WorkQueue(flaky, "/q").take() as item:
                    assert item.attempts == 1
                    proxy.freeze()
                    proxy.cut()
                    try:
                        await trio.sleep_forever()
                    finally:
                        proxy.unfreeze()
            assert info.value.reason == "suspended"
            async with q.take() as again:
                assert (again.data, again.attempts) == (b"job", 2)
    assert await q.size() == 0


@settings(max_examples=10, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(
    producers=st.integers(1, 3),
    consumers=st.integers(1, 3),
    per_producer=st.integers(1, 10),
    batched=st.booleans(),
    crashes=st.sets(st.integers(0, 25), max_size=3),
)
async def test_every_item_delivered_and_acked_exactly_once_despite_crashes(
    zk_hosts: str, producers: int, consumers: int, per_producer: int, batched: bool,
    crashes: set[int],
) -> None:
    """N producers, M consumers; the consumers holding the k-th deliveries (k in ``crashes``)
    crash mid-item: their session is expired on the server and their task cancelled, and a
    fresh consumer replaces them.  Every item is delivered at least once and acknowledged
    exactly once; the queue ends empty."""
    chroot = f"/tests/queue-property-{uuid.uuid4().hex[:8]}"
    expected = {f"{p}-{i}".encode() for p in range(producers) for i in range(per_producer)}
    delivered: list[bytes] = []
    acked: list[bytes] = []
    done = trio.Event()

    async def producer(p: int) -> None:
        async with Session(zk_hosts, chroot=chroot, session_timeout=2.0) as s:
            q = WorkQueue(s, "/q", bucket_size=4)
            payloads = [f"{p}-{i}".encode() for i in range(per_producer)]
            if batched:
                await q.put_many(payloads)
            else:
                for data in payloads:
                    await q.put(data)

    async def consumer(nursery: trio.Nursery) -> None:
        async with Session(zk_hosts, chroot=chroot, session_timeout=2.0) as s:
            q = WorkQueue(s, "/q", bucket_size=4)
            with trio.CancelScope() as alive:
                while True:
                    async with q.take() as item:
                        n = len(delivered)
                        delivered.append(item.data)
                        if n in crashes:
                            nursery.start_soon(consumer, nursery)  # a replacement
                            await expire_session(s)  # the server drops the session ...
                            alive.cancel()  # ... and the consumer dies mid-item
                            await trio.sleep_forever()
                    acked.append(item.data)
                    if set(acked) == expected:
                        done.set()

    async with Session(zk_hosts, chroot=chroot) as admin:
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                for _ in range(consumers):
                    nursery.start_soon(consumer, nursery)
                for p in range(producers):
                    nursery.start_soon(producer, p)
                await done.wait()
                nursery.cancel_scope.cancel()
        assert set(delivered) == expected
        assert Counter(acked) == Counter({data: 1 for data in expected})
        assert await WorkQueue(admin, "/q").size() == 0
        await admin.delete_tree("/q")
