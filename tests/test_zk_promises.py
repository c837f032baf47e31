"""The protocol driver keeps its contract under load, at close and against bad packets.

* Under a write load whose queue takes longer than the read timeout, a server that keeps
  answering is not dropped (its replies are the connection's proof of life).
* Closing a session ends everything that waits on it: a request in flight, a task in
  ``wait_gone`` outside the session's nursery, watches (``NONE`` in state ``CLOSED``).
* A packet the driver cannot parse ends one connection, never the session: the next member
  is tried (a fake server here, since no real one sends such packets).
* The smaller promises: a loop blocked for less than the read timeout keeps its connection,
  one callback is called once per event however it watched, the handshake timeout follows
  the negotiated session timeout, and ``NONE`` events say why watches ended.
"""

from __future__ import annotations

import struct
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from functools import partial

import pytest
import trio
import trio.testing
from kazoo.protocol.states import EventType, KeeperState, WatchedEvent

from framework import Session, ZooKeeperEnsemble
from framework.errors import FrameworkError
from framework.testing import TcpProxy, expire_session
from framework.zk import SessionState, wait_gone

# ------------------------------------------------------------------------------ write load


def test_a_server_that_keeps_answering_is_not_dropped_under_write_load() -> None:
    """2,000 writes of 200 KB (400 MB) issued at once, with a 2 s session: the whole queue
    takes longer than the 1.33 s read timeout, but replies keep coming.  Every write
    succeeds and the connection is never dropped.  (A server of its own, with the heap that
    a load like this needs.)"""
    with ZooKeeperEnsemble(1, heap_mb=1024) as server:
        trio.run(write_load, server.connect_string)


async def write_load(hosts: str) -> None:
    payload = b"x" * 200_000
    async with Session(hosts, chroot="/load", session_timeout=2.0) as s:
        await s.create("/big", b"")
        failures: list[BaseException] = []
        states: list[SessionState] = []

        async def watch_states() -> None:
            async for change in s.states():
                states.append(change.state)

        async def write() -> None:
            try:
                await s.set("/big", payload)
            except FrameworkError as exc:
                failures.append(exc)

        with trio.fail_after(120):
            async with trio.open_nursery() as watcher:
                watcher.start_soon(watch_states)
                async with trio.open_nursery() as nursery:
                    for _ in range(2000):
                        nursery.start_soon(write)
                watcher.cancel_scope.cancel()
        stat = await s.exists("/big")
        dropped = s._liveness.dropped_connections
    assert failures == [], f"{len(failures)} writes failed, first: {failures[0]!r}"
    assert stat is not None and stat.version == 2000
    assert dropped == 0 and SessionState.SUSPENDED not in states, states


# ------------------------------------------------------------------------------ close


async def test_close_ends_requests_in_flight_waiters_outside_and_watches(
    chroot: str, proxy: TcpProxy
) -> None:
    """The link is frozen (a request is in flight, unanswered) when the session closes: the
    request fails, a task waiting in ``wait_gone`` in another nursery is woken, and the
    watch fires once with ``NONE`` in state ``CLOSED``."""
    events: list[WatchedEvent] = []
    outcomes: dict[str, str] = {}
    in_flight, both_ended = trio.Event(), trio.Event()

    def ended(name: str, how: str) -> None:
        outcomes[name] = how
        if len(outcomes) == 2:
            both_ended.set()
    async with trio.open_nursery() as outside:
        async with Session(proxy.address, chroot=chroot, session_timeout=4.0) as s:
            await s.create("/here", b"")
            await s.get("/here", watch=events.append)

            async def gone() -> None:
                try:
                    await wait_gone(s, "/here")
                    ended("wait_gone", "returned")
                except FrameworkError as exc:
                    ended("wait_gone", type(exc).__name__)

            async def read() -> None:
                in_flight.set()
                try:
                    await s.get("/here")
                    ended("get", "returned")
                except FrameworkError as exc:
                    ended("get", type(exc).__name__)

            outside.start_soon(gone)
            await trio.testing.wait_all_tasks_blocked()
            proxy.freeze()
            outside.start_soon(read)
            await in_flight.wait()
            await trio.testing.wait_all_tasks_blocked()
        proxy.unfreeze()
        with trio.fail_after(10):
            await both_ended.wait()
    assert outcomes == {"wait_gone": "NotConnectedError", "get": "NotConnectedError"}, outcomes
    assert [(e.type, e.state) for e in events] == [(EventType.NONE, KeeperState.CLOSED)]


async def test_close_while_suspended_ends_watches(chroot: str, proxy: TcpProxy) -> None:
    """Closed while no connection is up (the member is gone): the watch still ends."""
    events: list[WatchedEvent] = []
    async with Session(proxy.address, chroot=chroot, session_timeout=2.0) as s:
        await s.create("/n", b"")
        await s.exists("/n", watch=events.append)
        proxy.freeze()
        with trio.fail_after(10):
            async for change in s.states():
                if change.state is SessionState.SUSPENDED:
                    break
    proxy.unfreeze()
    assert [(e.type, e.state) for e in events] == [(EventType.NONE, KeeperState.CLOSED)]


# ------------------------------------------------------------------------------ bad packets


