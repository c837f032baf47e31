"""The ZooKeeper client protocol, driven from trio: one connection at a time for one session.

:class:`Connection` connects to a member of the ensemble (in random order, the next one after
a failure, pausing after each full round), performs the handshake (session id, password,
last zxid seen, requested timeout), sends the digest credentials, and then runs five tasks
on the socket until it drops: a reader, a writer, a heartbeat, a watchdog and a prover.
Requests are kazoo protocol records (:mod:`framework.zk.wire` frames them); a caller waits
for its own reply in its own task, with no thread and no hand-off.

Contract:

* **Order.**  Requests are written in the order they are made and answered in that order
  (ZooKeeper's per-session FIFO); replies are matched to requests by xid.
* **The connection's liveness** (the Java client's rule).  The heartbeat pings after half a
  read timeout (2/3 of the negotiated session timeout) without sending; the watchdog drops
  the connection when the server has been silent for a read timeout while an answer was
  awaited - so a half-open link or a hung server ends in SUSPENDED.  A server that keeps
  answering is never dropped, however long its queue: under a heavy write load replies keep
  coming.  Packets go to the socket in slices of :data:`WRITE_SLICE` bytes, and a ping goes
  ahead of requests not yet written, so it is never stuck behind megabytes.
* **The session's trust** (:mod:`framework.zk.liveness`).  Only replies that went through
  the leader (writes, ``sync``, close, the handshake) prove the session alive, as of the time
  their request was written; the prover sends a ``sync`` when nothing has proven it for a
  third of a read timeout.  A member cut off from the leader answers pings and reads but no
  sync, so the proof stops and ownership scopes end (:mod:`framework.zk.trust`) before the
  leader can expire the session.  The loop itself keeps the session: an event loop blocked
  (or a process paused) sends no sync; the connection is dropped only after a read timeout
  of silence, but scopes end at the trust deadline.
* **SUSPENDED.**  When a connection drops, requests in flight fail with kazoo's
  ``ConnectionLoss`` (their outcome unknown) and the next member is tried with the same
  session.  Requests made while not connected fail at once with ``ConnectionLoss`` (nothing
  was sent).  Watches stay registered: the first packet on the new connection sets them
  again (``SetWatches`` with the last zxid this client saw), and the server fires at once
  each one whose node changed meanwhile, so no change is missed and nothing is read again.
* **LOST.**  A handshake answered "expired" ends the session: every registered watch fires
  once with an ``EventType.NONE`` event and is forgotten (watchers read again once connected,
  see :mod:`framework.zk.watches`), state LOST, then a new session is made on the next
  connection (reported as CONNECTED with another id).  Closing ends watches the same way.
* **Close.**  :meth:`close` sends the close request and waits up to ``grace`` for its answer,
  then ends the connection; requests fail with ``ConnectionClosedError`` from then on.  When
  :meth:`run` returns (after :meth:`close` or :meth:`stop`, connected or not), every request
  in flight has failed with ``ConnectionClosedError`` and every watch has fired once with a
  ``NONE`` event in state ``CLOSED``.
* **Malformed packets** (a short header, handshake or watch event) end the connection like a
  network error: the next member is tried; they never end the session.

State changes are reported synchronously to ``on_state(state, session_id)`` in the trio
thread; watch callbacks and :meth:`send` callbacks run in the trio thread too, and must not
block.
"""

from __future__ import annotations

import collections
import random
import select
import ssl
import time
from typing import Any, Callable, Iterable

import outcome
import trio
from kazoo import exceptions as kz
from kazoo.protocol.serialization import (
    Auth,
    CheckVersion,
    Close,
    CloseInstance,
    Connect,
    Create,
    Create2,
    Delete,
    Exists,
    GetChildren,
    GetChildren2,
    PingInstance,
    Reconfig,
    SetACL,
    SetData,
    Sync,
    Transaction,
)
from kazoo.protocol.states import EVENT_TYPE_MAP, EventType, KeeperState, WatchedEvent

