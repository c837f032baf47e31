"""The broker's wire protocol: msgpack frames over TCP (trio streams).

Frame layout (every direction, every message)::

    +---------+----------------------+-------------------------------+
    | version | length (uint32, BE)  | body: one msgpack map          |
    | 1 byte  | 4 bytes              | ``length`` bytes               |
    +---------+----------------------+-------------------------------+

``version`` is :data:`VERSION`; ``length`` is at most :data:`MAX_FRAME` bytes.  A peer that
receives a frame with another version, a length above the maximum or a body that is not a
msgpack map answers with one ``error`` frame (``code`` = ``bad_version``, ``too_large`` or
``bad_frame``) and closes *that* connection; every other connection is unaffected.  A frame cut
short by the peer closing its sending side (a truncated frame) is answered the same way
(``bad_frame``, naming how many bytes arrived): a peer that only half-closed still reads why.

Requests carry ``op`` and a client-chosen ``id`` echoed in the reply:

* ``produce`` {topic, producer, seq, msgs: [bytes]} -> {ok, end}: ``msgs[i]`` has sequence
  number ``seq + i`` for that producer; the reply comes once every message is on the primary's
  log *and* on the in-sync backup's (or, for a topic in ``one_copy`` mode with no in-sync
  backup, on the primary alone).  Messages whose sequence number the topic already holds are
  not appended again (an idempotent retry).
* ``fetch`` {topic, epoch, offset, server, copy} -> {start, records, end, epoch, hw, in_sync}:
  replication (the backup pulls; ``offset`` also acknowledges everything before it; ``copy``
  is a token the backup draws whenever it starts its copy of the log afresh; ``hw`` is the
  primary's high watermark; ``in_sync`` tells the backup whether the primary counts this
  copy).  Refused with ``stale_epoch`` unless ``epoch`` is the primary's own, and with
  ``stale_copy`` for a copy that a newer copy from the same server superseded.
* ``subscribe`` {topic, offset} -> a stream of {op: "msgs", start, records} frames with the
  records from ``offset`` up to the high watermark, until an ``error`` frame or the close.

Deadlines: every link has TCP keepalive (:func:`keep_alive`: a peer whose machine or network
went away is noticed in about :data:`KEEPALIVE_IDLE` + 3 x :data:`KEEPALIVE_INTERVAL` seconds
even on an idle link), a frame that has begun must be complete within :data:`FRAME_DEADLINE`
(else :class:`LinkTimeout`), and a reader may bound the silence before the next frame
(``read(idle=...)``: the replication links use the lag limit on both ends).  A fetch from a
server that is not in the topic's placement is refused with ``not_placed``.

Authenticated frames (links between servers): with a shared secret (``$BROKER_SECRET``, the
same on every server; :func:`link_secret`), a server signs what it sends on a replication
link: version :data:`SIGNED_VERSION`, and the body is followed by a 32-byte keyed BLAKE2b tag
(a MAC from the standard library's ``hashlib``) over the header and the body.  A reader
holding the secret checks the tag (a bad one: ``bad_mac``, the connection is closed); a
server with a secret accepts a ``fetch`` only in a signed frame (else ``unauthenticated``) and
answers a signed request with signed frames.  Clients (produce, subscribe) need no secret.
A signed frame proves who sent it, not that what it says is true: a fetch claiming a newer
epoch is still checked against ZooKeeper before the primary's term ends.

A record is ``[producer, seq, payload]``.  Error replies are {id, error: code, message}.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import os
import socket
import struct
from typing import Any

import msgpack
import trio

#: Protocol version carried in every frame's first byte.
VERSION = 1

#: The version byte of a signed frame (body followed by a MAC, see the module doc).
SIGNED_VERSION = 2

#: Bytes of a signed frame's MAC.
MAC_SIZE = 32

#: The environment variable holding the servers' shared secret.
SECRET_ENV = "BROKER_SECRET"

#: Largest frame body accepted (bytes).  A produce batch must fit in one frame.
MAX_FRAME = 4 * 1024 * 1024

#: Seconds within which a frame that has begun to arrive must be complete.
FRAME_DEADLINE = 10.0

#: After a read deadline passes, how long a reader still looks for a frame already sent.
SECOND_LOOK = 0.05

#: TCP keepalive: first probe after this many idle seconds, then one per interval, 3 probes.
KEEPALIVE_IDLE = 2
KEEPALIVE_INTERVAL = 1

#: Largest single message payload a server accepts (bytes).
MAX_MESSAGE = 1024 * 1024

_HEADER = struct.Struct(">BI")

#: Error codes a server may answer with.
ERROR_CODES = frozenset({
    "bad_version", "bad_frame", "too_large", "unknown_topic", "not_primary", "stale_epoch",
    "stale_copy", "no_in_sync_backup", "bad_request", "shutting_down", "not_placed",
    "bad_mac", "unauthenticated",
})


class ProtocolError(Exception):
    """A frame that breaks the protocol; ``code`` is the error code sent to the peer."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class PeerClosed(Exception):
    """The peer closed the connection (possibly in the middle of a frame)."""


