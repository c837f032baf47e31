"""Barrier against a real server: waiters in other sessions, ephemeral barriers, suspension."""

from __future__ import annotations

import trio

from framework import Session
from framework.primitives.barrier import Barrier
from framework.testing import TcpProxy


async def test_waiters_are_released_by_lowering(zk_hosts: str, chroot: str,
                                                session: Session) -> None:
    barrier = Barrier(session, "/app/barrier")
    await barrier.raise_()
    await barrier.raise_()  # idempotent
    assert await barrier.is_up()
    log: list[str] = []
    async with Session(zk_hosts, chroot=chroot) as a, Session(zk_hosts, chroot=chroot) as b:
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                for s, name in ((a, "a"), (b, "b")):

                    async def wait(task_status: trio.TaskStatus[bool],
                                   s: Session = s, name: str = name) -> None:
                        await Barrier(s, "/app/barrier").wait(task_status=task_status)
                        log.append(name)

                    assert await nursery.start(wait) is True  # watch armed, barrier up
                log.append("lower")
                await barrier.lower()
    assert log[0] == "lower" and sorted(log[1:]) == ["a", "b"]
    await barrier.lower()  # idempotent
    with trio.fail_after(5):
        await barrier.wait()  # down: returns at once


async def test_ephemeral_barrier_falls_with_its_session(zk_hosts: str, chroot: str,
                                                        session: Session) -> None:
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            async with Session(zk_hosts, chroot=chroot) as raiser:
                await Barrier(raiser, "/b", ephemeral=True).raise_()
                assert await nursery.start(Barrier(session, "/b").wait) is True
            # the raiser's session closed: the barrier is down and the waiter returns


async def test_lowering_while_the_waiter_is_disconnected_is_seen(
    zk_hosts: str, chroot: str, session: Session, proxy: TcpProxy
) -> None:
    await Barrier(session, "/b").raise_()
    async with Session(proxy.address, chroot=chroot, session_timeout=4.0) as waiter:
        with trio.fail_after(15):
            async with trio.open_nursery() as nursery:
                assert await nursery.start(Barrier(waiter, "/b").wait) is True
                proxy.freeze()
                proxy.cut()
                await Barrier(session, "/b").lower()
                proxy.unfreeze()
