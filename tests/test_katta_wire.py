"""The Katta query protocol end to end, without ZooKeeper: a search node's connection
handler (:meth:`SearchNode.serve_connection`) on a real TCP listener and a client's
:class:`NodeLinks` - pipelined calls on one connection, a cancelled call that leaves the
connection usable, a node gone (every call waiting on it fails at once, the next call opens a
new connection), bytes that are not frames, a call that fails on the node."""

from __future__ import annotations

import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest
import trio

from examples.katta_like.links import LinkFailed, NodeLinks
from examples.katta_like.node import SearchNode
from examples.katta_like.wire import (
    VERSION,
    FrameReader,
    Kind,
    SearchReply,
    ShardRequest,
    StatsReply,
)
from framework import records

TIMEOUT = 10


class Counting(SearchNode):
    """A node that serves nothing, counts its calls and can be held before answering."""

    def __init__(self) -> None:
        super().__init__(name="n0")
        self.calls = 0
        self.connections = 0
        self.hold = trio.Event()
        self.hold.set()

    async def serve_connection(self, stream: trio.SocketStream) -> None:
        self.connections += 1
        await self.hold.wait()
        await super().serve_connection(stream)

    def _answer(self, kind: Kind, request: ShardRequest
                ) -> StatsReply | SearchReply:
        self.calls += 1
        return SearchReply({}, {s: f"not {request.query}" for s in request.shards})


@asynccontextmanager
async def served(handler: Callable[[trio.SocketStream], Awaitable[None]]
                 ) -> AsyncIterator[tuple[str, trio.CancelScope]]:
    """``handler`` on a TCP listener: its address, and a scope that ends the listener and
    every connection when cancelled."""
    scope = trio.CancelScope()

    async def serve(task_status: trio.TaskStatus[list[trio.SocketListener]]) -> None:
        with scope:
            await trio.serve_tcp(handler, 0, host="127.0.0.1", task_status=task_status)

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(serve)
        host, port = listeners[0].socket.getsockname()[:2]
        yield f"{host}:{port}", scope
        scope.cancel()


async def mute(stream: trio.SocketStream) -> None:
    """A node frozen mid-answer: it reads the calls and never answers."""
    async with stream:
        while await stream.receive_some():
            pass


def reply(answer: object) -> SearchReply:
    return records.structure(answer.reply, SearchReply)  # type: ignore[attr-defined]


async def test_pipelined_calls_share_one_connection() -> None:
    node = Counting()
    with trio.fail_after(TIMEOUT):
        async with served(node.serve_connection) as (address, _), trio.open_nursery() as nursery:
            links = NodeLinks(nursery)
            got: dict[int, SearchReply] = {}

            async def ask(n: int) -> None:
                answer = await links.call(address, Kind.SEARCH,
                                          ShardRequest("ix", (n,), f"q{n}"))
                got[n] = reply(answer)

            async with trio.open_nursery() as calls:
                for n in range(20):
                    calls.start_soon(ask, n)
            assert got == {n: SearchReply({}, {n: f"not q{n}"}) for n in range(20)}
            assert node.connections == 1 and node.calls == 20
            links.close()
            nursery.cancel_scope.cancel()


async def test_a_cancelled_call_leaves_the_connection_usable() -> None:
    node = Counting()
    with trio.fail_after(TIMEOUT):
        async with served(node.serve_connection) as (address, _), trio.open_nursery() as nursery:
            links = NodeLinks(nursery)
            await links.call(address, Kind.SEARCH, ShardRequest("ix", (0,), "a"))
            node.hold = trio.Event()  # the next connection would wait: none is opened
            for n in range(5):
                with trio.move_on_after(0):  # cancelled before or after it is sent
                    await links.call(address, Kind.SEARCH, ShardRequest("ix", (n,), "x"))
            answer = await links.call(address, Kind.SEARCH, ShardRequest("ix", (7,), "b"))
            assert reply(answer) == SearchReply({}, {7: "not b"})
            assert node.connections == 1
            links.close()
            nursery.cancel_scope.cancel()


async def test_a_node_gone_fails_its_calls_at_once_and_the_next_call_reconnects() -> None:
    node = Counting()
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            links = NodeLinks(nursery)
            async with served(mute) as (address, scope):
                failures: list[Exception] = []

                async def waiting() -> None:
                    with pytest.raises(LinkFailed) as caught:
                        await links.call(address, Kind.STATS, ShardRequest("ix", (1,), "b"))
                    failures.append(caught.value)

                async with trio.open_nursery() as calls:
                    calls.start_soon(waiting)
                    await trio.testing.wait_all_tasks_blocked()
                    scope.cancel()  # the listener and its connections go
            assert len(failures) == 1 and address in str(failures[0])
            with pytest.raises(LinkFailed, match="cannot connect"):
                await links.call(address, Kind.STATS, ShardRequest("ix", (1,), "b"))
            async with served(node.serve_connection) as (again, _):
                answer = await links.call(again, Kind.SEARCH, ShardRequest("ix", (2,), "c"))
                assert reply(answer) == SearchReply({}, {2: "not c"})
            links.close()
            nursery.cancel_scope.cancel()


@pytest.mark.parametrize("garbage", [
    struct.pack(">BI", VERSION + 1, 1) + b"\x80",  # another version
    struct.pack(">BI", VERSION, 1 << 30),  # too long
    struct.pack(">BI", VERSION, 1) + b"\xc1",  # not msgpack
    struct.pack(">BI", VERSION, 1) + b"\x80",  # a map without an id
])
async def test_bytes_that_are_not_frames_close_the_connection(
        garbage: bytes, captured_logs: list[dict[str, object]]) -> None:
    node = Counting()
    with trio.fail_after(TIMEOUT):
        async with served(node.serve_connection) as (address, _):
            host, _, port = address.rpartition(":")
            stream = await trio.open_tcp_stream(host, int(port))
            await stream.send_all(garbage)
            assert await FrameReader(stream).next() is None  # closed, nothing answered
            await stream.aclose()
    assert [e["event"] for e in captured_logs] == ["node.bad_frame"]


class Failing(Counting):
    """A node whose search fails unexpectedly on the query ``boom``."""

    def _answer(self, kind: Kind, request: ShardRequest) -> StatsReply | SearchReply:
        if request.query == "boom":
            raise RuntimeError("boom")
        return super()._answer(kind, request)


async def test_a_call_that_fails_on_the_node_closes_its_connection_only(
        captured_logs: list[dict[str, object]]) -> None:
    """The client sees the connection fail (and asks another replica); the node logs it
    and answers the next connection."""
    node = Failing()
    with trio.fail_after(TIMEOUT):
        async with served(node.serve_connection) as (address, _), \
                trio.open_nursery() as nursery:
            links = NodeLinks(nursery)
            with pytest.raises(LinkFailed):
                await links.call(address, Kind.SEARCH, ShardRequest("ix", (0,), "boom"))
            answer = await links.call(address, Kind.SEARCH, ShardRequest("ix", (1,), "ok"))
            assert reply(answer) == SearchReply({}, {1: "not ok"})
            assert node.connections == 2
            links.close()
            nursery.cancel_scope.cancel()
    assert "node.call_failed" in [e["event"] for e in captured_logs]
