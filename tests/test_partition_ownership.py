"""No two owners at once under a partition, for an idle and for a busy owner.

Owner A's connection is frozen (the project's proxy: no byte passes either way, no socket
closes) while B waits for the same leadership, lock, queue claim or master role.  A's body is
either idle or *busy*: it keeps sending requests into the partition (readers that read and
sleep, and a poller that gives up on each read after 0.2 s and sends another), which kazoo
alone never notices because every send resets its heartbeat timer.

The evidence comes from the server: A's body records its start, and its end the moment it is
cancelled, through a third session that is never frozen; B records its start the same way.
Sequential record names carry the server's order: A's end must come before B's start.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest
import trio

from framework import (
    ClaimLost,
    Election,
    LeadershipLost,
    Lock,
    LockLost,
    Session,
    SessionInterrupted,
    WorkQueue,
)
from framework.runtime import Master, MasterContext
from framework.testing import TcpProxy

TIMEOUT = 3.0  # seconds; the trust deadline is 2/3 of it after the newest answered request
Body = Callable[[], Awaitable[None]]


async def idle(_session: Session) -> None:
    await trio.sleep_forever()


async def busy(session: Session) -> None:
    """Keep requests flowing from A into the partition, as a busy leader does."""

    async def reader() -> None:
        while True:
            await session.exists("/records")
            await trio.sleep(1.5)

    async def poller() -> None:
        while True:
            with trio.move_on_after(0.2):
                await session.exists("/records")

    async with trio.open_nursery() as nursery:
        for _ in range(8):
            nursery.start_soon(reader)
        nursery.start_soon(poller)


async def own_leadership(s: Session, body: Body) -> None:
    async with Election(s, "/election").leadership():
        await body()


async def own_lock(s: Session, body: Body) -> None:
    async with Lock(s, "/lock").acquire():
        await body()


async def own_claim(s: Session, body: Body) -> None:
    async with WorkQueue(s, "/queue").take():
        await body()


async def own_master(s: Session, body: Body) -> None:
    class Leader(Master):
        async def lead(self, ctx: MasterContext) -> None:
            await body()

    await Leader("partition", name=f"m{s.session_id}").run(s)


OWNERS = {"election": own_leadership, "lock": own_lock, "claim": own_claim,
          "master": own_master}
LOSSES = (LeadershipLost, LockLost, ClaimLost, SessionInterrupted)


@pytest.mark.parametrize("load", [idle, busy], ids=["idle", "busy"])
@pytest.mark.parametrize("kind", sorted(OWNERS))
async def test_owner_cancelled_before_the_next_owner_starts(
    kind: str, load: Callable[[Session], Awaitable[None]], zk_hosts: str, chroot: str,
    session: Session, proxy: TcpProxy,
) -> None:
    own = OWNERS[kind]
    await session.ensure_path("/records")
    if kind == "claim":
        await WorkQueue(session, "/queue").put(b"the one item")
    a_started, a_ended, b_started = trio.Event(), trio.Event(), trio.Event()

    async def record(name: str) -> None:
        with trio.CancelScope(shield=True):
            await session.create(f"/records/{name}-", sequence=True)

    async with (
        Session(proxy.address, chroot=chroot, session_timeout=TIMEOUT) as a,
        Session(zk_hosts, chroot=chroot, session_timeout=TIMEOUT) as b,
    ):
        async def body_a() -> None:
            if a_started.is_set():  # A may lead again later, in a new session: not a case
                await trio.sleep_forever()
            await record("a-start")
            a_started.set()
            try:
                await load(a)
            finally:
                await record("a-end")
                a_ended.set()

        async def body_b() -> None:
            await record("b-start")
            b_started.set()
            await trio.sleep_forever()

        async def run_a() -> None:
            try:
                await own(a, body_a)
            except LOSSES:
                pass

        with trio.fail_after(40):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(run_a)
                await a_started.wait()
                nursery.start_soon(own, b, body_b)
                await wait_until_b_waits(kind, session)
                proxy.freeze()
                await b_started.wait()
                await a_ended.wait()
                proxy.unfreeze()
                nursery.cancel_scope.cancel()
    order = sorted(await session.children("/records"), key=lambda n: n.rsplit("-", 1)[1])
    names = [n.rsplit("-", 1)[0] for n in order]
    assert names[:3] == ["a-start", "a-end", "b-start"], order


async def wait_until_b_waits(kind: str, session: Session) -> None:
    """B is queued behind A (a second contender node) before the partition starts; a queue
    consumer has nothing to show, and the order of records proves the point anyway."""
    path = {"election": "/election", "lock": "/lock",
            "master": "/apps/partition/masters"}.get(kind)
    if path is None:
        return
    while True:
        fired = trio.Event()
        kids = await session.children(path, watch=session.waker(fired))
        if len(kids) >= 2:
            return
        await fired.wait()
