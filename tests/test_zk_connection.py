"""The protocol driver's own parts: framing, chroot, watches across a drop, cancelled waits."""

from __future__ import annotations

import struct
from collections.abc import Callable

import pytest
import trio
from kazoo.protocol.states import EventType, WatchedEvent

from framework import Session
from framework.testing import TcpProxy, expire_session
from framework.zk import SessionState
from framework.zk.wire import MAX_PACKET, PacketReader


def test_packets_are_split_wherever_the_stream_cuts_them() -> None:
    packets = [b"", b"a", b"xyz" * 1000]
    stream = b"".join(struct.pack(">i", len(p)) + p for p in packets)
    for step in (1, 3, 7, len(stream)):
        reader = PacketReader()
        seen = []
        for i in range(0, len(stream), step):
            seen.extend(reader.feed(stream[i:i + step]))
        assert seen == packets
    with pytest.raises(ValueError, match="bad packet length"):
        PacketReader().feed(struct.pack(">i", MAX_PACKET + 1))


async def test_chroot_paths_go_out_under_it_and_come_back_without_it(session: Session) -> None:
    """Paths of requests, created nodes, transaction results and watch events."""
    assert session.chroot
    assert (await session.exists("/")) is not None
    node = await session.create("/seq-", b"", sequence=True, ephemeral=True)
    assert node.startswith("/seq-") and len(node) == len("/seq-") + 10
    assert await session.children("/") == [node[1:]]
    await session.sync("/")
    await session.ensure_path("/x/y/z")
    assert sorted(await session.children("/")) == sorted([node[1:], "x"])
    created, _stat = await session.transaction().create("/t-", sequence=True).set(
        "/x", b"v").commit()
    assert created.startswith("/t-")
    events: list[WatchedEvent] = []
    fired = trio.Event()

    def watch(event: WatchedEvent) -> None:
        events.append(event)
        fired.set()

    await session.get("/x", watch=watch)
    await session.set("/x", b"w")
    with trio.fail_after(10):
        await fired.wait()
    assert [(e.type, e.path) for e in events] == [(EventType.CHANGED, "/x")]


async def test_programming_errors_are_caught_before_sending(session: Session) -> None:
    with pytest.raises(TypeError, match="watch"):
        await session.get("/", watch="not callable")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="version"):
        await session.set("/", b"", version="3")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="version"):
        await session.delete("/nope", version=True)
    assert (await session.get("/"))[1].version == 0, "nothing was written"


async def test_a_cancelled_wait_leaves_the_session_usable(session: Session) -> None:
    """Cancel many waits while their replies are in flight; late replies are dropped quietly
    and the session keeps answering, in order."""
    await session.create("/n", b"v")
    for _ in range(20):
        with trio.CancelScope() as scope:
            async with trio.open_nursery() as nursery:
                for _ in range(50):
                    nursery.start_soon(session.get, "/n")
                await trio.lowlevel.checkpoint()
                scope.cancel()
    with trio.fail_after(5):
        assert (await session.get("/n"))[0] == b"v"


async def test_watches_are_set_again_on_a_new_connection(
    session: Session, chroot: str, proxy: TcpProxy
) -> None:
    """The link is cut and, while it is down, watched nodes change: once the session is back
    on a new connection its watches fire for those changes (data, exists, children), once
    each, without being read again; a watch whose node did not change stays quiet."""
    async with Session(proxy.address, chroot=chroot, session_timeout=6.0) as s:
        for name in ("data", "quiet", "kids"):
            await s.create(f"/{name}", b"")
        events: dict[str, list[WatchedEvent]] = {}
        done = trio.Event()

        def watch(name: str) -> Callable[[WatchedEvent], None]:
            def fired(event: WatchedEvent) -> None:
                events.setdefault(name, []).append(event)
                if {"data", "missing", "kids"} <= set(events):
                    done.set()
            return fired

        await s.get("/data", watch=watch("data"))
        await s.get("/quiet", watch=watch("quiet"))
        assert await s.exists("/missing", watch=watch("missing")) is None
        await s.children("/kids", watch=watch("kids"))
        session_id, accepted = s.session_id, proxy.connections_accepted
        proxy.freeze()
        proxy.cut()
        await session.set("/data", b"changed")
        await session.create("/missing")
        await session.create("/kids/k")
        proxy.unfreeze()
        with trio.fail_after(20):
            await done.wait()
            await s.sync("/")
        assert s.session_id == session_id and proxy.connections_accepted > accepted
        assert {name: [e.type for e in got] for name, got in events.items()} == {
            "data": [EventType.CHANGED], "missing": [EventType.CREATED],
            "kids": [EventType.CHILD]}
        assert [e.path for e in events["data"]] == ["/data"]  # without the chroot


async def test_an_expired_session_fires_every_watch_once_with_none(
    chroot: str, zk_hosts: str
) -> None:
    """The session expires: each registered watch fires once with a NONE event and is
    forgotten; a new session follows."""
    async with Session(zk_hosts, chroot=chroot, session_timeout=6.0) as s:
        await s.create("/w", b"")
        events: list[WatchedEvent] = []
        fired = trio.Event()

        def watch(event: WatchedEvent) -> None:
            events.append(event)
            fired.set()

        await s.get("/w", watch=watch)
        await s.children("/w", watch=watch)
        session_id = s.session_id
        await expire_session(s)
        with trio.fail_after(20):
            await fired.wait()
            while s.session_id in (None, session_id):
                await s.wait_change(s.snapshot().generation)
        assert [e.type for e in events] == [EventType.NONE]  # one callback, called once
        await s.set("/w", b"changed")  # the forgotten watch does not fire again
        await s.sync("/")
        assert len(events) == 1


async def test_a_silent_server_is_dropped_after_the_read_timeout_however_busy(
    chroot: str, proxy: TcpProxy
) -> None:
    """A hung peer that never closes its socket: requests keep going out (so no heartbeat is
    due) and nothing comes back; the watchdog drops the connection once no reply has proven
    the session for a read timeout, and the session is SUSPENDED, then back."""
    async with Session(proxy.address, chroot=chroot, session_timeout=3.0) as s:
        generation = s.snapshot().generation
        proxy.freeze()

        async def keep_sending() -> None:
            while True:
                with trio.move_on_after(0.05):
                    await s.exists("/")

        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(keep_sending)
                change = await s.wait_change(generation)
                assert change.state is SessionState.SUSPENDED
                assert s._liveness.dropped_connections == 1
                proxy.unfreeze()
                await s.wait_connected()
                nursery.cancel_scope.cancel()
        assert await s.exists("/") is not None
