"""Cancellation never hangs and never leaks a request that was not sent."""

from __future__ import annotations

import pytest
import trio

from framework import Session
from framework.testing import TcpProxy
from framework.zk import SessionState, cleanup_scope, watch_data
from framework.zk.scopes import CLEANUP_FLOOR


async def test_cancel_before_issue_sends_nothing(session: Session) -> None:
    with trio.CancelScope() as scope:
        scope.cancel()
        await session.create("/never")
    assert scope.cancelled_caught
    assert await session.exists("/never") is None


async def test_cancelled_watch_iterator_returns_promptly(session: Session) -> None:
    await session.create("/w", b"0")
    with trio.fail_after(5):
        with trio.move_on_after(0.2) as scope:
            async for _snapshot in watch_data(session, "/w"):
                pass
    assert scope.cancelled_caught


async def test_many_cancelled_reads_leave_the_session_usable(session: Session) -> None:
    await session.create("/r", b"1")
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            for _ in range(100):
                nursery.start_soon(session.get, "/r")
            nursery.cancel_scope.cancel()
        assert session._limit.in_use == 0
        assert (await session.get("/r"))[0] == b"1"


async def test_unreachable_server_gives_a_clear_error() -> None:
    from framework import NotConnectedError
    from framework.zkserver import free_ports

    (port,) = free_ports(1)
    with trio.fail_after(10):
        try:
            async with Session(f"127.0.0.1:{port}", connect_timeout=0.5):
                raise AssertionError("connected to nothing")
        except NotConnectedError as exc:
            assert "could not connect" in str(exc) and str(port) in str(exc)


async def test_clean_up_steps_behind_a_partition_share_one_deadline(
    chroot: str, proxy: TcpProxy
) -> None:
    """Cut off from ZooKeeper, a clean-up ends a second after the server may expire the
    session; the next clean-up step of the same cancellation gets only the floor, not
    another full bound (three steps used to take three session timeouts)."""
    async with Session(proxy.address, chroot=chroot, session_timeout=2.0) as s:
        with trio.fail_after(20):
            proxy.freeze()
            proxy.cut()
            while s.state is not SessionState.SUSPENDED:
                await s.wait_change(s.snapshot().generation)
            expiry = s.trusted_until() + s.session_timeout / 3
            with cleanup_scope(s) as first:
                await s.exists("/anything")  # waits for a connection that does not come
            assert first.cancelled_caught
            assert first.deadline == pytest.approx(expiry + 1.0, abs=0.05)
            entered = trio.current_time()
            with cleanup_scope(s) as second:
                await s.exists("/anything")
            assert second.cancelled_caught
            assert second.deadline - entered == pytest.approx(CLEANUP_FLOOR, abs=0.05)
            proxy.unfreeze()
