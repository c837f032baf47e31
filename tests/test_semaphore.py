"""Semaphore: at most N leases, no herd, leases as scopes, real faults (kill -9, SIGSTOP)."""

from __future__ import annotations

import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest
import trio

from framework import Session
from framework.errors import ConfigurationError, LeaseLost, LeaseTimeout
from framework.primitives import Semaphore
from framework.testing import Lines, count_watch_fires, python_argv, spawn

HELPER = Path(__file__).parent / "helpers" / "recipe_holder.py"
OWNER_TIMEOUT = 2.0  # the paused child's session timeout
KILLED_TIMEOUT = 1.0  # the killed child's: the server expires it that much after the kill


async def test_never_more_than_max_holders(zk_hosts: str, chroot: str, session: Session) -> None:
    inside = peak = done = 0
    async with AsyncExitStack() as stack:
        sessions = [await stack.enter_async_context(
            Session(zk_hosts, chroot=chroot, session_timeout=4)) for _ in range(4)]

        async def worker(s: Session) -> None:
            nonlocal inside, peak, done
            for _ in range(4):
                async with Semaphore(s, "/sem", 3).acquire():
                    inside += 1
                    peak = max(peak, inside)
                    await trio.sleep(0.005)
                    inside -= 1
                    done += 1

        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                for s in sessions:
                    for _ in range(2):
                        nursery.start_soon(worker, s)
    assert done == 32
    assert 1 <= peak <= 3  # how many overlap depends on timing; never more than 3
    assert await session.children("/sem") == []  # no contender node left
    assert (await session.get("/sem"))[0] == b"3"


async def test_a_release_promotes_the_first_waiter_only(
    zk_hosts: str, chroot: str, session: Session
) -> None:
    """2 leases, 5 contenders in 5 sessions.  Releasing a holder (not the oldest) wakes the
    first waiter, which takes the lease and wakes the one behind it: one watch fire each,
    none for the rest.  Leases go in arrival order."""
    count = 5
    async with AsyncExitStack() as stack:
        sessions = [await stack.enter_async_context(
            Session(zk_hosts, chroot=chroot, session_timeout=4)) for _ in range(count)]
        wakers = [0] * count
        armed = [trio.Event() for _ in range(count)]
        fired = [0] * count
        for i, s in enumerate(sessions):
            count_watch_fires(s, fired, i)
            _count_wakers(s, wakers, i, armed[i], need=2 if i == 2 else 1)
        holding = [trio.Event() for _ in range(count)]
        release = [trio.Event() for _ in range(count)]
        order: list[int] = []

        async def contend(i: int) -> None:
            sem = Semaphore(sessions[i], "/sem", 2, identifier=str(i).encode())
            async with sem.acquire():
                order.append(i)
                holding[i].set()
                await release[i].wait()

        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                for i in range(count):
                    nursery.start_soon(contend, i)
                    await (holding[i] if i < 2 else armed[i]).wait()
                    await sessions[i].sync("/sem")  # its watches are set on the server
                assert await Semaphore(session, "/sem", 2).holders() == [b"0", b"1"]
                before = list(fired)
                release[1].set()
                await holding[2].wait()
                for s in sessions[2:]:
                    await s.sync("/sem")  # notifications arrive before this reply
                woken = [after - prior for after, prior in zip(fired, before, strict=True)]
                assert woken[2:] == [1, 1, 0]
                release[0].set()
                await holding[3].wait()
                release[2].set()
                await holding[4].wait()
                for event in release:
                    event.set()
    assert order == [0, 1, 2, 3, 4]


def _count_wakers(s: Session, wakers: list[int], i: int, armed: trio.Event, need: int) -> None:
    """Set ``armed`` once ``s`` has made ``need`` watch callbacks beyond its lease's own."""
    make = s.waker

    def waker(event: trio.Event) -> Any:
        wakers[i] += 1
        if wakers[i] >= need:
            armed.set()
        return make(event)

    s.waker = waker  # type: ignore[method-assign]


async def test_timeout_mismatch_and_bad_arguments(session: Session) -> None:
    sem = Semaphore(session, "/sem", 1)
    async with sem.acquire():
        with pytest.raises(LeaseTimeout):
            async with Semaphore(session, "/sem", 1).acquire(timeout=0.2):
                raise AssertionError("two leases of one")
        assert len(await session.children("/sem")) == 1  # the waiter's node is gone
    with pytest.raises(ConfigurationError, match="has 1 leases; this client asked for 2"):
        async with Semaphore(session, "/sem", 2).acquire():
            pass
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ConfigurationError, match="max_leases"):
            Semaphore(session, "/s2", bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="timeout"):
        async with sem.acquire(timeout=-1):
            pass


async def test_deleting_the_lease_node_ends_the_lease(session: Session) -> None:
    with trio.fail_after(10), pytest.raises(LeaseLost, match="node deleted"):
        async with Semaphore(session, "/sem", 2).acquire() as lease:
            await session.delete(lease.node)
            await trio.sleep_forever()


async def _read_until(lines: Lines, kind: str) -> list[str]:
    return await lines.until(lambda line: line.split(" ", 1)[0] == kind)


async def test_a_killed_holder_gives_its_lease_back(
    zk_hosts: str, chroot: str, session: Session
) -> None:
    argv = python_argv(HELPER, zk_hosts, chroot, "semaphore", 1, "--timeout", KILLED_TIMEOUT)
    with trio.fail_after(40):
        async with spawn(argv, pipe_stdout=True) as holder:
            assert holder.lines is not None
            await _read_until(holder.lines, "READY")
            sem = Semaphore(session, "/sem", 1)
            with pytest.raises(LeaseTimeout):
                async with sem.acquire(timeout=0.3):
                    pass
            holder.kill()
            async with sem.acquire():  # once the server expires the killed session
                assert await sem.holders() == [b""]


async def test_a_holder_paused_past_its_session_starts_no_step(
    zk_hosts: str, chroot: str, session: Session
) -> None:
    """SIGSTOP past the session timeout: the server expires the holder's session and the
    lease goes to a waiter; after SIGCONT the old holder makes no effect and says LeaseLost."""
    argv = python_argv(HELPER, zk_hosts, chroot, "semaphore", 1, "--timeout", OWNER_TIMEOUT)
    with trio.fail_after(40):
        async with spawn(argv, pipe_stdout=True) as holder:
            assert holder.lines is not None
            await _read_until(holder.lines, "EFFECT")
            holder.pause()
            async with Semaphore(session, "/sem", 1).acquire():
                resumed = time.monotonic()
                holder.resume()
                rest = await _read_until(holder.lines, "ENDED")
    effects = [line for line in rest
               if line.startswith("EFFECT") and float(line.split()[1]) > resumed]
    assert effects == [], rest
    assert rest[-1].startswith("ENDED LeaseLost"), rest
