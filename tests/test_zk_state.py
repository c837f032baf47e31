"""Session state through real faults: SUSPENDED -> CONNECTED, expiry -> LOST -> new session."""

from __future__ import annotations

import math

import pytest
import trio

from framework import Session, SessionInterrupted, SessionState
from framework.testing import TcpProxy, expire_session
from framework.zk import wait_gone


async def _wait_for(session: Session, state: SessionState) -> None:
    while session.state is not state:
        await session.wait_change(session.snapshot().generation)


async def test_suspended_then_reconnected_keeps_the_session(
    zk_hosts: str, chroot: str, proxy: TcpProxy
) -> None:
    async with Session(proxy.address, chroot=chroot, session_timeout=4.0) as s:
        original = s.session_id
        eph = await s.create("/mine", ephemeral=True)
        seen: list[SessionState] = []
        reached = {state: trio.Event() for state in SessionState}
        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:

                async def record() -> None:
                    async for change in s.states():
                        seen.append(change.state)
                        reached[change.state].set()

                nursery.start_soon(record)
                await reached[SessionState.CONNECTED].wait()
                reached[SessionState.CONNECTED] = trio.Event()
                async with s.guard(suspended_grace=math.inf):
                    proxy.freeze()
                    proxy.cut()
                    await reached[SessionState.SUSPENDED].wait()  # the reader saw it
                    proxy.unfreeze()
                    await reached[SessionState.CONNECTED].wait()
                nursery.cancel_scope.cancel()
        assert seen[:3] == [SessionState.CONNECTED, SessionState.SUSPENDED, SessionState.CONNECTED]
        assert s.session_id == original
        assert (await s.exists(eph)).ephemeralOwner == original


async def test_guard_cancels_on_suspension_by_default(
    zk_hosts: str, chroot: str, proxy: TcpProxy
) -> None:
    async with Session(proxy.address, chroot=chroot, session_timeout=4.0) as s:
        reached_end = False
        with trio.fail_after(20):
            with pytest.raises(SessionInterrupted) as info:
                async with s.guard():
                    proxy.freeze()
                    proxy.cut()
                    await trio.sleep_forever()
            reached_end = True
            proxy.unfreeze()
            await s.wait_connected()
        assert info.value.reason == "suspended" and reached_end


async def test_real_expiry_through_a_frozen_connection(
    zk_hosts: str, chroot: str, proxy: TcpProxy
) -> None:
    async with (
        Session(proxy.address, chroot=chroot, session_timeout=2.0) as s,
        Session(zk_hosts, chroot=chroot) as observer,
    ):
        original = s.session_id
        eph = await s.create("/eph", ephemeral=True)
        with trio.fail_after(30):
            with pytest.raises(SessionInterrupted) as info:
                async with s.guard(suspended_grace=math.inf):
                    proxy.freeze()
                    # server-side evidence that the session expired: its ephemeral node is gone
                    await wait_gone(observer, eph)
                    proxy.unfreeze()
                    await trio.sleep_forever()
            assert info.value.reason == "lost"
            new_id = await s.wait_connected()
        assert new_id != original
        assert await s.exists(eph) is None
        await s.create("/eph", ephemeral=True)  # the new session works


async def test_expiry_by_the_server_reports_lost_then_a_new_session(
    session: Session,
) -> None:
    original = session.session_id
    await session.create("/e", ephemeral=True)
    seen: list[SessionState] = []
    with trio.fail_after(20):
        generation = session.snapshot().generation
        await expire_session(session)
        while True:
            change = await session.wait_change(generation)
            generation = change.generation
            seen.append(change.state)
            if change.state is SessionState.CONNECTED:
                break
    assert SessionState.LOST in seen
    assert session.session_id not in (None, original)
    assert await session.exists("/e") is None


async def test_guard_refuses_to_start_while_disconnected(
    zk_hosts: str, chroot: str, proxy: TcpProxy
) -> None:
    async with Session(proxy.address, chroot=chroot) as s:
        with trio.fail_after(20):
            proxy.freeze()
            proxy.cut()
            await _wait_for(s, SessionState.SUSPENDED)
            with pytest.raises(SessionInterrupted):
                async with s.guard():
                    raise AssertionError("must not run")
            proxy.unfreeze()
            await s.wait_connected()


async def test_guard_passes_the_bodys_own_error_through_unwrapped(session: Session) -> None:
    with pytest.raises(KeyError, match="mine"):
        async with session.guard():
            raise KeyError("mine")
