"""The search node's HTTP/JSON API: its endpoints and messages, encoded by
:mod:`framework.records`.

``POST /stats`` and ``POST /search`` take a :class:`ShardRequest` (an index, some of its
shards, a query) and answer 200 with a :class:`StatsReply` or a :class:`SearchReply`: one
answer per shard the node serves now, and for each other shard asked, in ``refused``, why
not.  A body that is not a request, or a query that is not valid syntax, is answered 400
with an :class:`ErrorReply`; an unknown path 404 with an :class:`ErrorReply`.
"""

from __future__ import annotations

import enum

import attrs

from examples.katta_like.store import GlobalStats, ShardResult, ShardStats


class Endpoint(enum.Enum):
    """The node's two endpoints (their paths)."""

    STATS = "/stats"  # each shard's term statistics of the query
    SEARCH = "/search"  # each shard's hits, scored with the request's global statistics


@attrs.frozen
class ShardRequest:
    """A query for some shards of one index; ``top`` and ``stats`` matter to ``/search``
    only (``stats``: score with the whole index's statistics instead of the shard's)."""

    index: str
    shards: tuple[int, ...]
    query: str
    top: int = 10
    stats: GlobalStats | None = None


@attrs.frozen
class StatsReply:
    """``/stats``: shard -> its statistics; shard -> why this node did not answer it."""

    shards: dict[int, ShardStats] = attrs.Factory(dict)
    refused: dict[int, str] = attrs.Factory(dict)


@attrs.frozen
class SearchReply:
    """``/search``: shard -> its answer; shard -> why this node did not answer it."""

    shards: dict[int, ShardResult] = attrs.Factory(dict)
    refused: dict[int, str] = attrs.Factory(dict)


@attrs.frozen
class ErrorReply:
    """A request the node could not take (400: bad request or query syntax; 404)."""

    error: str


#: The reply class of each endpoint.
REPLIES: dict[Endpoint, type[StatsReply] | type[SearchReply]] = {
    Endpoint.STATS: StatsReply, Endpoint.SEARCH: SearchReply}
