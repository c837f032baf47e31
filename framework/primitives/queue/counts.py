"""The queue's public counts: how many items it holds and how many are claimed, read from
its own layout, so that no caller above the queue knows ``items/``, ``claims/`` or the
bucket names (issue #38).

:func:`queue_counts` reads them once: a listing of ``items/`` (the buckets), one ``exists``
per bucket (its child count) and one of ``claims/`` (unless ``claims=False``), pipelined -
an inspection, not a hot path.  With ``watch`` (a function giving the watch callback of a
path) every bucket (and ``claims/``) is listed instead, each with its watch, so a put, an
ack, a new bucket (a claim, a release) calls one of them: an observer waits on that and
reads again.

A queue that does not exist yet counts as empty (its ``items/`` is then watched for
existence).  SUSPENDED: the reads wait for the connection; LOST: they raise the session's
error.  Counts taken while consumers work are a snapshot of each list at its own moment:
``claimed`` may lag ``queued`` by the requests in flight.

:func:`watch_queue_counts` follows the counts for an observer that shows them (the
dashboard): it yields the counts now and again after each change, keeping one children watch
on ``items/``, on ``claims/`` and on each bucket, and re-reading a list only after its own
watch fired (one callback object per list: the session keeps watch callbacks in a set, so
re-arming never piles them up).  ``throttle`` seconds pass after a change before the lists
are read again, so a burst collapses into one read.  After a lost connection or an expired
session it waits for the connection and reads every list again; other errors are raised.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Callable
from typing import Any

import attrs
import trio

from framework import errors
from framework.primitives.queue.view import is_bucket
from framework.zk import Session, gather

__all__ = ["QueueCounts", "queue_counts", "watch_queue_counts"]


@attrs.frozen
class QueueCounts:
    """``queued``: items in the queue, claimed ones included; ``claimed``: items being
    processed (claimed, not yet acknowledged or released; ``None``: not read); ``buckets``:
    buckets holding them (each ``bucket_size`` items at most)."""

    queued: int
    claimed: int | None
    buckets: int

    @property
    def waiting(self) -> int | None:
        """Items nobody holds now (at most: the two counts are read apart)."""
        return None if self.claimed is None else max(self.queued - self.claimed, 0)


async def queue_counts(session: Session, path: str, *,
                       watch: Callable[[str], Callable[[Any], None]] | None = None,
                       claims: bool = True) -> QueueCounts:
    """The counts of the work queue at ``path`` (see the module doc)."""
    items, claims_root = f"{path}/items", f"{path}/claims"
    try:
        names = await session.children(items, watch=watch(items) if watch else None)
    except errors.NoNodeError:
        if watch is not None and await session.exists(items, watch=watch(items)) is not None:
            watch(items)(None)  # created meanwhile: the observer looks again
        return QueueCounts(0, 0 if claims else None, 0)
    buckets = [f"{items}/{name}" for name in names if is_bucket(name)]
    counts: dict[str, int] = {}

    async def count(node: str) -> None:
        try:
            if watch is not None:
                counts[node] = len(await session.children(node, watch=watch(node)))
                return
            stat = await session.exists(node)
            counts[node] = stat.numChildren if stat else 0
        except errors.NoNodeError:
            counts[node] = 0

    nodes = [*buckets, claims_root] if claims else buckets
    await gather(*[functools.partial(count, node) for node in nodes])
    return QueueCounts(sum(counts[b] for b in buckets),
                       counts[claims_root] if claims else None, len(buckets))


async def watch_queue_counts(session: Session, path: str, *,
                             throttle: float = 0.0) -> AsyncIterator[QueueCounts]:
    """The counts of the work queue at ``path`` now, then after each change (see the module
    doc); ``claimed`` is always read."""
    counts = _WatchedCounts(session, path)
    while True:
        yield await counts.read()
        await counts.changed()
        await trio.sleep(throttle)


class _WatchedCounts:
    """The watched lists of one queue and the counts last read from them."""

    def __init__(self, session: Session, path: str) -> None:
        self.session = session
        self.items, self.claims = f"{path}/items", f"{path}/claims"
        self.buckets: dict[str, int] = {}  # bucket path -> its items, as last listed
        self.claimed = 0
        self.dirty = {self.items, self.claims}  # lists whose watch fired (or never set)
        self.wake = trio.Event()
        self.callbacks: dict[str, Callable[[Any], None]] = {}

    async def read(self) -> QueueCounts:
        """List again every list whose watch fired (re-arming it)."""
        while self.dirty:
            path = self.dirty.pop()
            try:
                names = await self._list(path)
            except (errors.ConnectionLossError, errors.SessionExpiredError):
                self.dirty |= {self.items, self.claims, *self.buckets}
                await self.session.wait_connected()
                continue
            self._note(path, names)
        return QueueCounts(sum(self.buckets.values()), self.claimed, len(self.buckets))

    async def changed(self) -> None:
        """Wait until a watch fires."""
        await self.wake.wait()
        self.wake = trio.Event()

    async def _list(self, path: str) -> list[str]:
        watch = self._callback(path)
        try:
            return await self.session.children(path, watch=watch)
        except errors.NoNodeError:
            if await self.session.exists(path, watch=watch) is not None:
                self.dirty.add(path)  # created meanwhile
            return []

    def _note(self, path: str, names: list[str]) -> None:
        if path == self.items:
            listed = {f"{self.items}/{name}" for name in names if is_bucket(name)}
            for gone in set(self.buckets) - listed:
                del self.buckets[gone]
                self.callbacks.pop(gone, None)
            for new in listed - set(self.buckets):
                self.buckets[new] = 0
                self.dirty.add(new)
        elif path == self.claims:
            self.claimed = len(names)
        elif path in self.buckets:
            self.buckets[path] = len(names)

    def _callback(self, path: str) -> Callable[[Any], None]:
        if path not in self.callbacks:
            def fire(_event: Any, path: str = path) -> None:
                self.dirty.add(path)
                self.wake.set()
            self.callbacks[path] = fire
        return self.callbacks[path]
