"""Group membership against a real ZooKeeper: join/leave/update, watch snapshots, rejoin."""

from __future__ import annotations

from contextlib import aclosing

import pytest
import trio

from framework import NodeExistsError, Session
from framework.primitives.membership import Group
from framework.testing import expire_session
from framework.zk import watch_data

PATH = "/group"


async def wait_for(snapshots, predicate):  # type: ignore[no-untyped-def]
    async for members in snapshots:
        if predicate(members):
            return members
    raise AssertionError("unreachable")


async def test_join_update_leave_seen_by_a_watcher(
    zk_hosts: str, chroot: str, session: Session
) -> None:
    async with Session(zk_hosts, chroot=chroot, session_timeout=4) as other:
        group, mine = Group(session, PATH), Group(other, PATH)
        assert await group.members() == {}
        with trio.fail_after(10):
            watcher = group.watch()
            assert await anext(watcher) == {}
            async with mine.join("w1", b"a") as w1:
                assert (w1.name, w1.path) == ("w1", f"{PATH}/w1")
                assert await wait_for(watcher, lambda m: m == {"w1": b"a"})
                async with mine.join(data=b"anon") as anon:
                    assert anon.name.startswith("m_") and anon.path == f"{PATH}/{anon.name}"
                    await wait_for(watcher, lambda m: m == {"w1": b"a", anon.name: b"anon"})
                    await w1.update(b"b")
                    await wait_for(watcher, lambda m: m == {"w1": b"b", anon.name: b"anon"})
                await wait_for(watcher, lambda m: m == {"w1": b"b"})
                assert await group.members() == {"w1": b"b"}
            await wait_for(watcher, lambda m: m == {})
            await watcher.aclose()
        assert await session.children(PATH) == []


async def test_watch_never_misses_the_latest_state_of_a_burst(
    zk_hosts: str, chroot: str, session: Session
) -> None:
    group = Group(session, PATH)
    async with Session(zk_hosts, chroot=chroot, session_timeout=4) as other:
        with trio.fail_after(10):
            async with Group(other, PATH).join("w", b"0") as member:
                watcher = group.watch()
                assert await anext(watcher) == {"w": b"0"}
                for i in range(1, 50):
                    await member.update(str(i).encode())
                # intermediate states may collapse, but the last one is always yielded
                await wait_for(watcher, lambda m: m == {"w": b"49"})
                await watcher.aclose()


async def test_member_rejoins_after_its_session_expires(
    zk_hosts: str, chroot: str, session: Session
) -> None:
    async with Session(zk_hosts, chroot=chroot, session_timeout=2) as s:
        group = Group(s, PATH)
        with trio.fail_after(20):
            async with group.join("w1", b"v1") as named, group.join(data=b"seq") as anon:
                await named.update(b"v2")
                old_session, old_anon = s.session_id, anon.name
                await expire_session(s)
                # the server removed both nodes; the join's background task recreates them
                # in the new session, with the latest data
                async for snap in watch_data(session, f"{PATH}/w1"):
                    if snap.stat is not None and snap.stat.ephemeralOwner not in (0, old_session):
                        break
                assert snap.data == b"v2"
                assert s.session_id == snap.stat.ephemeralOwner
                async with aclosing(Group(session, PATH).watch()) as watcher:
                    members = await wait_for(
                        watcher, lambda m: len(m) == 2 and old_anon not in m
                    )
                assert members == {"w1": b"v2", anon.name: b"seq"}
                assert anon.name != old_anon  # a sequential member gets a new node
                await named.update(b"v3")
                assert (await session.get(f"{PATH}/w1"))[0] == b"v3"
        assert await session.children(PATH) == []


async def test_taken_name_raises_or_waits(
    zk_hosts: str, chroot: str, session: Session
) -> None:
    async with Session(zk_hosts, chroot=chroot, session_timeout=4) as other:
        group, rival = Group(session, PATH), Group(other, PATH)
        joined = trio.Event()
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                async with group.join("w1", b"first"):
                    with pytest.raises(NodeExistsError):
                        async with rival.join("w1"):
                            pass

                    async def wait_then_join() -> None:
                        async with rival.join("w1", b"second", wait_if_taken=True):
                            joined.set()
                            await trio.sleep_forever()

                    nursery.start_soon(wait_then_join)
                    assert await group.members() == {"w1": b"first"}
                    assert not joined.is_set()
                await joined.wait()
                assert await group.members() == {"w1": b"second"}
                nursery.cancel_scope.cancel()


async def test_errors_in_the_body_propagate_unwrapped(session: Session) -> None:
    with pytest.raises(KeyError):
        async with Group(session, PATH).join("w1"):
            raise KeyError("x")
    assert await session.children(PATH) == []
