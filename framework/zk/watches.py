"""Watches as pull iterators of *states*.

Each step reads the node and re-arms its watch in the same request, so no change can slip in
between a notification and the next read.  A burst of changes while the consumer is busy
collapses into the latest state; a state is yielded only when it differs from the last one
yielded (by ``czxid``/``mzxid`` for data, ``czxid``/``pzxid``/``cversion`` for children).

A dropped connection keeps the watches (the session sets them again on the next
connection, and the server fires those whose node changed meanwhile).  When the session
expires every watch fires with a NONE event and is forgotten; the iterator then waits for
the connection and reads again, so a change made meanwhile is still seen.  Iterators never
end on their own; cancel them or ``break``.
"""

from __future__ import annotations

from typing import AsyncIterator

import attrs
import trio

from framework import errors
from framework.zk.session import Session, Stat


@attrs.frozen
class DataSnapshot:
    """A node's data at one moment; ``stat is None`` when the node does not exist."""

    path: str
    data: bytes | None
    stat: Stat | None

    @property
    def exists(self) -> bool:
        return self.stat is not None


@attrs.frozen
class ChildrenSnapshot:
    """A node's children (sorted) at one moment; ``stat is None`` when the node is missing."""

    path: str
    children: tuple[str, ...]
    stat: Stat | None

    @property
    def exists(self) -> bool:
        return self.stat is not None


async def _read_data(session: Session, path: str, event: trio.Event) -> DataSnapshot:
    while True:
        try:
            data, stat = await session.get(path, watch=session.waker(event))
            return DataSnapshot(path, data, stat)
        except errors.NoNodeError:
            if await session.exists(path, watch=session.waker(event)) is None:
                return DataSnapshot(path, None, None)
            # created between the two reads: read it again


async def _read_children(session: Session, path: str, event: trio.Event) -> ChildrenSnapshot:
    while True:
        try:
            kids, stat = await session.children_stat(path, watch=session.waker(event))
            return ChildrenSnapshot(path, tuple(sorted(kids)), stat)
        except errors.NoNodeError:
            if await session.exists(path, watch=session.waker(event)) is None:
                return ChildrenSnapshot(path, (), None)


async def watch_data(session: Session, path: str) -> AsyncIterator[DataSnapshot]:
    """Yield the node's current state, then each later distinct state (see module doc)."""
    last: object = object()
    while True:
        fired = trio.Event()
        try:
            snap = await _read_data(session, path, fired)
        except (errors.ConnectionLossError, errors.SessionExpiredError):
            await session.wait_connected()
            continue
        key = (snap.stat.czxid, snap.stat.mzxid) if snap.stat else None
        if key != last:
            last = key
            yield snap
        await fired.wait()


async def watch_children(session: Session, path: str) -> AsyncIterator[ChildrenSnapshot]:
    """Yield the node's current children, then each later distinct set (see module doc)."""
    last: object = object()
    while True:
        fired = trio.Event()
        try:
            snap = await _read_children(session, path, fired)
        except (errors.ConnectionLossError, errors.SessionExpiredError):
            await session.wait_connected()
            continue
        key = (snap.stat.czxid, snap.stat.pzxid, snap.stat.cversion) if snap.stat else None
        if key != last:
            last = key
            yield snap
        await fired.wait()


async def _exists(session: Session, path: str, fired: trio.Event) -> Stat | None:
    """``exists`` with a watch that sets ``fired``, asked again after a connection loss."""
    while True:
        try:
            return await session.exists(path, watch=session.waker(fired))
        except (errors.ConnectionLossError, errors.SessionExpiredError):
            await session.wait_connected()


async def wait_gone(session: Session, path: str) -> None:
    """Return once ``path`` does not exist (one watch, no polling)."""
    while True:
        fired = trio.Event()
        if await _exists(session, path, fired) is None:
            return
        await fired.wait()


async def wait_created(session: Session, path: str) -> None:
    """Return once ``path`` exists, or once it was created (or deleted) since the call
    (one watch, no polling).  It may be gone again: the caller's next read tells, which
    saves :func:`wait_exists`' second look when the caller reads the node anyway."""
    fired = trio.Event()
    if await _exists(session, path, fired) is None:
        await fired.wait()


async def wait_exists(session: Session, path: str) -> Stat:
    """Return the stat of ``path`` once it exists (one watch, no polling)."""
    while True:
        fired = trio.Event()
        stat = await _exists(session, path, fired)
        if stat is not None:
            return stat
        await fired.wait()