from framework.logs import get_logger
from framework.retry import Backoff
from framework.zk.liveness import PROOF_REFRESH_FRACTION, Liveness
from framework.zk.states import SessionState
from framework.zk.wire import (
    ADD_WATCH_RECURSIVE,
    AUTH_XID,
    PING_XID,
    SET_WATCHES_XID,
    WATCH_XID,
    AddWatch,
    PacketReader,
    connect_packet,
    parse_connect,
    parse_header,
    parse_watch,
    request_packet,
    set_watches_packets,
)

log = get_logger("framework.zk")

StateListener = Callable[[SessionState, "int | None"], None]
WatchCallback = Callable[[WatchedEvent], Any]
ReplyCallback = Callable[[outcome.Outcome[Any]], None]

#: bytes asked of the socket per read
RECEIVE_BYTES = 1 << 18
#: the most bytes handed to the socket in one send (a ping waits behind at most this much)
WRITE_SLICE = 1 << 18
#: the most request bytes written and not yet answered: the server never holds more of this
#: session's work than a few milliseconds' worth, so its replies (and a ping's) keep coming
#: under any load instead of after one fsync of hundreds of megabytes (one request of any
#: size may always go)
UNANSWERED_BYTES = 4 << 20
#: the requests whose replies come through the leader: they prove the session (see
#: :mod:`framework.zk.liveness`); reads and pings do not
LEADER_RECORDS = frozenset({Create, Create2, Delete, SetData, SetACL, CheckVersion,
                            Transaction, Sync, Close, Reconfig})
#: the pause before a new round of members: first (after a round that got an answer), the
#: factor it grows by after each round without one, and its most (seconds)
#: The pause before each new round of connection attempts (the Nth in a row without
#: progress: kazoo's pacing, 0.05 s growing by half up to 1 s, with the framework's jitter).
RECONNECT_BACKOFF = Backoff(0.05, 1.0, factor=1.5)
#: the watch event types that fire data watches, child watches
_CREATED, _DELETED, _CHANGED, _CHILD = 1, 2, 3, 4
_EMPTY_PASSWORD = b"\x00" * 16
_NO_NODE: int = kz.NoNodeError.code  # type: ignore[attr-defined]  # set by kazoo's decorator

#: what ends one connection (others are bugs and end the session's nursery); a malformed
#: packet is a ValueError (framework.zk.wire.MalformedPacket)
_CONNECTION_ERRORS = (OSError, trio.BrokenResourceError, trio.ClosedResourceError,
                      trio.TooSlowError, ssl.SSLError, ValueError, kz.ConnectionDropped)


class _Request:
    """One request in flight: its record, xid, the time it went to the socket (its enqueue
    time until then) and who waits for the reply."""

    __slots__ = ("callback", "record", "sent", "size", "task", "xid")

    def __init__(self, record: Any, xid: int, sent: float, size: int) -> None:
        self.record = record
        self.xid = xid
        self.sent = sent
        self.size = size
        self.task: trio.lowlevel.Task | None = None
        self.callback: ReplyCallback | None = None

    def complete(self, result: outcome.Outcome[Any]) -> None:
        task, callback = self.task, self.callback
        self.task = self.callback = None
        if task is not None:
            trio.lowlevel.reschedule(task, result)
        elif callback is not None:
            try:
                callback(result)
            except Exception:
                log.exception("zk.reply_callback_failed", record=type(self.record).__name__)


