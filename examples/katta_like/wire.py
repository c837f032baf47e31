"""The search node's query protocol: typed messages in length-prefixed msgpack frames over
persistent TCP connections (trio streams), encoded by :mod:`framework.records`.

Frame layout (both directions)::

    +---------+----------------------+-------------------------------+
    | version | length (uint32, BE)  | body: one msgpack map          |
    | 1 byte  | 4 bytes              | ``length`` bytes               |
    +---------+----------------------+-------------------------------+

A client sends :class:`Call` frames (an ``id`` of its choosing, a :class:`Kind`, a
:class:`ShardRequest`) and may send more before the first is answered (pipelining); the
node answers each with an :class:`Answer` frame carrying the same ``id``, in the order the
calls came:

* ``Kind.STATS``: ``reply`` is a :class:`StatsReply`; ``Kind.SEARCH``: a
  :class:`SearchReply` - one answer per shard the node serves now, and for each other shard
  asked, in ``refused``, why not.  A search answer holds the shard's match count and those
  of its hits among the best ``top`` of all the shards answered in that reply
  (:func:`~examples.katta_like.searcher.search_shards`): merging the replies gives the
  whole index's best ``top``;
* a call that is not one (an unknown kind, a missing or mistyped field) or a query that is
  not valid syntax: ``error`` (one line) instead of ``reply``; the connection stays open.

A frame with another version, longer than :data:`MAX_FRAME`, whose body is not a msgpack
map with an integer ``id``, or cut short by the peer closing: :class:`ProtocolError`, and
the node closes that connection (its calls cannot be answered), every other one unaffected.

TLS (links across hosts): with ``$KATTA_TLS_CA`` / ``$KATTA_TLS_CERT`` / ``$KATTA_TLS_KEY``
(:class:`framework.LinkTls`, prefix ``KATTA``) nodes accept only TLS and clients verify a
node's certificate against the CA and the address the node advertises; with
``$KATTA_TLS_MUTUAL=1`` a node refuses a client without a certificate the CA signed (the
call fails with :class:`~examples.katta_like.links.LinkFailed`).  Frames are unchanged
inside TLS.
"""

from __future__ import annotations

import enum
import ssl
import struct
from functools import cache
from typing import Any

import attrs
import msgpack
import trio

from examples.katta_like.store import GlobalStats, ShardResult, ShardStats
from framework import LinkTls, records
from framework.errors import FrameworkError

#: The frame format's version (the first byte of every frame).
VERSION = 1
#: The largest frame body either end accepts, bytes.
MAX_FRAME = 16 << 20
_HEADER = struct.Struct(">BI")
#: Bytes asked of the stream per read.
_READ_SIZE = 1 << 16


class ProtocolError(FrameworkError):
    """The bytes on a connection are not frames of this protocol (see the module docstring):
    the connection cannot be used any more."""


class Kind(enum.Enum):
    """What a call asks."""

    STATS = "stats"  # each shard's term statistics of the query
    SEARCH = "search"  # each shard's hits, scored with the request's global statistics


@attrs.frozen
class ShardRequest:
    """A query for some shards of one index; ``top`` and ``stats`` matter to a search only
    (``stats``: score with the whole index's statistics instead of the shard's)."""

    index: str
    shards: tuple[int, ...]
    query: str
    top: int = 10
    stats: GlobalStats | None = None


@attrs.frozen
class StatsReply:
    """``Kind.STATS``: shard -> its statistics; shard -> why this node did not answer it."""

    shards: dict[int, ShardStats] = attrs.Factory(dict)
    refused: dict[int, str] = attrs.Factory(dict)


@attrs.frozen
class SearchReply:
    """``Kind.SEARCH``: shard -> its answer (its count, its hits among the best ``top`` of
    the reply's shards); shard -> why this node did not answer it."""

    shards: dict[int, ShardResult] = attrs.Factory(dict)
    refused: dict[int, str] = attrs.Factory(dict)


@attrs.frozen
class ErrorReply:
    """A call the node could not take (bad request or query syntax)."""

    error: str


@attrs.frozen
class Call:
    """A client's frame: call ``id`` (echoed in its :class:`Answer`) asks ``kind`` of
    ``request``."""

    id: int
    kind: Kind
    request: ShardRequest


@attrs.frozen
class Answer:
    """A node's frame: the answer to call ``id`` - ``reply`` (a :class:`StatsReply` or
    :class:`SearchReply` as plain values: the caller knows which it asked for) or
    ``error``."""

    id: int
    reply: Any = None
    error: str | None = None


#: The reply class of each kind of call.
REPLIES: dict[Kind, type[StatsReply] | type[SearchReply]] = {
    Kind.STATS: StatsReply, Kind.SEARCH: SearchReply}


def frame(message: Any) -> bytes:
    """``message`` (a :class:`Call` or :class:`Answer`) as one frame."""
    body = msgpack.packb(records.unstructure(message))
    return _HEADER.pack(VERSION, len(body)) + body


def unpack(body: bytes) -> dict[str, Any]:
    """A frame's body as a map with an integer ``id``; :class:`ProtocolError` if it is
    not one."""
    try:
        value = msgpack.unpackb(body, strict_map_key=False)
    except (ValueError, msgpack.UnpackException) as exc:
        raise ProtocolError(f"a frame that is not msgpack ({exc})") from None
    if not isinstance(value, dict) or not isinstance(value.get("id"), int):
        raise ProtocolError("a frame that is not a map with an integer id")
    return value


class FrameReader:
    """Reads frames' bodies from ``stream``, one after the other (a single reader)."""

    def __init__(self, stream: trio.abc.ReceiveStream) -> None:
        self._stream = stream
        self._buffer = bytearray()

    async def next(self) -> bytes | None:
        """The next frame's body, or ``None`` if the stream ended between frames;
        :class:`ProtocolError` for a frame that is not one or is cut short (trio's
        errors of the stream itself pass through)."""
        buffer = self._buffer
        while True:
            if len(buffer) >= _HEADER.size:
                version, length = _HEADER.unpack_from(buffer)
                if version != VERSION:
                    raise ProtocolError(f"a frame of version {version}, not {VERSION}")
                if length > MAX_FRAME:
                    raise ProtocolError(f"a frame of {length} bytes (at most {MAX_FRAME})")
                end = _HEADER.size + length
                if len(buffer) >= end:
                    body = bytes(buffer[_HEADER.size:end])
                    del buffer[:end]
                    return body
            data = await self._stream.receive_some(_READ_SIZE)
            if not data:
                if buffer:
                    raise ProtocolError(f"the peer closed mid-frame ({len(buffer)} bytes)")
                return None
            buffer += data


#: The prefix of the TLS variables (``KATTA_TLS_CA``, ...: :class:`framework.LinkTls`).
TLS_PREFIX = "KATTA"

#: The default of a ``tls`` argument: the settings of ``$KATTA_TLS*``.
FROM_ENV: Any = object()


@cache
def link_tls() -> LinkTls | None:
    """This process's TLS settings from ``$KATTA_TLS*`` (``None``: plain TCP), read once; a
    setting that cannot work is a one-line :class:`~framework.errors.ConfigurationError`."""
    return LinkTls.from_env(TLS_PREFIX)


@cache
def client_context() -> ssl.SSLContext | None:
    """The client TLS context of this process (``None``: plain TCP)."""
    tls = link_tls()
    return None if tls is None else tls.client_context()
