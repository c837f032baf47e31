"""Claim leases (issue #16.4): a claim whose owner is alive but stuck is not held forever."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import trio

from framework import Session
from framework.errors import ClaimLost, ConfigurationError
from framework.primitives.queue import WorkQueue, consumer
from framework.primitives.queue.lease import Renewals, claim_token, lease_of
from framework.runtime import App, Master, MasterContext, Task, Worker
from framework.runtime.operations import gather_status
from tests.test_runtime import nursery_session

LEASE = 1.0


async def stuck_owner_then_idle_consumer(
    zk_hosts: str, chroot: str, *, same_object: bool = False
) -> dict[str, Any]:
    """A takes the one item with a lease, stops renewing after 0.2 s and blocks in a thread
    (cancellation cannot reach it) while its session stays alive; B, idle, breaks the lease
    once it saw the claim unrenewed for a whole lease, takes the item and acks it; then A's
    thread returns.  What each saw, and whether the queue is empty at the end.
    ``same_object``: B is another take of A's own queue object."""
    unblock = threading.Event()
    guard = threading.Timer(30, unblock.set)  # a failing run must not leave the thread
    guard.start()
    outcome: dict[str, Any] = {}
    try:
        async with (
            Session(zk_hosts, chroot=chroot) as a,
            Session(zk_hosts, chroot=chroot) as b,
        ):
            queue_a = WorkQueue(a, "/q", lease=LEASE)
            queue_b = queue_a if same_object else WorkQueue(b, "/q", lease=LEASE)
            await queue_a.put(b"job")
            a_took = trio.Event()

            async def stuck_owner() -> None:
                try:
                    async with queue_a.take(renew_for=0.2) as item:
                        outcome["a"] = item.attempts
                        a_took.set()
                        await trio.to_thread.run_sync(unblock.wait)  # not cancellable
                        outcome["a_block_ended"] = True
                except ClaimLost as exc:
                    outcome["a_error"] = str(exc)

            with trio.fail_after(30):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(stuck_owner)
                    await a_took.wait()
                    async with queue_b.take() as item:
                        outcome["b"] = (item.data, item.attempts)
                    unblock.set()
            outcome["a_session_lived"] = a.session_id is not None
            outcome["empty"] = await WorkQueue(b, "/q").size() == 0
    finally:
        guard.cancel()
        unblock.set()
    return outcome


async def test_a_stuck_owner_loses_its_claim_and_its_late_ack_is_refused(
    zk_hosts: str, chroot: str
) -> None:
    """When A's thread returns, its block ends with ClaimLost (its claim watch saw the lease
    broken): its ack is never sent."""
    outcome = await stuck_owner_then_idle_consumer(zk_hosts, chroot)
    assert outcome["a_session_lived"] and outcome["empty"]
    assert outcome["a"] == 1 and outcome["b"] == (b"job", 2)
    assert "lease" in outcome["a_error"] or "node deleted" in outcome["a_error"]


async def test_a_late_ack_after_the_lease_was_broken_is_refused_by_the_server(
    zk_hosts: str, chroot: str, monkeypatch: pytest.MonkeyPatch,
    captured_logs: list[dict[str, Any]],
) -> None:
    """The server, not the owner's watch, is what refuses a late ack: A's claim watch is
    held back (as if its notification were still in flight), so A's block ends normally
    after B broke the lease and acknowledged the item; A's ack transaction then reaches the
    server, is refused there, and A's block ends with ClaimLost.  The item was
    acknowledged once (by B): nothing is left and nothing was delivered a third time."""
    monkeypatch.setattr(consumer, "_CLAIM_WATCH_AFTER", 3600.0)
    outcome = await stuck_owner_then_idle_consumer(zk_hosts, chroot)
    refused = [e for e in captured_logs
               if e["event"] == "queue.claim_lost" and e.get("during") == "ack"]
    assert outcome["empty"] and outcome["a_block_ended"] and outcome["b"] == (b"job", 2)
    assert "before the item was acknowledged" in outcome["a_error"]
    assert len(refused) == 1 and refused[0]["why"] == "ended", captured_logs


async def test_a_renewed_claim_is_never_broken(zk_hosts: str, chroot: str) -> None:
    """A holds its item for several leases while renewing; B waits idle beside it all that
    time and never gets the item; A's ack succeeds."""
    async with (
        Session(zk_hosts, chroot=chroot) as a,
        Session(zk_hosts, chroot=chroot) as b,
    ):
        queue_a = WorkQueue(a, "/q", lease=0.5)
        await queue_a.put(b"job")
        got: list[bytes] = []

        async def idle_consumer() -> None:
            async with WorkQueue(b, "/q", lease=0.5).take() as item:
                got.append(item.data)

        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                async with queue_a.take() as item:
                    nursery.start_soon(idle_consumer)
                    await trio.sleep(2.5)  # the work itself: five leases long
                assert await queue_a.size() == 0
                nursery.cancel_scope.cancel()
    assert got == [] and item.data == b"job"