class FakeMember:
    """A TCP server on 127.0.0.1 that reads a client's handshake, then runs ``answer`` on
    the stream; ``contacted`` counts the clients that came."""

    def __init__(self, answer: Callable[[trio.SocketStream], Awaitable[None]]) -> None:
        self.answer = answer
        self.contacted = 0
        self.address = ""

    async def serve(self, stream: trio.SocketStream) -> None:
        self.contacted += 1
        try:
            await stream.receive_some(4096)
            await self.answer(stream)
            await trio.sleep_forever()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass

    @asynccontextmanager
    async def running(self) -> AsyncIterator[FakeMember]:
        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(partial(trio.serve_tcp, self.serve, 0,
                                                    host="127.0.0.1"))
            self.address = f"127.0.0.1:{listeners[0].socket.getsockname()[1]}"
            yield self
            nursery.cancel_scope.cancel()


def framed(body: bytes) -> bytes:
    return struct.pack(">i", len(body)) + body


async def short_handshake(stream: trio.SocketStream) -> None:
    await stream.send_all(framed(b"\x00\x00"))


#: a server's handshake reply: protocol version, granted timeout (ms), session id, password
GRANTED = framed(struct.pack(">iiqi", 0, 4000, 0x1234, 16) + b"\x00" * 16 + b"\x00")


async def short_header(stream: trio.SocketStream) -> None:
    await stream.send_all(GRANTED)
    await stream.send_all(framed(b"\xff\xff"))


async def short_watch_event(stream: trio.SocketStream) -> None:
    await stream.send_all(GRANTED)
    await stream.send_all(framed(struct.pack(">iqi", -1, 0, 0) + b"\x00\x00\x00"))


@pytest.mark.parametrize("answer", [short_handshake, short_header, short_watch_event])
async def test_a_malformed_packet_ends_the_connection_not_the_session(
    zk_hosts: str, chroot: str, answer: Callable[[trio.SocketStream], Awaitable[None]]
) -> None:
    """Sessions on a fake member and a real one (tried in random order) until the fake one
    has been tried first: every session ends up on the real member, working."""
    async with FakeMember(answer).running() as fake:
        with trio.fail_after(60):
            while not fake.contacted:
                async with Session(f"{fake.address},{zk_hosts}", chroot=chroot,
                                   session_timeout=4.0) as s:
                    await s.create("/ok", b"", ephemeral=True)
                    assert s.server is not None
                    assert f"{s.server[0]}:{s.server[1]}" != fake.address
                    assert await s.exists("/ok") is not None


# ------------------------------------------------------------------------------ smaller


async def test_a_loop_blocked_under_the_read_timeout_keeps_its_connection(
    zk_hosts: str, chroot: str
) -> None:
    """Blocked for 0.8 read timeouts right after a reply, when the last proof is oldest at
    the block's end: the connection stays (the server was not silent while we waited)."""
    async with Session(zk_hosts, chroot=chroot, session_timeout=1.5) as s:
        states: list[SessionState] = []
        async with trio.open_nursery() as nursery:

            async def watch_states() -> None:
                async for change in s.states():
                    states.append(change.state)

            nursery.start_soon(watch_states)
            for lead in (0.05, 0.25, 0.45):
                await s.exists("/")
                await trio.sleep(s.read_timeout * lead)
                time.sleep(s.read_timeout * 0.8)  # the whole loop is stuck, not waiting
                await s.exists("/")
            nursery.cancel_scope.cancel()
        assert s._liveness.dropped_connections == 0
    assert SessionState.SUSPENDED not in states, states


async def test_one_callback_watching_two_ways_is_called_once(session: Session) -> None:
    await session.create("/both", b"")
    events: list[WatchedEvent] = []
    await session.get("/both", watch=events.append)
    await session.children("/both", watch=events.append)
    await session.delete("/both")
    await session.exists("/")  # the event comes before this reply
    assert [(e.type, e.path) for e in events] == [(EventType.DELETED, "/both")]


async def test_the_handshake_timeout_follows_the_negotiated_session_timeout(
    zk_hosts: str, chroot: str
) -> None:
    """Asked for 100 s, granted less: a member then has the granted timeout (split among
    the members) to answer a handshake, not the one asked for."""
    async with Session(f"{zk_hosts},{zk_hosts}", chroot=chroot, session_timeout=100.0) as s:
        connection = s._connection
        assert connection is not None
        granted = connection.negotiated_timeout
        assert granted is not None and granted < 100.0
        assert connection._handshake_timeout() == pytest.approx(granted / 2)


async def test_none_events_say_why_watches_ended(zk_hosts: str, chroot: str) -> None:
    events: list[WatchedEvent] = []
    fired = trio.Event()

    def watch(event: WatchedEvent) -> None:
        events.append(event)
        fired.set()

    async with Session(zk_hosts, chroot=chroot, session_timeout=2.0) as s:
        await s.create("/w", b"")
        await s.get("/w", watch=watch)
        await expire_session(s)
        with trio.fail_after(20):
            await fired.wait()
    assert [(e.type, e.state) for e in events] == [(EventType.NONE, KeeperState.EXPIRED_SESSION)]
