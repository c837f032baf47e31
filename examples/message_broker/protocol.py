"""The broker's wire protocol: typed messages in msgpack frames over TCP (trio streams).

Frame layout (every direction, every message)::

    +---------+----------------------+-------------------------------+
    | version | length (uint32, BE)  | body: one msgpack map          |
    | 1 byte  | 4 bytes              | ``length`` bytes               |
    +---------+----------------------+-------------------------------+

``version`` is :data:`VERSION` (:data:`SIGNED_VERSION` for a signed frame, below); ``length``
is at most :data:`MAX_FRAME` bytes.  The body is one message: an attrs class of this module
turned into plain values by :mod:`framework.records` (field names as keys, enums as their
values), with its kind (:class:`Op`) under ``op``.  A record of a log travels as the array
``[producer, seq, payload]`` (:class:`~examples.message_broker.log.Record`).

Messages (``id`` is chosen by the requester and echoed in the reply):

* :class:`Produce` -> :class:`Produced` (the log end): ``msgs[i]`` has sequence number
  ``seq + i`` for that producer; the reply comes once every message is on the primary's log
  *and* on the in-sync backup's (or, for a topic in ``one_copy`` mode with no in-sync backup,
  on the primary alone).  Messages whose sequence number the topic already holds are not
  appended again (an idempotent retry).
* :class:`Fetch` -> :class:`Fetched`: replication (the backup pulls; ``offset`` also
  acknowledges everything before it).  Refused with ``stale_epoch`` unless ``epoch`` is the
  primary's own, with ``stale_copy`` for a copy a newer copy from the same server
  superseded, with ``not_placed`` from a server outside the topic's placement.
* :class:`Subscribe` -> :class:`Subscribed` (the high watermark now), then a stream of
  :class:`Msgs` with the records from ``offset`` up to the high watermark, until an error or
  the close.
* :class:`ErrorReply` answers any request the server refuses (:class:`ErrorCode`).

Errors, as a reader sees them (:meth:`Connection.read`):

* a frame with another version, a length above the maximum, a body that is not a msgpack
  map, or a frame cut short by the peer closing its sending side: :class:`ProtocolError`
  (``bad_version``, ``too_large``, ``bad_frame``, ``bad_mac``); the server answers with one
  :class:`ErrorReply` and closes *that* connection, every other connection is unaffected;
* a whole frame whose body is not one of the messages (an unknown ``op``, a missing or
  mistyped field): :class:`BadMessage` (``bad_request``), naming the request's ``id`` when
  it had one; the frame boundary is intact, so the server answers and keeps the connection;
* the end of the stream between frames: :class:`PeerClosed`; silence past a deadline:
  :class:`LinkTimeout`.

Deadlines: every link has TCP keepalive (:func:`keep_alive`), a frame that has begun must be
complete within :data:`FRAME_DEADLINE`, and a reader may bound the silence before the next
frame (``read(idle=...)``).

Signed frames (links between servers): with a shared secret (``$BROKER_SECRET``, the same on
every server; :func:`link_secret`), a server signs what it sends on a replication link:
version :data:`SIGNED_VERSION`, the body followed by a keyed BLAKE2b tag of
:data:`MAC_SIZE` bytes over header and body.  A reader holding the secret checks the tag
(``bad_mac``, the connection is closed); a server with a secret serves a :class:`Fetch` only
in a signed frame (else ``unauthenticated``) and answers a signed request in kind.  Clients
(produce, subscribe) need no secret.  A signed frame proves who sent it, not that what it
says is true (see :mod:`~examples.message_broker.primary` for the epoch check).

TLS (links across hosts): with ``$BROKER_TLS_CA`` / ``$BROKER_TLS_CERT`` / ``$BROKER_TLS_KEY``
(:class:`framework.LinkTls`, prefix ``BROKER``) every link is TLS: a server wraps each
accepted connection, clients and a backup's replication link verify the server's
certificate against the CA and the advertised address.  ``$BROKER_TLS_MUTUAL=1`` on the
servers refuses a client without a certificate the CA signed (its handshake fails; it sees
:class:`trio.BrokenResourceError`).  The frames above travel unchanged inside TLS; the keyed
tags of the plaintext mode can stay on (they prove a server to a server, TLS proves a
certificate).
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import math
import os
import socket
import ssl
import struct
from functools import cache
from typing import Any, NewType

import attrs
import msgpack
import trio

from examples.message_broker.log import Record, records_from
from framework import LinkTls, records, tls_client_stream

#: Protocol version carried in every frame's first byte.
VERSION = 1

#: The version byte of a signed frame (body followed by a MAC, see the module doc).
SIGNED_VERSION = 2

#: Bytes of a signed frame's MAC.
MAC_SIZE = 32

#: The environment variable holding the servers' shared secret.
SECRET_ENV = "BROKER_SECRET"

#: The prefix of the TLS variables (``BROKER_TLS_CA``, ...: :class:`framework.LinkTls`).
TLS_PREFIX = "BROKER"

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

#: A message's payload on the wire: bytes, and only bytes (never a str or int turned into
#: bytes by the codec).
Payload = NewType("Payload", bytes)


class ErrorCode(enum.Enum):
    """Why a request was refused or a frame rejected (an :class:`ErrorReply`'s ``error``)."""

    BAD_VERSION = "bad_version"
    BAD_FRAME = "bad_frame"
    TOO_LARGE = "too_large"
    BAD_MAC = "bad_mac"
    BAD_REQUEST = "bad_request"
    UNAUTHENTICATED = "unauthenticated"
    UNKNOWN_TOPIC = "unknown_topic"
    NOT_PRIMARY = "not_primary"
    NOT_PLACED = "not_placed"
    STALE_EPOCH = "stale_epoch"
    STALE_COPY = "stale_copy"
    NO_IN_SYNC_BACKUP = "no_in_sync_backup"
    SHUTTING_DOWN = "shutting_down"

    @property
    def permanent(self) -> bool:
        """Whether asking again (another primary, later) cannot help."""
        return self in _PERMANENT


_PERMANENT = frozenset({ErrorCode.TOO_LARGE, ErrorCode.BAD_REQUEST, ErrorCode.BAD_FRAME,
                        ErrorCode.BAD_VERSION, ErrorCode.UNKNOWN_TOPIC})


class Op(enum.Enum):
    """A message's kind: its ``op`` on the wire (a field every message class sets itself,
    never passed to its constructor)."""

    PRODUCE = "produce"
    FETCH = "fetch"
    SUBSCRIBE = "subscribe"
    PRODUCED = "produced"
    FETCHED = "fetched"
    SUBSCRIBED = "subscribed"
    MSGS = "msgs"
    ERROR = "error"


@attrs.frozen
class Produce:
    """Append ``msgs`` (sequence numbers ``seq``, ``seq + 1``, ... of ``producer``)."""

    id: int
    topic: str
    producer: str
    seq: int
    msgs: list[Payload]
    op: Op = attrs.field(default=Op.PRODUCE, init=False)


@attrs.frozen
class Produced:
    """Every message of the :class:`Produce` ``id`` is acknowledged; ``end``: the log end."""

    id: int
    end: int
    op: Op = attrs.field(default=Op.PRODUCED, init=False)


@attrs.frozen
class Fetch:
    """A backup's pull from ``offset`` (acknowledging everything before it) for the primary
    term ``epoch``; ``copy`` names the backup's copy of the log (drawn afresh whenever the
    backup starts its copy from offset 0)."""

    id: int
    topic: str
    epoch: int
    offset: int
    server: str
    copy: str = ""
    op: Op = attrs.field(default=Op.FETCH, init=False)


@attrs.frozen
class Fetched:
    """Records from ``start``; the primary's log ``end`` and high watermark ``hw``, and
    whether the primary counts this copy in sync."""

    id: int
    start: int
    records: list[Record]
    end: int
    epoch: int
    hw: int
    in_sync: bool
    op: Op = attrs.field(default=Op.FETCHED, init=False)


@attrs.frozen
class Subscribe:
    """Stream the topic's acknowledged records from ``offset``."""

    id: int
    topic: str
    offset: int = 0
    op: Op = attrs.field(default=Op.SUBSCRIBE, init=False)


@attrs.frozen
class Subscribed:
    """The subscription is served by the primary of ``epoch``; ``hw``: where a reader that
    does not follow stops."""

    id: int
    epoch: int
    hw: int
    op: Op = attrs.field(default=Op.SUBSCRIBED, init=False)


@attrs.frozen
class Msgs:
    """A batch of a subscription: ``records`` from offset ``start``."""

    id: int
    start: int
    records: list[Record]
    op: Op = attrs.field(default=Op.MSGS, init=False)


@attrs.frozen
class ErrorReply:
    """A refusal: the request ``id`` (``None`` for a frame that had none), the code, a
    sentence for people."""

    id: int | None
    code: ErrorCode = attrs.field(metadata=records.wire("error"))
    message: str = ""
    op: Op = attrs.field(default=Op.ERROR, init=False)


Request = Produce | Fetch | Subscribe
Message = Produce | Produced | Fetch | Fetched | Subscribe | Subscribed | Msgs | ErrorReply

_CLASSES: dict[str, type[Any]] = {cls.__attrs_attrs__.op.default.value: cls  # type: ignore
                                  for cls in (Produce, Produced, Fetch, Fetched, Subscribe,
                                              Subscribed, Msgs, ErrorReply)}


def _records(value: Any, _cls: type) -> list[Record]:
    try:
        return records_from(value)
    except ValueError as exc:
        raise TypeError(str(exc)) from None


def _payload(value: Any, _cls: type) -> bytes:
    if type(value) is not bytes:
        raise TypeError(f"a payload must be bytes, not {type(value).__name__}")
    return value


def _payloads(value: Any, _cls: type) -> list[bytes]:
    if type(value) is not list:
        raise TypeError(f"payloads must be an array, not {type(value).__name__}")
    for payload in value:
        if type(payload) is not bytes:
            raise TypeError(f"a payload must be bytes, not {type(payload).__name__}")
    return value


def _as_is(value: list[Any]) -> list[Any]:
    return value


# the per-record path: a list of arrays, checked by one loop (log.records_from), not one
# converter dispatch per record; payloads are taken as they are (never str or int turned
# into bytes), a produce's list of them checked by one loop too; on the way out both lists
# go to msgpack as they are (a record is a tuple, which msgpack packs as an array)
records.converter.register_structure_hook_func(lambda cls: cls == list[Record], _records)
records.converter.register_structure_hook_func(lambda cls: cls == list[Payload], _payloads)
records.converter.register_structure_hook(Payload, _payload)
records.converter.register_unstructure_hook_func(
    lambda cls: cls in (list[Record], list[Payload]), _as_is)


class ProtocolError(Exception):
    """A frame that breaks the protocol; ``code`` is the error sent to the peer."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code


class BadMessage(ProtocolError):
    """A whole frame whose body is not a message (``bad_request``); ``request_id`` is its
    ``id`` if it had one.  The connection can go on."""

    def __init__(self, message: str, request_id: int | None) -> None:
        super().__init__(ErrorCode.BAD_REQUEST, message)
        self.request_id = request_id


class PeerClosed(Exception):
    """The peer closed the connection (possibly in the middle of a frame)."""


class LinkTimeout(PeerClosed):
    """The peer stayed silent past a read deadline (the link counts as gone: close it)."""


def keep_alive(stream: trio.SocketStream) -> None:
    """Turn on TCP keepalive (a peer whose machine or network went away is noticed in about
    :data:`KEEPALIVE_IDLE` + 3 x :data:`KEEPALIVE_INTERVAL` seconds, even on an idle link)
    and disable Nagle on ``stream``."""
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


@cache
def link_tls() -> LinkTls | None:
    """This process's TLS settings from ``$BROKER_TLS*`` (``None``: plain TCP), read once;
    a setting that cannot work is a one-line :class:`~framework.errors.ConfigurationError`."""
    return LinkTls.from_env(TLS_PREFIX)


@cache
def client_context() -> ssl.SSLContext | None:
    """The client TLS context of this process (``None``: plain TCP)."""
    tls = link_tls()
    return None if tls is None else tls.client_context()


def _mac(secret: bytes, data: bytes) -> bytes:
    return hashlib.blake2b(data, key=secret[:64], digest_size=MAC_SIZE).digest()


def encode(message: Message, secret: bytes | None = None) -> bytes:
    """One frame holding ``message``, signed with ``secret`` if given; raises
    :class:`ProtocolError` (``too_large``) if too big."""
    body = records.unstructure(message)
    body["op"] = message.op.value  # the codec leaves fields the constructor does not take
    payload = msgpack.packb(body, use_bin_type=True)
    if len(payload) > MAX_FRAME:
        raise ProtocolError(ErrorCode.TOO_LARGE,
                            f"frame of {len(payload)} bytes exceeds {MAX_FRAME}")
    if secret is None:
        return _HEADER.pack(VERSION, len(payload)) + payload
    signed = _HEADER.pack(SIGNED_VERSION, len(payload) + MAC_SIZE) + payload
    return signed + _mac(secret, signed)


def decode(body: dict[Any, Any]) -> Message:
    """The message in a frame's body (a msgpack map); :class:`BadMessage` if it is none."""
    request_id = body.get("id")
    request_id = request_id if type(request_id) is int else None
    cls = _CLASSES.get(body.get("op"))  # type: ignore[arg-type]
    if cls is None:
        raise BadMessage(f"unknown op {body.get('op')!r}", request_id)
    try:
        return records.structure(body, cls)  # type: ignore[no-any-return]
    except records.CorruptRecord as exc:
        raise BadMessage(str(exc), request_id) from None


def error_frame(code: ErrorCode, message: str, request_id: int | None = None) -> bytes:
    """An unsigned frame holding an :class:`ErrorReply`."""
    return encode(ErrorReply(request_id, code, message))


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
            # the rest of a frame whose length is known in one call (a 200 KB produce
            # batch or fetch reply is a few reads, not one per 64 KiB)
            chunk = await self._stream.receive_some(min(max(65536, size - len(self._buffer)),
                                                        1 << 20))
            if not chunk:
                if self._buffer:
                    raise ProtocolError(ErrorCode.BAD_FRAME,
                                        f"truncated frame: the connection closed after "
                                        f"{len(self._buffer)} of {size} bytes")
                raise PeerClosed("connection closed")
            self._buffer += chunk

    async def read(self, idle: float | None = None) -> Message:
        """The next frame's message (see the module doc for what it raises):
        :class:`LinkTimeout` when no frame begins within ``idle`` seconds (``None``: wait
        for ever) or a begun frame is not complete within :data:`FRAME_DEADLINE`."""
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
            body = await self._read_frame()
            return decode(body)
        raise LinkTimeout(f"a frame was not completed within {FRAME_DEADLINE:g} s")

    async def _read_frame(self) -> dict[Any, Any]:
        await self._fill(_HEADER.size)
        version, length = _HEADER.unpack_from(self._buffer)
        if version not in (VERSION, SIGNED_VERSION):
            raise ProtocolError(ErrorCode.BAD_VERSION,
                                f"protocol version {version} not supported (this is {VERSION})")
        if length > MAX_FRAME + (MAC_SIZE if version == SIGNED_VERSION else 0):
            raise ProtocolError(ErrorCode.TOO_LARGE,
                                f"frame of {length} bytes exceeds {MAX_FRAME}")
        if version == SIGNED_VERSION and length < MAC_SIZE:
            raise ProtocolError(ErrorCode.BAD_FRAME, "signed frame shorter than its MAC")
        await self._fill(_HEADER.size + length)
        end = _HEADER.size + length
        self.authenticated = False
        if version == SIGNED_VERSION:
            end -= MAC_SIZE
            if self._secret is not None:
                with memoryview(self._buffer) as view:
                    expected = _mac(self._secret, view[:end])
                if not hmac.compare_digest(expected, bytes(self._buffer[end:end + MAC_SIZE])):
                    del self._buffer[:_HEADER.size + length]
                    raise ProtocolError(ErrorCode.BAD_MAC, "frame signed with another secret")
                self.authenticated = True
        try:
            # unpacked in place: the body is not copied out of the buffer first
            with memoryview(self._buffer) as view:
                body = msgpack.unpackb(view[_HEADER.size:end], raw=False)
        except Exception as exc:  # msgpack raises several unrelated types
            raise ProtocolError(ErrorCode.BAD_FRAME,
                                f"frame body is not msgpack: {exc}") from None
        finally:
            del self._buffer[:_HEADER.size + length]
        if not isinstance(body, dict):
            raise ProtocolError(ErrorCode.BAD_FRAME, "frame body must be a msgpack map")
        return body


class Connection:
    """A framed, bidirectional connection: sends serialised (one frame at a time, in the
    order :meth:`send` was called), one reader."""

    def __init__(self, stream: trio.abc.Stream, secret: bytes | None = None, *,
                 sign: bool = False) -> None:
        self.stream = stream
        self.reader = FrameReader(stream, secret)
        self.secret = secret
        #: sign what we send (a server turns it on once the peer sent a signed frame)
        self.sign = sign and secret is not None
        self._send_lock = trio.Lock()

    async def send(self, message: Message) -> None:
        """Send ``message`` (signed if :attr:`sign`); ``trio.BrokenResourceError`` or
        ``OSError`` if the link is gone."""
        await self.send_raw(encode(message, self.secret if self.sign else None))

    async def send_raw(self, frame: bytes) -> None:
        async with self._send_lock:
            await self.stream.send_all(frame)

    async def read(self, idle: float | None = None) -> Message:
        """The next message (:meth:`FrameReader.read`)."""
        return await self.reader.read(idle)

    async def aclose(self) -> None:
        with trio.CancelScope(shield=True):
            try:
                await self.stream.aclose()
            except (trio.BrokenResourceError, OSError):  # a TLS close on a dead link
                pass


#: The default of a ``tls`` argument: the settings of ``$BROKER_TLS*``.
FROM_ENV: Any = object()


async def connect(address: str, secret: bytes | None = None, *,
                  tls: ssl.SSLContext | None = FROM_ENV) -> Connection:
    """Open a connection to ``host:port``; with ``secret``, every frame sent is signed and
    every frame read must be signed with it (a link between servers).  ``tls``: a client
    context, ``None`` for plain TCP; default :func:`client_context` (``$BROKER_TLS*``).  A
    refused TLS handshake raises :class:`trio.BrokenResourceError`."""
    host, _, port = address.rpartition(":")
    context = client_context() if tls is FROM_ENV else tls
    raw = await trio.open_tcp_stream(host.strip("[]"), int(port))
    keep_alive(raw)
    try:
        stream = await tls_client_stream(raw, context, host)
    except BaseException:
        await trio.aclose_forcefully(raw)
        raise
    return Connection(stream, secret, sign=True)
