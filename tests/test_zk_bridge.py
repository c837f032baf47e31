"""The bridge's own parts: the connection thread's ``select`` and the request fast path."""

from __future__ import annotations

import socket

import pytest
import trio

from framework import Session
from framework.zk.bridge import poll_select


def test_poll_select_reports_what_select_would() -> None:
    a, b = socket.socketpair()
    try:
        assert poll_select([a], [], [], 0) == ([], [], [])
        assert poll_select([a], [a], [], 0) == ([], [a], [])
        b.send(b"x")
        assert poll_select([a, b], [], [], 0.5) == ([a], [], [])
        assert poll_select([a.fileno()], [], [], None) == ([a.fileno()], [], [])
        b.close()  # the peer hung up: still readable, so the reader sees the end
        a.recv(1)
        assert poll_select([a], [], [], 0.5)[0] == [a]
    finally:
        a.close()
        b.close()
    with pytest.raises(ValueError):
        poll_select([a], [], [], 0)  # a closed socket has no descriptor
    with pytest.raises(ValueError):
        poll_select([], [], [], -1)


async def test_chroot_paths_through_the_fast_path(session: Session) -> None:
    """Paths go to the server under the chroot and come back without it."""
    assert session.chroot
    assert (await session.exists("/")) is not None
    node = await session.create("/seq-", b"", sequence=True, ephemeral=True)
    assert node.startswith("/seq-") and len(node) == len("/seq-") + 10
    assert await session.children("/") == [node[1:]]
    await session.sync("/")
    await session.ensure_path("/x/y/z")
    assert sorted(await session.children("/")) == sorted([node[1:], "x"])


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
    and the session keeps answering."""
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
