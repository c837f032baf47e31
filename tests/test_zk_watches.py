"""Watch iterators: no missed change, bursts collapse to the latest, re-armed after reconnect."""

from __future__ import annotations

import trio
import trio.testing

from framework import Session
from framework.testing import TcpProxy
from framework.zk import wait_created, wait_exists, wait_gone, watch_children, watch_data


async def test_data_watch_sees_every_step_of_a_lockstep_writer(session: Session) -> None:
    await session.create("/n", b"0")
    seen: list[bytes] = []
    with trio.fail_after(20):
        iterator = watch_data(session, "/n")
        snap = await anext(iterator)
        seen.append(snap.data)
        for i in range(1, 30):
            await session.set("/n", str(i).encode())
            snap = await anext(iterator)
            seen.append(snap.data)
        await iterator.aclose()
    assert seen == [str(i).encode() for i in range(30)]


async def test_burst_collapses_but_the_final_state_is_always_seen(
    zk_hosts: str, session: Session
) -> None:
    await session.create("/burst", b"-1")
    last_seen = []

    async def writer() -> None:
        async with Session(zk_hosts, chroot=session.chroot) as w:
            async with trio.open_nursery() as nursery:
                for i in range(300):
                    nursery.start_soon(w.set, "/burst", str(i).encode())
            await w.set("/burst", b"final")

    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(writer)
            async for snap in watch_data(session, "/burst"):
                last_seen.append(snap.stat.mzxid)
                if snap.data == b"final":
                    break
    assert last_seen == sorted(set(last_seen)), "states come in order, never repeated"


async def test_data_watch_reports_delete_and_recreate(session: Session) -> None:
    states = []
    with trio.fail_after(10):
        iterator = watch_data(session, "/life")
        states.append((await anext(iterator)).exists)
        await session.create("/life", b"a")
        states.append((await anext(iterator)).data)
        await session.delete("/life")
        states.append((await anext(iterator)).exists)
        await session.create("/life", b"a")  # same data, new node: still a change
        states.append((await anext(iterator)).data)
        await iterator.aclose()
    assert states == [False, b"a", False, b"a"]


async def test_children_watch_yields_complete_snapshots(session: Session) -> None:
    await session.create("/kids")
    with trio.fail_after(10):
        iterator = watch_children(session, "/kids")
        assert (await anext(iterator)).children == ()
        await session.create("/kids/b")
        await session.create("/kids/a")
        snap = await anext(iterator)
        while snap.children != ("a", "b"):
            snap = await anext(iterator)
        await session.delete("/kids/b")
        assert (await anext(iterator)).children == ("a",)
        await iterator.aclose()


async def test_wait_exists_and_wait_gone(session: Session) -> None:
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(session.create, "/later")
            stat = await wait_exists(session, "/later")
            assert stat.version == 0
            nursery.start_soon(session.delete, "/later")
            await wait_gone(session, "/later")


async def test_wait_created_returns_on_a_creation_even_if_the_node_is_gone_again(
    session: Session,
) -> None:
    """wait_created returns at once for a node that exists, and on a creation, even one
    undone in the same transaction (the caller's next read tells which)."""
    with trio.fail_after(10):
        await session.create("/there")
        await wait_created(session, "/there")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(wait_created, session, "/blink")
            # its exists request is queued: the transaction is sent after it, on the
            # same connection, so the server has set the watch when it applies it
            await trio.testing.wait_all_tasks_blocked()
            await session.transaction().create("/blink").delete("/blink").commit()
        assert await session.exists("/blink") is None


async def test_watch_is_rearmed_after_a_reconnect(
    zk_hosts: str, chroot: str, proxy: TcpProxy
) -> None:
    async with (
        Session(proxy.address, chroot=chroot, session_timeout=4.0) as watched,
        Session(zk_hosts, chroot=chroot) as writer,
    ):
        await writer.create("/cfg", b"v1")
        with trio.fail_after(20):
            iterator = watch_data(watched, "/cfg")
            assert (await anext(iterator)).data == b"v1"
            generation = watched.snapshot().generation
            proxy.cut()
            proxy.freeze()  # the client cannot reconnect until we unfreeze
            await watched.wait_change(generation)  # SUSPENDED
            await writer.set("/cfg", b"v2")  # a change while the watcher is away
            proxy.unfreeze()
            assert (await anext(iterator)).data == b"v2"
            await writer.set("/cfg", b"v3")  # and the watch keeps working afterwards
            assert (await anext(iterator)).data == b"v3"
            await iterator.aclose()