class LinkTimeout(PeerClosed):
    """The peer stayed silent past a read deadline (the link counts as gone: close it)."""


def keep_alive(stream: trio.SocketStream) -> None:
    """Turn on TCP keepalive (see the module doc) and disable Nagle on ``stream``."""
    stream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    stream.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", KEEPALIVE_IDLE), ("TCP_KEEPINTVL", KEEPALIVE_INTERVAL),
                        ("TCP_KEEPCNT", 3)):
        option = getattr(socket, name, None)
        if option is not None:  # Linux; other systems keep their defaults
            stream.setsockopt(socket.IPPROTO_TCP, option, value)


def link_secret() -> bytes | None:
    """The servers' shared secret from ``$BROKER_SECRET`` (``None`` when unset or empty)."""
    value = os.environ.get(SECRET_ENV, "")
    return value.encode() if value else None


def _mac(secret: bytes, data: bytes) -> bytes:
    return hashlib.blake2b(data, key=secret[:64], digest_size=MAC_SIZE).digest()


def encode(body: dict[str, Any], secret: bytes | None = None) -> bytes:
    """One frame holding ``body``, signed with ``secret`` if given; raises
    :class:`ProtocolError` (``too_large``) if too big."""
    payload = msgpack.packb(body, use_bin_type=True)
    if len(payload) > MAX_FRAME:
        raise ProtocolError("too_large", f"frame of {len(payload)} bytes exceeds {MAX_FRAME}")
    if secret is None:
        return _HEADER.pack(VERSION, len(payload)) + payload
    signed = _HEADER.pack(SIGNED_VERSION, len(payload) + MAC_SIZE) + payload
    return signed + _mac(secret, signed)


def error_frame(code: str, message: str, request_id: Any = None) -> bytes:
    return encode({"id": request_id, "error": code, "message": message})


