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
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import attrs

from framework import errors
from framework.primitives.queue.view import is_bucket
from framework.zk import Session, gather

__all__ = ["QueueCounts", "queue_counts"]


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
