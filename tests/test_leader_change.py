"""A ZooKeeper leader change is ridden through: nothing is cancelled (issue #16.5).

Killing the leader of a 3-node ensemble disconnects every client for a moment (the followers
drop their clients until a new leader is elected) but no session expires.  With the default
``suspended_grace`` (until the session's trust deadline) every ownership scope of those
sessions - an election term, a lock holding, a queue claim, the runtime master's ``lead`` -
keeps running through it, busy bodies included.  That the same defaults still cancel an
owner before anyone else can take over is proven by ``test_partition_ownership.py``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest
import trio

from framework import ConnectionLossError, Election, Lock, Session, WorkQueue, ZooKeeperEnsemble
from framework.runtime import Master, MasterContext

Body = Callable[[], Awaitable[None]]
TIMEOUT = 10.0  # the default session timeout: trust deadline 6.7 s after the last reply


async def own_leadership(s: Session, body: Body, grace: float | None) -> None:
    async with Election(s, "/election", suspended_grace=grace).leadership():
        await body()


async def own_lock(s: Session, body: Body, grace: float | None) -> None:
    async with Lock(s, "/lock").acquire():
        await body()


async def own_claim(s: Session, body: Body, grace: float | None) -> None:
    async with WorkQueue(s, "/queue").take():
        await body()


async def own_master(s: Session, body: Body, grace: float | None) -> None:
    class Leader(Master):
        suspended_grace = grace

        async def lead(self, ctx: MasterContext) -> None:
            await body()

    await Leader("ride", name="m").run(s)


OWNERS = {"election": own_leadership, "lock": own_lock, "claim": own_claim,
          "master": own_master}


async def _ride_through(ensemble: ZooKeeperEnsemble, grace: float | None) -> dict[str, str]:
    """Each owner in its own session, its body busy reading; kill the ZooKeeper leader;
    once every owner's session has written again after the change, report how each body
    ended ("ran through" or "cancelled")."""
    hosts = ensemble.connect_string
    outcome: dict[str, str] = {}
    started = {kind: trio.Event() for kind in OWNERS}
    back = {kind: trio.Event() for kind in OWNERS}
    killed, stop = trio.Event(), trio.Event()
    async with Session(hosts, chroot="/ride") as setup:
        await WorkQueue(setup, "/queue").put(b"the one item")

    async def owner(kind: str) -> None:
        async with Session(hosts, chroot="/ride", session_timeout=TIMEOUT,
                           suspended_grace=grace) as s:
            original = s.session_id

            async def write_again() -> None:
                await killed.wait()
                # waits out the disconnection; the session survives, so does its id
                while True:
                    try:
                        await s.create("/after-", sequence=True, makepath=True)
                        break
                    except ConnectionLossError:
                        continue  # in flight when the connection dropped: write again
                assert s.session_id == original, f"{kind}: the session expired"
                back[kind].set()

            async def body() -> None:
                started[kind].set()
                try:
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(_busy, s)
                        await stop.wait()
                        nursery.cancel_scope.cancel()
                    outcome.setdefault(kind, "ran through")  # not a later term's body
                finally:
                    outcome.setdefault(kind, "cancelled")

            async with trio.open_nursery() as nursery:
                nursery.start_soon(write_again)
                try:
                    await OWNERS[kind](s, body, grace)
                except Exception as exc:  # LeadershipLost, LockLost, ClaimLost...
                    outcome.setdefault(kind, f"cancelled ({type(exc).__name__})")
                    await stop.wait()  # the master would campaign again: keep it out

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            for kind in OWNERS:
                nursery.start_soon(owner, kind)
            for event in started.values():
                await event.wait()
            leader = ensemble.leader()
            assert leader is not None
            await trio.to_thread.run_sync(ensemble.kill, leader)
            killed.set()
            for event in back.values():
                await event.wait()
            stop.set()
    return outcome


async def _busy(s: Session) -> None:
    """A body that keeps asking ZooKeeper (each read waits out the disconnection)."""
    while True:
        try:
            await s.exists("/queue")
        except Exception:
            pass
        await trio.sleep(0.05)


@pytest.mark.ensemble
async def test_a_zookeeper_leader_change_cancels_no_owner(ensemble: ZooKeeperEnsemble) -> None:
    outcome = await _ride_through(ensemble, grace=None)
    assert outcome == {kind: "ran through" for kind in OWNERS}


@pytest.mark.ensemble
async def test_the_leader_change_does_disconnect_every_owner(
    ensemble: ZooKeeperEnsemble,
) -> None:
    """The control: with ``suspended_grace=0`` (the old default) the same leader change
    cancels every owner, so the ride-through above is not an accident of the set-up."""
    outcome = await _ride_through(ensemble, grace=0.0)
    assert all(result.startswith("cancelled") for result in outcome.values()), outcome
    assert set(outcome) == set(OWNERS)