class FrameReader:
    """Reads whole frames from a trio stream, buffering partial reads."""

    def __init__(self, stream: trio.abc.ReceiveStream, secret: bytes | None = None) -> None:
        self._stream = stream
        self._buffer = bytearray()
        self._secret = secret
        #: whether the last frame read was signed with our secret (a signed frame is read
        #: unchecked, as not authenticated, by a reader that has no secret)
        self.authenticated = False

    async def _fill(self, size: int) -> None:
        while len(self._buffer) < size:
            chunk = await self._stream.receive_some(65536)
            if not chunk:
                if self._buffer:
                    raise ProtocolError("bad_frame", f"truncated frame: the connection closed "
                                                     f"after {len(self._buffer)} of {size} bytes")
                raise PeerClosed("connection closed")
            self._buffer += chunk

    async def read(self, idle: float | None = None) -> dict[str, Any]:
        """The next frame's body; :class:`ProtocolError` for a bad or truncated frame,
        :class:`PeerClosed` at the end of the stream between frames, :class:`LinkTimeout`
        when no frame begins within ``idle`` seconds (``None``: wait for ever) or a begun
        frame is not complete within :data:`FRAME_DEADLINE`."""
        if not self._buffer:
            with trio.move_on_after(math.inf if idle is None else idle):
                await self._fill(1)
            if not self._buffer:
                # a second look: after a pause of this process the peer's frame may be
                # waiting in the kernel although our deadline passed meanwhile
                with trio.move_on_after(SECOND_LOOK):
                    await self._fill(1)
            if not self._buffer:
                raise LinkTimeout(f"no frame from the peer for {idle:g} s")
        with trio.move_on_after(FRAME_DEADLINE):
            return await self._read_frame()
        raise LinkTimeout(f"a frame was not completed within {FRAME_DEADLINE:g} s")

    async def _read_frame(self) -> dict[str, Any]:
        await self._fill(_HEADER.size)
        version, length = _HEADER.unpack_from(self._buffer)
        if version not in (VERSION, SIGNED_VERSION):
            raise ProtocolError("bad_version",
                                f"protocol version {version} not supported (this is {VERSION})")
        if length > MAX_FRAME + (MAC_SIZE if version == SIGNED_VERSION else 0):
            raise ProtocolError("too_large", f"frame of {length} bytes exceeds {MAX_FRAME}")
        if version == SIGNED_VERSION and length < MAC_SIZE:
            raise ProtocolError("bad_frame", "signed frame shorter than its MAC")
        await self._fill(_HEADER.size + length)
        end = _HEADER.size + length
        self.authenticated = False
        if version == SIGNED_VERSION:
            end -= MAC_SIZE
            if self._secret is not None:
                expected = _mac(self._secret, bytes(self._buffer[:end]))
                if not hmac.compare_digest(expected, bytes(self._buffer[end:end + MAC_SIZE])):
                    del self._buffer[:_HEADER.size + length]
                    raise ProtocolError("bad_mac", "frame signed with another secret")
                self.authenticated = True
        raw = bytes(self._buffer[_HEADER.size:end])
        del self._buffer[:_HEADER.size + length]
        try:
            body = msgpack.unpackb(raw, raw=False)
        except Exception as exc:  # msgpack raises several unrelated types
            raise ProtocolError("bad_frame", f"frame body is not msgpack: {exc}") from None
        if not isinstance(body, dict):
            raise ProtocolError("bad_frame", "frame body must be a msgpack map")
        return body


class Connection:
    """A framed, bidirectional connection: serialised sends, one reader."""

    def __init__(self, stream: trio.abc.Stream, secret: bytes | None = None, *,
                 sign: bool = False) -> None:
        self.stream = stream
        self.reader = FrameReader(stream, secret)
        self.secret = secret
        #: sign what we send (a server turns it on once the peer sent a signed frame)
        self.sign = sign and secret is not None
        self._send_lock = trio.Lock()

    async def send(self, body: dict[str, Any]) -> None:
        await self.send_raw(encode(body, self.secret if self.sign else None))

    async def send_raw(self, frame: bytes) -> None:
        async with self._send_lock:
            await self.stream.send_all(frame)

    async def read(self, idle: float | None = None) -> dict[str, Any]:
        return await self.reader.read(idle)

    async def aclose(self) -> None:
        with trio.CancelScope(shield=True):
            await self.stream.aclose()


async def connect(address: str, secret: bytes | None = None) -> Connection:
    """Open a connection to ``host:port``; with ``secret``, every frame sent is signed and
    every frame read must be signed with it (a link between servers)."""
    host, _, port = address.rpartition(":")
    stream = await trio.open_tcp_stream(host, int(port))
    keep_alive(stream)
    return Connection(stream, secret, sign=True)