class Connection:
    """One session's connection to a ZooKeeper ensemble (see the module doc).

    ``hosts`` is a list of ``(host, port)``; ``session_timeout`` (seconds) is asked of the
    server; ``auth_data`` is kazoo's list of ``(scheme, credential)``; ``ssl_context`` makes
    every connection TLS.  Run :meth:`run` in a nursery; it returns after :meth:`close`.
    """

    def __init__(
        self,
        hosts: list[tuple[str, int]],
        *,
        session_timeout: float,
        liveness: Liveness,
        on_state: StateListener,
        auth_data: Iterable[tuple[str, str]] = (),
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.hosts = hosts
        self.session_timeout = session_timeout
        self.chroot = ""  # stripped from the paths of watch events
        self.session_id: int | None = None  # the session held, connected or not
        self.password = _EMPTY_PASSWORD
        self.last_zxid = 0
        self.connected = False
        self.peer: tuple[str, int] | None = None  # the member of the current connection
        self._liveness = liveness
        self._on_state = on_state
        self._auth_data = list(auth_data)
        self._ssl_context = ssl_context
        self._pending: collections.deque[_Request] = collections.deque()
        #: packets not yet written, each with its request (None: ping, SetWatches, close)
        self._outbox: collections.deque[tuple[bytes, _Request | None]] = collections.deque()
        self._writer_lot = trio.lowlevel.ParkingLot()
        self._xid = 0
        self._last_send = 0.0
        self._ping_sent: float | None = None
        #: since when an answer has been awaited with nothing heard (None: nothing awaited)
        self._waiting_since: float | None = None
        self._unanswered = 0  # request bytes written and not answered
        # watch callbacks by server path: data (a node read), exist (a node found missing),
        # child (a listing); dicts keep one registration per callback, in order
        self._data_watchers: dict[str, dict[WatchCallback, None]] = {}
        self._exist_watchers: dict[str, dict[WatchCallback, None]] = {}
        self._child_watchers: dict[str, dict[WatchCallback, None]] = {}
        # persistent watches (addWatch): on a node, on a node and all below it; they stay
        # after they fire, are set again on a new connection, and are told of it (NONE)
        self._persistent_watchers: dict[str, dict[WatchCallback, None]] = {}
        self._recursive_watchers: dict[str, dict[WatchCallback, None]] = {}
        self._scope: trio.CancelScope | None = None  # the current connection's tasks
        self._attempt: trio.CancelScope | None = None  # the current connection attempt
        self._drop_reason = ""
        self._closing = False
        self._stopped = trio.Event()
        self._shield = trio.CancelScope(shield=True)
        self._failure: str | None = None  # why the session can never connect (auth refused)
        self._negotiated: float | None = None

    # ------------------------------------------------------------------ requests

    async def call(self, record: Any) -> Any:
        """Send ``record`` and return its reply (kazoo's deserialized value).

        Raises kazoo's exception for an error reply, ``ConnectionLoss`` when not connected
        or when the connection drops before the reply, ``ConnectionClosedError`` once
        closing.  Cancelling the wait does not withdraw the request."""
        request = self._enqueue(record)
        request.task = trio.lowlevel.current_task()

        def abort(_raise_cancel: Any) -> trio.lowlevel.Abort:
            request.task = None
            return trio.lowlevel.Abort.SUCCEEDED

        return await trio.lowlevel.wait_task_rescheduled(abort)

    def send(self, record: Any, callback: ReplyCallback) -> None:
        """Send ``record`` now; ``callback(outcome)`` runs in the trio thread with its reply
        (or its failure).  Raises like :meth:`call` when it cannot be sent."""
        self._enqueue(record).callback = callback

    def _enqueue(self, record: Any) -> _Request:
        if self._failure is not None:
            raise kz.AuthFailedError(self._failure)
        if self._closing and record is not CloseInstance:
            raise kz.ConnectionClosedError("Connection has been closed")
        if not self.connected:
            raise kz.ConnectionLoss("not connected to ZooKeeper")
        self._xid = self._xid % 2147483647 + 1
        now = time.monotonic()
        packet = request_packet(self._xid, record)
        request = _Request(record, self._xid, now, len(packet))
        self._pending.append(request)
        self._outbox.append((packet, request))
        self._last_send = now
        self._writer_lot.unpark()
        return request

    # ------------------------------------------------------------------ the loop

    async def run(self) -> None:
        """Keep a connection up (see the module doc) until :meth:`stop`.

        Shielded from its caller's cancellation: a cancelled owner must still be able to
        close the session (a close request that is never written leaves the session's
        ephemeral nodes for a whole session timeout), so only :meth:`stop` ends it."""
        try:
            with self._shield:
                await self._connect_loop()
        finally:
            self._ended()
            self._stopped.set()

    def stop(self) -> None:
        """End :meth:`run` now (after :meth:`close`, or to drop everything); requests and
        watches end as the module doc says."""
        self._closing = True
        self._shield.cancel()

    async def _connect_loop(self) -> None:
        rounds = 0  # rounds in a row without progress
        while not self._closing and self._failure is None:
            members = list(self.hosts)
            random.shuffle(members)
            progress = False
            for host, port in members:
                if self._closing or self._failure is not None:
                    return
                with trio.CancelScope() as self._attempt:
                    progress = await self._connect_once(host, port) or progress
                self._attempt = None
            if self._closing:
                return
            # kazoo's rule: a pause before every new round, the first one short; it also
            # lets a server finish with the old connection (a session being closed or
            # moved) before the same session asks again
            rounds = 1 if progress else rounds + 1
            await RECONNECT_BACKOFF.sleep(rounds)

    async def close(self, grace: float) -> None:
        """Close the session: send the close request, wait up to ``grace`` seconds for the
        answer (then drop the connection: the server expires the session by itself), and
        stop connecting; :meth:`stop` then ends :meth:`run`.  Safe to call twice."""
        if self._closing:
            return
        self._closing = True
        if self.connected:
            with trio.move_on_after(grace):
                try:
                    await self.call(CloseInstance)
                except kz.KazooException:
                    pass
        if self._attempt is not None:  # connected, or in a handshake
            self._attempt.cancel()

    async def wait_stopped(self) -> None:
        """Return once :meth:`run` has returned."""
        await self._stopped.wait()

    @property
    def failure(self) -> str | None:
        """Why this session can never connect (the server refused its credentials)."""
        return self._failure

    async def _connect_once(self, host: str, port: int) -> bool:
        """One connection to ``host:port``, served until it drops; True if the handshake
        got an answer (a connection, or the news that the session expired)."""
        stream: trio.abc.Stream | None = None
        reason = ""
        answered = False
        try:
            with trio.fail_after(self._handshake_timeout()):
                stream = await self._open(host, port)
                started = time.monotonic()
                reader = PacketReader()
                backlog: collections.deque[bytes] = collections.deque()
                await stream.send_all(connect_packet(Connect(
                    0, self.last_zxid, int(self.session_timeout * 1000),
                    self.session_id or 0, self.password, False)))
                reply = parse_connect(await _next_packet(stream, reader, backlog))
                answered = True
                if reply.time_out <= 0:
                    self._expired()
                    return True
                self.session_id, self.password = reply.session_id, reply.passwd
                for scheme, credential in self._auth_data:
                    await stream.send_all(request_packet(AUTH_XID, Auth(0, scheme, credential)))
                    header, _offset = parse_header(await _next_packet(stream, reader, backlog))
                    if header.err:
                        self._refused(scheme)
                        return True
            self._established(host, port, reply, started)
            reason = await self._serve(stream, reader, backlog)
        except _CONNECTION_ERRORS as exc:
            reason = _describe(exc)
        finally:
            # the bookkeeping first: the close below is a checkpoint, and a stop() may be
            # cancelling this very task
            if self.connected:
                self._disconnected(reason)
            elif reason and not self._closing:
                log.info("zk.connect_failed", host=host, port=port, reason=reason)
            if stream is not None:
                await trio.aclose_forcefully(stream)
        return answered

    def _handshake_timeout(self) -> float:
        """A member has the session timeout divided among the members (the Java client's
        rule): the negotiated one once a server has told it, the requested one before."""
        negotiated = self.negotiated_timeout
        timeout = negotiated if negotiated is not None else self.session_timeout
        return timeout / max(len(self.hosts), 1)

    @property
    def negotiated_timeout(self) -> float | None:
        """The session timeout the server granted (seconds), once a handshake told it."""
        return self._negotiated

    async def _open(self, host: str, port: int) -> trio.abc.Stream:
        stream: trio.abc.Stream = await trio.open_tcp_stream(host, port)
        if self._ssl_context is not None:
            tls = trio.SSLStream(stream, self._ssl_context, server_hostname=host)
            await tls.do_handshake()
            stream = tls
        return stream

    def _established(self, host: str, port: int, reply: Connect, started: float) -> None:
        assert self.session_id is not None
        self._negotiated = reply.time_out / 1000.0
        self._liveness.connected(self.session_id, started, self._negotiated)
        self._xid = 0
        self._last_send = started
        self._ping_sent = None
        self._waiting_since = None
        self._unanswered = 0
        self.peer = (host, port)
        self.connected = True
        self._set_watches_again()
        self._on_state(SessionState.CONNECTED, self.session_id)

    async def _serve(self, stream: trio.abc.Stream, reader: PacketReader,
                     backlog: collections.deque[bytes]) -> str:
        """Run the connection's tasks until one of them drops it; return why."""
        self._drop_reason = ""
        for packet in backlog:
            self._dispatch(packet)
        async with trio.open_nursery() as nursery:
            self._scope = nursery.cancel_scope
            if self._closing:
                nursery.cancel_scope.cancel()
            nursery.start_soon(self._guarded, self._read_loop, stream, reader)
            nursery.start_soon(self._guarded, self._write_loop, stream)
            nursery.start_soon(self._guarded, self._heartbeat)
            nursery.start_soon(self._guarded, self._watchdog, _raw_socket(stream))
            nursery.start_soon(self._guarded, self._prover)
        self._scope = None
        return self._drop_reason or ("closed" if self._closing else "dropped")

    async def _guarded(self, loop: Callable[..., Any], *args: Any) -> None:
        try:
            await loop(*args)
        except _CONNECTION_ERRORS as exc:
            self._drop(_describe(exc))

    def _drop(self, reason: str) -> None:
        if not self._drop_reason:
            self._drop_reason = reason
        if self._scope is not None:
            self._scope.cancel()

    async def _read_loop(self, stream: trio.abc.Stream, reader: PacketReader) -> None:
        while True:
            data = await stream.receive_some(RECEIVE_BYTES)
            if not data:
                self._drop("the server closed the connection")
                return
            for packet in reader.feed(data):
                self._dispatch(packet)
            if self._outbox:
                self._writer_lot.unpark()  # replies made room for more requests
            # the server is heard: what is still awaited is awaited from now on
            awaited = self._pending or self._ping_sent is not None
            self._waiting_since = time.monotonic() if awaited else None

    async def _write_loop(self, stream: trio.abc.Stream) -> None:
        """Write the outbox in slices of :data:`WRITE_SLICE` bytes while fewer than
        :data:`UNANSWERED_BYTES` of requests await their replies (pings, SetWatches always
        go); each request's ``sent`` is the time it went to the socket."""
        outbox = self._outbox
        while True:
            if not outbox or not self._may_write(outbox[0]):
                await self._writer_lot.park()
                continue
            now = time.monotonic()
            parts: list[bytes] = []
            size = 0
            while outbox and size < WRITE_SLICE and self._may_write(outbox[0]):
                packet, request = outbox.popleft()
                if request is not None:
                    request.sent = now
                    self._unanswered += request.size
                parts.append(packet)
                size += len(packet)
            if self._waiting_since is None:
                self._waiting_since = now
            await stream.send_all(parts[0] if len(parts) == 1 else b"".join(parts))

    def _may_write(self, queued: tuple[bytes, _Request | None]) -> bool:
        request = queued[1]
        return (request is None or not self._unanswered
                or self._unanswered + request.size <= UNANSWERED_BYTES)

    async def _heartbeat(self) -> None:
        """A ping after half a read timeout without sending (requests count as pings)."""
        while True:
            due = self._last_send + self._liveness.read_timeout / 2
            now = time.monotonic()
            if now < due:
                await trio.sleep(due - now)
            elif self._ping_sent is None:
                self._ping_sent = now
                # ahead of whatever is not written yet: the server answers it in turn, but
                # it does not wait in this process behind megabytes of requests
                self._outbox.appendleft((request_packet(PING_XID, PingInstance), None))
                self._last_send = now
                self._writer_lot.unpark()
            else:  # one ping at a time; the watchdog judges a silent server
                await trio.sleep(self._liveness.read_timeout / 2)

    async def _watchdog(self, sock: Any) -> None:
        """Drop the connection when the server has been silent for a read timeout while an
        answer was awaited (the heartbeat makes sure one is, after half a read timeout)."""
        while True:
            read_timeout = self._liveness.read_timeout
            since = self._waiting_since
            now = time.monotonic()
            if since is None:
                await trio.sleep(read_timeout / 2)
            elif now < since + read_timeout:
                await trio.sleep(since + read_timeout - now)
            elif _readable(sock):
                # replies are waiting (this process was paused, or the loop was busy): the
                # reader takes them before the deadline is judged again
                await trio.sleep(0)
            else:
                self._liveness.dropped_connections += 1
                self._drop(f"no reply from ZooKeeper for {read_timeout:.2f}s "
                           "(read timeout: 2/3 of the session timeout)")
                return

    async def _prover(self) -> None:
        """A ``sync`` when nothing has proven the session through the leader for a third of
        a read timeout (a busy writer never needs one); one at a time."""
        sync = Sync("/")
        not_before = 0.0  # never more than one sync per third of a read timeout
        while True:
            due = max(self._liveness.refresh_due(), not_before)
            now = time.monotonic()
            if now < due:
                await trio.sleep(due - now)
                continue
            not_before = now + self._liveness.read_timeout * PROOF_REFRESH_FRACTION
            try:
                await self.call(sync)  # its reply moves the proof (see _dispatch)
            except (kz.ConnectionLoss, kz.ConnectionClosedError, kz.SessionExpiredError,
                    kz.AuthFailedError):
                return  # the connection is ending: a new one starts a new prover
            except kz.KazooException as exc:  # answered, but not proof: try again later
                log.warning("zk.sync_refused", error=type(exc).__name__)

    # ------------------------------------------------------------------ replies

    def _dispatch(self, packet: bytes) -> None:
        header, offset = parse_header(packet)
        xid = header.xid
        if xid < 0:  # an event or the answer to the driver's own request
            self._control_reply(xid, header.err, packet, offset)
            return
        if not self._pending:
            raise kz.ConnectionDropped(f"a reply (xid {xid}) to no request")
        request = self._pending.popleft()
        if request.xid != xid:
            raise kz.ConnectionDropped(f"reply xid {xid}, expected {request.xid}")
        if header.zxid > 0:
            self.last_zxid = header.zxid
        self._unanswered -= request.size
        self._answer(request, header.err, packet, offset)

    def _control_reply(self, xid: int, err: int, packet: bytes, offset: int) -> None:
        """A watch event, or the reply to a ping, an auth or a SetWatches."""
        if xid == WATCH_XID:
            self._watch_event(packet, offset)
        elif xid == PING_XID:
            self._ping_sent = None
        elif xid == SET_WATCHES_XID:
            if err:  # not set again: the watchers must read again themselves
                log.warning("zk.set_watches_failed", error=err)
                self._reset_watchers(KeeperState.CONNECTED)
        elif xid != AUTH_XID:
            raise kz.ConnectionDropped(f"a reply with xid {xid}, which no request has")

    def _answer(self, request: _Request, err: int, packet: bytes, offset: int) -> None:
        """Complete ``request`` with its reply (``err`` from the reply header)."""
        record = request.record
        if not err and (type(record) in LEADER_RECORDS or record is CloseInstance):
            # applied by the leader (an error reply might have been a member's own answer)
            self._liveness.proved(request.sent)
        if err:
            if err == _NO_NODE and type(record) is Exists:
                self._register(record, missing=True)
                request.complete(outcome.Value(None))
                return
            request.complete(outcome.Error(kz.EXCEPTIONS[err]()))
            return
        if record is CloseInstance or type(record) is Close:
            request.complete(outcome.Value(True))
            return
        try:
            value = record.deserialize(packet, offset)
        except Exception as exc:  # a reply this client cannot read: the request failed
            request.complete(outcome.Error(kz.ZookeeperError(f"unreadable reply: {exc!r}")))
            return
        self._register(record)
        request.complete(outcome.Value(value))

    def _register(self, record: Any, *, missing: bool = False) -> None:
        watcher = getattr(record, "watcher", None)
        if watcher is None or self._closing:
            return
        kind = type(record)
        if kind is AddWatch:
            table = (self._recursive_watchers if record.mode == ADD_WATCH_RECURSIVE
                     else self._persistent_watchers)
        elif kind is GetChildren or kind is GetChildren2:
            table = self._child_watchers
        else:
            table = self._exist_watchers if missing else self._data_watchers
        table.setdefault(record.path, {})[watcher] = None

    def forget_persistent(self, path: str, callback: WatchCallback, *,
                          recursive: bool) -> bool:
        """Stop calling ``callback`` for the persistent watch on ``path`` (a server path);
        True if no callback is left there (the caller may then remove the server's)."""
        table = self._recursive_watchers if recursive else self._persistent_watchers
        callbacks = table.get(path)
        if callbacks is None:
            return False
        callbacks.pop(callback, None)
        if callbacks:
            return False
        del table[path]
        return True

    def _set_watches_again(self) -> None:
        """Queue the SetWatches packets of every registered watch (a reconnection), then
        tell the persistent watchers (``NONE``, ``CONNECTED``): they are set again, but
        the server does not replay what they missed, so they read again."""
        persistent, recursive = self._persistent_watchers, self._recursive_watchers
        if not (self._data_watchers or self._exist_watchers or self._child_watchers
                or persistent or recursive):
            return
        self._outbox.extend((packet, None) for packet in set_watches_packets(
            self.last_zxid, list(self._data_watchers), list(self._exist_watchers),
            list(self._child_watchers), list(persistent), list(recursive)))
        self._writer_lot.unpark()
        told = [callback for table in (persistent, recursive)
                for callbacks in table.values() for callback in callbacks]
        event = WatchedEvent(EventType.NONE, KeeperState.CONNECTED, None)
        for callback in dict.fromkeys(told):
            _fire(callback, event)

    def _watch_event(self, packet: bytes, offset: int) -> None:
        kind, path = parse_watch(packet, offset)
        fired: list[WatchCallback] = []
        if kind in (_CREATED, _CHANGED, _DELETED):
            fired.extend(self._data_watchers.pop(path, ()))
            fired.extend(self._exist_watchers.pop(path, ()))
        if kind in (_DELETED, _CHILD):
            fired.extend(self._child_watchers.pop(path, ()))
        if self._persistent_watchers:
            fired.extend(self._persistent_watchers.get(path, ()))
        if self._recursive_watchers and kind != _CHILD:
            fired.extend(self._recursive_of(path))
        if kind not in EVENT_TYPE_MAP or self._closing:
            return
        event = WatchedEvent(EVENT_TYPE_MAP[kind], KeeperState.CONNECTED, self._unchroot(path))
        for callback in dict.fromkeys(fired):  # one call, however many ways it watched
            _fire(callback, event)

    def _recursive_of(self, path: str) -> list[WatchCallback]:
        """The recursive watchers of ``path``: on it and on each of its ancestors."""
        table = self._recursive_watchers
        found = list(table.get(path, ()))
        while path != "/":
            path = path.rsplit("/", 1)[0] or "/"
            found.extend(table.get(path, ()))
        return found

    def _unchroot(self, path: str) -> str:
        chroot = self.chroot
        if chroot and path.startswith(chroot):
            return path[len(chroot):] or "/"
        return path

    # ------------------------------------------------------------------ endings

    def _disconnected(self, reason: str) -> None:
        self.connected = False
        self.peer = None
        self._outbox.clear()
        self._ping_sent = None
        self._waiting_since = None
        if self._closing:
            self._ended()
            return
        log.warning("zk.connection_dropped", reason=reason)
        self._fail_pending(kz.ConnectionLoss(reason))
        self._on_state(SessionState.SUSPENDED, self.session_id)

    def _expired(self) -> None:
        log.warning("zk.session_expired", session_id=_hex(self.session_id))
        self.session_id, self.password, self.last_zxid = None, _EMPTY_PASSWORD, 0
        self._fail_pending(kz.SessionExpiredError())
        self._reset_watchers(KeeperState.EXPIRED_SESSION)
        self._liveness.lost()
        self._on_state(SessionState.LOST, None)

    def _ended(self) -> None:
        """Closed or stopped, connected or not: nothing waits any more (idempotent)."""
        self._closing = True
        self.connected = False
        self._fail_pending(kz.ConnectionClosedError("Connection has been closed"))
        self._reset_watchers(KeeperState.CLOSED)
        self._liveness.lost()
        self._on_state(SessionState.LOST, None)

    def _refused(self, scheme: str) -> None:
        self._failure = (f"ZooKeeper refused the session's {scheme} credentials "
                         "(AuthFailed): check FRAMEWORK_ZK_AUTH or Session(auth=...)")
        log.error("zk.auth_failed", scheme=scheme)
        self._reset_watchers(KeeperState.AUTH_FAILED)
        self._liveness.lost()
        self._on_state(SessionState.LOST, None)

    def _fail_pending(self, error: BaseException) -> None:
        pending, self._pending = self._pending, collections.deque()
        for request in pending:
            request.complete(outcome.Error(error))

    def _reset_watchers(self, state: str) -> None:
        """Forget every watch, firing each callback once with a ``NONE`` event in ``state``
        (``EXPIRED_SESSION``, ``CLOSED``, ``AUTH_FAILED``; ``CONNECTED`` when the server
        would not set them again)."""
        tables = (self._data_watchers, self._exist_watchers, self._child_watchers,
                  self._persistent_watchers, self._recursive_watchers)
        fired = [callback for table in tables
                 for callbacks in table.values() for callback in callbacks]
        self._data_watchers, self._exist_watchers, self._child_watchers = {}, {}, {}
        self._persistent_watchers, self._recursive_watchers = {}, {}
        event = WatchedEvent(EventType.NONE, state, None)
        for callback in dict.fromkeys(fired):
            _fire(callback, event)


async def _next_packet(stream: trio.abc.Stream, reader: PacketReader,
                       backlog: collections.deque[bytes]) -> bytes:
    while not backlog:
        data = await stream.receive_some(RECEIVE_BYTES)
        if not data:
            raise kz.ConnectionDropped("the server closed the connection during the handshake")
        backlog.extend(reader.feed(data))
    return backlog.popleft()


def _fire(callback: WatchCallback, event: WatchedEvent) -> None:
    try:
        callback(event)
    except Exception:
        log.exception("zk.watch_callback_failed", path=event.path)


def _raw_socket(stream: trio.abc.Stream) -> Any:
    inner = getattr(stream, "transport_stream", stream)
    return getattr(inner, "socket", None)


def _readable(sock: Any) -> bool:
    """Whether bytes (or the end of the stream) wait on ``sock``, without reading them."""
    if sock is None:
        return False
    try:
        poller = select.poll()
        poller.register(sock.fileno(), select.POLLIN)
        return bool(poller.poll(0))
    except (OSError, ValueError):
        return False


def _describe(exc: BaseException) -> str:
    if isinstance(exc, trio.TooSlowError):
        return "no answer to the handshake in time"
    return str(exc) or type(exc).__name__


def _hex(session_id: int | None) -> str | None:
    return None if session_id is None else f"{session_id:#x}"
