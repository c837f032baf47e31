"""The counter, the semaphore and the multi-lock through a ZooKeeper leader kill (3-node
ensemble): no increment lost or doubled, leases and locks held straight through."""

from __future__ import annotations

from contextlib import AsyncExitStack

import pytest
import trio

from framework import Session, ZooKeeperEnsemble
from framework.errors import LeaseTimeout
from framework.primitives import Counter, MultiLock, Semaphore

pytestmark = pytest.mark.ensemble


async def test_a_leader_kill_loses_no_increment_and_ends_no_holding(
    ensemble: ZooKeeperEnsemble, captured_logs: list[dict[str, object]]
) -> None:
    leader = ensemble.leader()
    assert leader is not None
    hosts = ensemble.connect_string
    acknowledged = 0
    per_task = 60
    async with AsyncExitStack() as stack:
        sessions = [await stack.enter_async_context(
            Session(hosts, chroot="/recipes", session_timeout=10.0)) for _ in range(3)]
        ids = [s.session_id for s in sessions]
        halfway = trio.Event()
        finished = trio.Event()

        async def adder(s: Session) -> None:
            nonlocal acknowledged
            counter = Counter(s, "/counter")
            for i in range(per_task):
                await counter.add(1)
                acknowledged += 1
                if acknowledged >= 3 * 2 * per_task // 3:
                    halfway.set()
                if i % 10 == 0:
                    await trio.sleep(0)

        async def hold() -> None:
            async with Semaphore(sessions[0], "/sem", 1).acquire(), \
                    MultiLock(sessions[1], ["/a", "/b"]).acquire():
                await finished.wait()  # the leader kill must not end these holdings

        with trio.fail_after(90):
            async with trio.open_nursery() as holders:
                holders.start_soon(hold)
                async with trio.open_nursery() as adders:
                    for s in sessions:
                        for _ in range(2):
                            adders.start_soon(adder, s)
                    await halfway.wait()
                    await trio.to_thread.run_sync(ensemble.kill, leader)
                with pytest.raises(LeaseTimeout):  # the lease is still held, not handed on
                    async with Semaphore(sessions[2], "/sem", 1).acquire(timeout=0.5):
                        pass
                finished.set()
            assert [s.session_id for s in sessions] == ids  # sessions survived the change
            await sessions[2].sync("/counter")
            assert await Counter(sessions[2], "/counter").get() == acknowledged == 6 * per_task
        await trio.to_thread.run_sync(ensemble.restart, leader)
    settled = [e["applied"] for e in captured_logs if e["event"] == "counter.settled"]
    print(f"updates in flight at the kill, settled by receipt: {settled}")
