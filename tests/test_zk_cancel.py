"""Cancellation never hangs and never leaks a request that was not sent."""

from __future__ import annotations

import trio

from framework import Session
from framework.zk import watch_data


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
