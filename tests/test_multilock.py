"""MultiLock: several locks as one, without deadlock; lost as one; real faults."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import trio

from framework import Session
from framework.errors import (
    ConfigurationError,
    LockLost,
    LockTimeout,
    TransactionFailedError,
)
from framework.primitives import Lock, MultiLock
from framework.testing import python_argv, spawn

HELPER = Path(__file__).parent / "helpers" / "recipe_holder.py"


async def test_overlapping_multilocks_in_any_order_exclude_and_never_deadlock(
    session: Session,
) -> None:
    """Tasks take {a, b} as [a, b] or [b, a], and plain locks on a or b: the sorted order
    makes every one of them finish, and no two hold a common lock at once."""
    held: dict[str, int] = {"/a": 0, "/b": 0}
    runs = 0

    async def take(paths: list[str]) -> None:
        nonlocal runs
        for _ in range(3):
            async with MultiLock(session, paths).acquire():
                for p in set(paths):
                    held[p] += 1
                    assert held[p] == 1, p
                await trio.sleep(0.002)
                for p in set(paths):
                    held[p] -= 1
                runs += 1

    async def single(path: str) -> None:
        nonlocal runs
        for _ in range(3):
            async with Lock(session, path).acquire():
                held[path] += 1
                assert held[path] == 1
                await trio.sleep(0.002)
                held[path] -= 1
                runs += 1

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(take, ["/a", "/b"])
            nursery.start_soon(take, ["/b", "/a"])
            nursery.start_soon(take, ["/b", "/a", "/b"])
            nursery.start_soon(single, "/a")
            nursery.start_soon(single, "/b")
    assert runs == 15


async def test_a_timeout_releases_what_was_held(session: Session) -> None:
    async with Lock(session, "/b").acquire():
        with pytest.raises(LockTimeout, match="waiting for /b"):
            async with MultiLock(session, ["/b", "/a"]).acquire(timeout=0.3):
                raise AssertionError("held /b twice")
        assert await session.children("/a") == []  # /a was taken, then given back
    for bad in ([], "/a"):
        with pytest.raises(ConfigurationError):
            MultiLock(session, bad)


async def test_losing_one_lock_ends_the_holding_and_fences(session: Session) -> None:
    with trio.fail_after(10), pytest.raises(LockLost, match="node deleted"):
        async with MultiLock(session, ["/a", "/b"]).acquire() as holding:
            assert sorted(holding.tokens) == ["/a", "/b"]
            await session.create("/data", b"")
            await holding.fence(session.transaction()).set("/data", b"1").commit()
            await session.delete(holding.holdings[1].node)
            with pytest.raises(TransactionFailedError):
                await holding.fence(session.transaction()).set("/data", b"2").commit()
            await trio.sleep_forever()
    assert await session.children("/a") == []  # the other lock was released
    assert (await session.get("/data"))[0] == b"1"


async def test_a_killed_holder_releases_every_lock(
    zk_hosts: str, chroot: str, session: Session
) -> None:
    argv = python_argv(HELPER, zk_hosts, chroot, "multilock", "a,b", "--timeout", 1.0)
    with trio.fail_after(40):
        async with spawn(argv, pipe_stdout=True) as holder:
            assert holder.lines is not None
            await holder.lines.until(lambda line: line == "READY")
            with pytest.raises(LockTimeout):
                async with Lock(session, "/b").acquire(timeout=0.3):
                    pass
            holder.kill()
            async with MultiLock(session, ["/a", "/b"]).acquire():
                pass


async def test_a_holder_paused_past_its_session_makes_no_effect(
    zk_hosts: str, chroot: str, session: Session
) -> None:
    """SIGSTOP past the session timeout: both locks go to a waiter; after SIGCONT the old
    holder makes no effect and says LockLost."""
    argv = python_argv(HELPER, zk_hosts, chroot, "multilock", "a,b", "--timeout", 2.0)
    with trio.fail_after(40):
        async with spawn(argv, pipe_stdout=True) as holder:
            assert holder.lines is not None
            await holder.lines.until(lambda line: line.startswith("EFFECT"))
            holder.pause()
            async with MultiLock(session, ["/b", "/a"]).acquire():
                resumed = time.monotonic()
                holder.resume()
                rest = await holder.lines.until(lambda line: line.startswith("ENDED"))
    effects = [line for line in rest
               if line.startswith("EFFECT") and float(line.split()[1]) > resumed]
    assert effects == [], rest
    assert rest[-1].startswith("ENDED LockLost"), rest