async def test_an_idle_take_never_reads_a_claim_its_own_object_renews(
    zk_hosts: str, chroot: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Take 1 holds the only item and renews it; take 2 of the same object waits idle for
    several leases: its lease checks never read take 1's claim (it cannot run out), and
    nothing is broken."""
    async with Session(zk_hosts, chroot=chroot) as a:
        queue = WorkQueue(a, "/q", lease=0.5)
        await queue.put(b"job")
        claim_reads: list[str] = []
        real_get = Session.get

        async def counting_get(self: Session, path: str, **kwargs: Any) -> Any:
            if path.startswith("/q/claims/"):
                claim_reads.append(path)
            return await real_get(self, path, **kwargs)

        monkeypatch.setattr(Session, "get", counting_get)
        second_waiting = trio.Event()

        async def second_take() -> None:
            second_waiting.set()
            async with queue.take():
                raise AssertionError("the only item is held by take 1")

        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                async with queue.take() as item:
                    nursery.start_soon(second_take)
                    await second_waiting.wait()
                    await trio.sleep(1.5)  # the work itself: three leases long
                nursery.cancel_scope.cancel()
        assert item.data == b"job" and await queue.size() == 0
    assert claim_reads == []


async def test_an_idle_take_breaks_its_own_objects_lapsed_lease(
    zk_hosts: str, chroot: str
) -> None:
    """One queue object: take 1 stops renewing after 0.2 s and blocks in a thread; take 2
    of the same object, idle, breaks that lease a whole lease later and gets the item
    again (no other consumer is needed to free a stuck slot)."""
    outcome = await stuck_owner_then_idle_consumer(zk_hosts, chroot, same_object=True)
    assert outcome["empty"] and outcome["a"] == 1 and outcome["b"] == (b"job", 2)
    assert "a_error" in outcome


def test_claim_token_round_trip_and_bad_leases() -> None:
    assert lease_of(claim_token("h:1", "abc", 2.5)) == 2.5
    assert lease_of(claim_token("h:1", "abc", None)) is None
    assert lease_of(b'{"owner":"h:1","nonce":"abc","lease":"nonsense"}') is None
    assert lease_of(b'{"owner":"h:1","nonce":"abc","lease":-1}') is None
    assert lease_of(b"h:1:abc") is None


@pytest.mark.parametrize("lease", [0, -1, float("inf"), "5", True])
async def test_bad_lease_is_a_configuration_error(session: Session, lease: Any) -> None:
    with pytest.raises(ConfigurationError, match="lease"):
        WorkQueue(session, "/q", lease=lease)


class Blocking(Worker):
    """A handler stuck in a thread beyond its time limit (time_limit cannot stop it)."""

    concurrency = 1
    lease = LEASE
    backoff_base = 0.01
    backoff_max = 0.01

    def __init__(self, *args: Any, block: threading.Event | None = None, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.block = block
        self.entered = trio.Event()

    async def handle(self, task: Task) -> Any:
        self.entered.set()
        if self.block is not None:
            await trio.to_thread.run_sync(self.block.wait)
        return self.name


async def test_a_worker_stuck_past_its_time_limit_hands_the_task_over(
    zk_hosts: str, chroot: str
) -> None:
    """Worker w1's handler blocks in a thread past the task's time limit; its claim stops
    being renewed, w2 takes the task over and finishes it; the job ends."""
    app = App("stuck")
    block = threading.Event()

    class Once(Master):
        async def lead(self, ctx: MasterContext) -> None:
            await ctx.submit("handle", {}, key="t0", time_limit=0.3)
            await ctx.wait_idle()
            self.result = await ctx.result("t0")

    stuck = Blocking(app, name="w1", block=block)
    master = Once(app)
    # a failing run must not leave the stuck thread behind: fail_after cannot cancel it
    guard = threading.Timer(45, block.set)
    guard.start()
    try:
        await _run_stuck(zk_hosts, chroot, app, master, stuck, block)
    finally:
        guard.cancel()
        block.set()
    assert master.result.ok and master.result.result == "w2"


async def _run_stuck(zk_hosts: str, chroot: str, app: App, master: Master,
                     stuck: Blocking, block: threading.Event) -> None:
    with trio.fail_after(40):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(stuck.run, await nursery_session(nursery, zk_hosts, chroot))
            async with Session(zk_hosts, chroot=chroot) as s:
                async with trio.open_nursery() as inner:
                    inner.start_soon(master.run, s)
                    # once w1 is stuck in its handler, a healthy worker joins
                    await stuck.entered.wait()
                    healthy = Blocking(app, name="w2")
                    nursery.start_soon(healthy.run, await nursery_session(nursery, zk_hosts,
                                                                          chroot))
                status = await gather_status(s, app)
            block.set()
            stuck.request_stop()
            healthy.request_stop()
            nursery.cancel_scope.cancel()
    assert status.dead_letters == 0


async def test_a_lapsed_or_superseded_renewal_is_not_counted_as_renewing() -> None:
    """The breaker skips only claims a take of ours still renews: not one whose renewal
    lapsed (a later renew_for cannot restart it), and a delivery that ends forgets only its
    own renewal, not a later delivery's of the same item."""
    renewals = Renewals()
    lapsed = renewals.start("b-0000000000/i+0-a-0000000001")
    lapsed.stopped = True
    live = renewals.start("b-0000000000/i+0-b-0000000002")
    assert set(renewals.renewing()) == {"b-0000000000.i+0-b-0000000002"}
    later = renewals.start("b-0000000000/i+0-b-0000000002")  # redelivered to us
    renewals.forget("b-0000000000/i+0-b-0000000002", live)
    assert renewals.held("b-0000000000/i+0-b-0000000002") is later
