"""ZooKeeper's client framing, with kazoo's protocol records.

Every packet is a 4-byte big-endian length and a body.  A request body is the xid, the
operation type and the record's own serialization; a reply body is a :class:`ReplyHeader`
(xid, zxid, error code) and the record's reply.  The handshake is the exception: neither
header, only the ``Connect`` record each way.  kazoo stays the protocol: its records encode
and decode every operation; this module only frames them.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

from kazoo.protocol.serialization import Connect, Create2, ReplyHeader, Watch, write_string

#: xids the server reserves: watch notifications, pings, authentication, watches set again
WATCH_XID = -1
PING_XID = -2
AUTH_XID = -4
SET_WATCHES_XID = -8

#: the most path bytes one SetWatches packet carries (the Java client's bound)
SET_WATCHES_BYTES = 128 * 1024

#: ZooKeeper's own bound on a packet (jute.maxbuffer is 1 MiB by default; replies to a large
#: listing can be bigger, so the client accepts more, as the Java client does)
MAX_PACKET = 64 * 1024 * 1024

_LENGTH = struct.Struct(">i")
_HEADER = struct.Struct(">ii")
_ZXID = struct.Struct(">q")


def request_packet(xid: int, record: Any) -> bytes:
    """The framed packet of ``record`` (a kazoo request record) sent with ``xid``."""
    body = record.serialize()
    return _LENGTH.pack(len(body) + 8) + _HEADER.pack(xid, record.type) + body


class SetWatches:
    """The request that sets a session's watches again on a new connection: the server
    re-registers each and fires at once those whose node changed after ``relative_zxid``
    (kazoo has no record for it; this one follows ZooKeeper's ``SetWatches``).  With
    persistent watches among them it is ZooKeeper 3.6's ``SetWatches2``, which carries
    those two lists as well (persistent watches are re-registered, never fired: what
    happened while disconnected is for their owner to read again)."""

    def __init__(self, relative_zxid: int, data: list[str], exist: list[str],
                 child: list[str], persistent: list[str] | None = None,
                 recursive: list[str] | None = None) -> None:
        self.relative_zxid, self.data, self.exist, self.child = relative_zxid, data, exist, child
        self.persistent, self.recursive = persistent, recursive
        self.type = 101 if persistent is None and recursive is None else 105

    def serialize(self) -> bytes:
        parts = [_ZXID.pack(self.relative_zxid)]
        lists = [self.data, self.exist, self.child]
        if self.type == 105:
            lists += [self.persistent or [], self.recursive or []]
        for paths in lists:
            parts.append(_LENGTH.pack(len(paths)))
            parts.extend(bytes(write_string(path)) for path in paths)
        return b"".join(parts)


def set_watches_packets(relative_zxid: int, data: list[str], exist: list[str],
                        child: list[str], persistent: Sequence[str] = (),
                        recursive: Sequence[str] = ()) -> list[bytes]:
    """The SetWatches packets for these paths, each under :data:`SET_WATCHES_BYTES`
    (``SetWatches2`` packets when there are persistent watches)."""
    two = bool(persistent or recursive)
    packets: list[bytes] = []
    batch: tuple[list[str], ...] = ([], [], [], [], [])
    size = 0

    def flush() -> None:
        extra = (batch[3], batch[4]) if two else ()
        packets.append(request_packet(SET_WATCHES_XID, SetWatches(
            relative_zxid, batch[0], batch[1], batch[2], *extra)))

    for kind, paths in enumerate((data, exist, child, persistent, recursive)):
        for path in paths:
            if size and size + len(path) > SET_WATCHES_BYTES:
                flush()
                batch, size = ([], [], [], [], []), 0
            batch[kind].append(path)
            size += len(path) + 4
    if size:
        flush()
    return packets


#: addWatch modes (ZooKeeper 3.6): the node itself, or the node and every node below it
ADD_WATCH_PERSISTENT, ADD_WATCH_RECURSIVE = 0, 1
#: removeWatches watcher types of the two persistent kinds
REMOVE_PERSISTENT, REMOVE_RECURSIVE = 4, 5


class AddWatch:
    """ZooKeeper 3.6's ``addWatch``: a watch that stays after it fires, on ``path`` alone
    (``ADD_WATCH_PERSISTENT``: created, deleted, data and children changed) or on ``path``
    and every node below it (``ADD_WATCH_RECURSIVE``: created, deleted, data changed).
    kazoo has no record for it; ``watcher`` is the callback the connection registers once
    the server has answered."""

    type = 106

    def __init__(self, path: str, mode: int, watcher: Any) -> None:
        self.path, self.mode, self.watcher = path, mode, watcher

    def serialize(self) -> bytes:
        return bytes(write_string(self.path)) + _LENGTH.pack(self.mode)

    def deserialize(self, _packet: bytes, _offset: int) -> bool:
        return True


class RemoveWatches:
    """``removeWatches`` of one kind of this session's watches on ``path``."""

    type = 18

    def __init__(self, path: str, watcher_type: int) -> None:
        self.path, self.watcher_type = path, watcher_type

    def serialize(self) -> bytes:
        return bytes(write_string(self.path)) + _LENGTH.pack(self.watcher_type)

    def deserialize(self, _packet: bytes, _offset: int) -> bool:
        return True


class MalformedPacket(ValueError):
    """A packet too short or garbled to parse: the connection is unusable (the stream has
    lost its framing or the peer is no ZooKeeper server), never the session's fault."""


def connect_packet(record: Connect) -> bytes:
    """The framed handshake packet (no xid, no type)."""
    body = record.serialize()
    return _LENGTH.pack(len(body)) + bytes(body)


def parse_connect(packet: bytes) -> Connect:
    """The server's handshake reply; :class:`MalformedPacket` if it cannot be one."""
    try:
        reply, _offset = Connect.deserialize(packet, 0)
    except (struct.error, IndexError, TypeError) as exc:
        raise MalformedPacket(f"malformed handshake reply ({len(packet)} bytes): {exc}") from None
    return reply


def parse_header(packet: bytes) -> tuple[ReplyHeader, int]:
    """A reply's header and the offset of the reply record behind it;
    :class:`MalformedPacket` if the packet is shorter than a header."""
    try:
        return ReplyHeader.deserialize(packet, 0)
    except struct.error as exc:
        raise MalformedPacket(f"malformed reply header ({len(packet)} bytes): {exc}") from None


def parse_watch(packet: bytes, offset: int) -> tuple[int, str]:
    """A watch notification's event type and server path (after its header);
    :class:`MalformedPacket` if it cannot be one."""
    try:
        watch, _offset = Watch.deserialize(packet, offset)
    except (struct.error, IndexError, TypeError) as exc:
        raise MalformedPacket(f"malformed watch event ({len(packet)} bytes): {exc}") from None
    if not isinstance(watch.path, str):
        raise MalformedPacket("malformed watch event: no path")
    return watch.type, watch.path


class PacketReader:
    """Splits the bytes of a stream into packets.

    :meth:`feed` takes what the socket gave and returns every packet completed by it (the
    bodies, without their length).  Raises :class:`ValueError` for a length no ZooKeeper
    server sends (the stream is then unusable).
    """

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes | bytearray) -> list[bytes]:
        buffer = self._buffer
        buffer += data
        packets = []
        offset = 0
        end = len(buffer)
        while end - offset >= 4:
            length = _LENGTH.unpack_from(buffer, offset)[0]
            if length < 0 or length > MAX_PACKET:
                raise ValueError(f"bad packet length {length} from the server")
            if end - offset - 4 < length:
                break
            start = offset + 4
            offset = start + length
            packets.append(bytes(buffer[start:offset]))
        del buffer[:offset]
        return packets


class CreateTTL:
    """A create of a node with a time to live (ZooKeeper 3.5.3+, opcode 21; kazoo has no
    record for it).  The request is ``Create``'s fields plus ``ttl`` in milliseconds; the
    reply is ``Create2``'s (the path and the new node's stat), of which the path is kept.
    ``flags`` is ZooKeeper's create mode: 5 (persistent with TTL) or 6 (and sequential)."""

    type = 21

    def __init__(self, path: str, data: bytes, acl: Any, flags: int, ttl: int) -> None:
        self.path, self.data, self.acl, self.flags, self.ttl = path, data, acl, flags, ttl

    def serialize(self) -> bytes:
        body = Create2(self.path, self.data, self.acl, self.flags).serialize()
        return bytes(body) + _ZXID.pack(self.ttl)

    @classmethod
    def deserialize(cls, packet: bytes, offset: int) -> str:
        path, _stat = Create2.deserialize(packet, offset)
        return path
