"""Clients: :class:`Producer` and :class:`Subscriber`.

Both find a topic's primary through ZooKeeper (the ``primary`` znode: the fact, never the
controller's plan, then that server's :class:`~framework.primitives.ServiceDiscovery`
instance for where it listens) and talk to it over TCP; after a failover they wait on a
watch for the next primary (no polling) and carry on.  A route is read once and cached until
one of its two watches fires (or the connection to ZooKeeper changes state): sending and
receiving cost ZooKeeper nothing per message or per batch.

``Producer`` guarantees: ``await send(topic, payload)`` returns only once the message is
acknowledged (on two servers, or one in a ``one_copy`` topic with no backup in sync); messages
of one producer to one topic are appended in ``send`` order; retries after a failover or a
timeout carry the same producer id and sequence numbers, so the broker never appends a message
twice.  Messages queued while a batch is in flight go out together as the next batch
(``batch_max`` messages and :data:`BATCH_BYTES` of payload at most, so a batch always fits
in one frame).

``Subscriber`` guarantees: at-least-once delivery, in log order per topic, of every
acknowledged message; ``ack(msg)`` is cumulative per topic; positions are committed to
ZooKeeper every ``commit_interval`` seconds (and on exit) - one multi per subscriber per
interval, never a write per message.  After a crash the subscriber resumes from its last
committed position (so messages after it are delivered again: dedupe by :attr:`Message.id`).

Exclusive: one live instance per subscriber name.  An instance holds the lock
``subscriber_locks/<name>`` (the framework's :class:`~framework.primitives.Lock`) for its
whole life; a second instance waits for it (``exclusive="wait"``, the default) or is refused
at once with :class:`SubscriberBusyError` (``exclusive="refuse"``).  Positions are read only
once the lock is held, and every commit is a multi whose first op checks the holder's lock
node: an instance whose session expired (a paused process, a partition) can never move a
position, even if its commit is sent after it resumes.  A holder that loses the lock is
cancelled (:class:`framework.errors.LockLost` leaves the ``async with``), and a message is
handed to the application only while the session is trusted (``Session.ensure_trusted``:
a paused instance that resumes past its trust deadline gets
:class:`framework.errors.SessionInterrupted` instead of its next message).

ZooKeeper connection states: any change (SUSPENDED, a reconnection, a new session after
LOST) invalidates the cached routes, so the next batch a producer sends waits until the
connection is back and the ``primary`` znode was read again (its TCP links stay open); a
subscription already streaming carries on.  For a named subscriber a lost session ends the
lock (:class:`~framework.errors.LockLost` leaves the ``async with``).

Raises: :class:`BrokerError` for a refusal that asking again cannot change (its ``code`` is
the :class:`~examples.message_broker.protocol.ErrorCode`: ``too_large``, ``bad_request``,
...), :class:`UnknownTopicError`, :class:`SubscriberBusyError`,
:class:`~framework.errors.ConfigurationError` for a payload that is not bytes, and
:class:`~framework.records.CorruptRecord` for a znode that does not hold its record (a
subscriber's position, a topic's ``primary``).  Everything else (a server that dies, a
link that breaks, a failover) is retried.
"""

from __future__ import annotations

import collections
import enum
import os
import socket
import uuid
from collections.abc import AsyncIterator
from typing import Any

import attrs
import trio

from examples.message_broker import protocol
from examples.message_broker.layout import (
    BrokerPaths,
    Position,
    PrimaryRecord,
    SubscriberIdentity,
    check_topic,
    decode,
    find_server,
)
from examples.message_broker.protocol import (
    ErrorCode,
    ErrorReply,
    Msgs,
    Produce,
    Produced,
    Subscribe,
    Subscribed,
)
from examples.message_broker.watching import wait_watch
from framework import errors, records
from framework.logs import get_logger
from framework.primitives import Lock, LockHolding
from framework.retry import Backoff
from framework.zk import Session

__all__ = ["BrokerError", "Exclusive", "Message", "Producer", "Subscriber",
           "SubscriberBusyError", "UnknownTopicError"]

log = get_logger("examples.message_broker.client")


class BrokerError(errors.FrameworkError):
    """A request the broker refused for good (``code``: why)."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code


class UnknownTopicError(BrokerError):
    """The topic does not exist (in ZooKeeper: no server refusal is taken for this)."""

    def __init__(self, topic: str) -> None:
        super().__init__(ErrorCode.UNKNOWN_TOPIC,
                         f"unknown topic {topic!r} (create it with "
                         "`python -m examples.message_broker.ctl create`)")


class SubscriberBusyError(errors.FrameworkError):
    """Another instance of this subscriber name is live (``exclusive="refuse"``)."""


#: Pauses before asking again after refusals that the znode does not explain: 50 ms
#: doubling to 1 s, with jitter (many producers refused at once do not retry in lockstep).
RETRY_BACKOFF = Backoff(0.05, 1.0)

#: Longest a client waits for a newer primary after its link to the current one failed,
#: before it tries the same one again (the server may have been out of reach only).
LINK_RETRY = 5.0

#: Most payload bytes in one produce batch: with msgpack's per-message overhead the request
#: stays well inside :data:`protocol.MAX_FRAME`.
BATCH_BYTES = protocol.MAX_FRAME - 64 * 1024


class Exclusive(enum.Enum):
    """What a :class:`Subscriber` does when another instance of its name is live."""

    #: wait until it is gone (its lock is released, or its session expires)
    WAIT = "wait"
    #: refuse at once (:class:`SubscriberBusyError`)
    REFUSE = "refuse"


@attrs.frozen
class Message:
    """A delivered message.  ``id`` (topic/offset) is the same on every delivery."""

    topic: str
    offset: int
    producer: str
    seq: int
    payload: bytes

    @property
    def id(self) -> str:
        return f"{self.topic}/{self.offset}"


@attrs.frozen
class _Route:
    address: str
    epoch: int
    fired: trio.Event  # the watch set by the read that found this route
    generation: int  # the session's state generation at that read


class Router:
    """Finds topics' primaries through ZooKeeper watches (the ``primary`` znode names the
    server, its discovery instance says where it listens), and caches what it found until a
    watch fires: two reads per primary change, not one per request."""

    def __init__(self, session: Session, paths: BrokerPaths) -> None:
        self.session = session
        self.paths = paths
        self._routes: dict[str, _Route] = {}

    def forget(self, topic: str) -> None:
        """Drop the cached route (the server refused: read the znode again)."""
        self._routes.pop(topic, None)

    async def topic_exists(self, topic: str) -> bool:
        return await self.session.exists(self.paths.topic(topic)) is not None

    async def primary(self, topic: str, *, not_epoch: int | None = None) -> tuple[str, int]:
        """``(address, epoch)`` of the topic's primary, waiting (on a watch) until there is
        one whose epoch is not ``not_epoch``."""
        route = self._routes.get(topic)
        if route is not None and not route.fired.is_set() and route.epoch != not_epoch \
                and route.generation == self.session.snapshot().generation:
            return route.address, route.epoch
        self._routes.pop(topic, None)
        session, paths = self.session, self.paths
        while True:
            fired = trio.Event()
            generation = session.snapshot().generation
            try:
                data, stat = await session.get(paths.primary(topic), watch=session.waker(fired))
            except errors.NoNodeError:
                if await session.exists(paths.topic(topic)) is None:
                    raise UnknownTopicError(topic) from None
                if await session.exists(paths.primary(topic),
                                        watch=session.waker(fired)) is None:
                    await wait_watch(session, fired, generation)
                continue
            except (errors.ConnectionLossError, errors.SessionExpiredError):
                await session.wait_connected()
                continue
            if stat.czxid == not_epoch:
                await wait_watch(session, fired, generation)
                continue
            try:
                address = await find_server(session, paths, decode(data, PrimaryRecord).server,
                                            watch=session.waker(fired))
            except (errors.ConnectionLossError, errors.SessionExpiredError):
                await session.wait_connected()
                continue
            if address:
                self._routes[topic] = _Route(address, stat.czxid, fired, generation)
                return address, stat.czxid
            await wait_watch(session, fired, generation)

    async def wait_isr_change(self, topic: str) -> None:
        """Return when the topic's in-sync set changes (a backup caught up)."""
        fired = trio.Event()
        generation = self.session.snapshot().generation
        try:
            await self.session.get(self.paths.isr(topic), watch=self.session.waker(fired))
        except errors.ZooKeeperError:
            return
        await wait_watch(self.session, fired, generation)


@attrs.define(eq=False)
class _Slot:
    """A request waiting for its reply (``None`` once the link broke)."""

    done: trio.Event = attrs.field(factory=trio.Event)
    reply: protocol.Message | None = None


class _Link:
    """One connection to a server with replies matched to requests by id."""

    def __init__(self, conn: protocol.Connection) -> None:
        self.conn = conn
        self.pending: dict[int, _Slot] = {}
        self._next_id = 1
        self.broken = False

    def new_id(self) -> int:
        """An id no other request on this link has."""
        self._next_id += 1
        return self._next_id

    async def reader(self) -> None:
        try:
            while True:
                reply = await self.conn.read()
                slot = self.pending.pop(getattr(reply, "id", None), None)  # type: ignore
                if slot is not None:
                    slot.reply = reply
                    slot.done.set()
        except (protocol.PeerClosed, protocol.ProtocolError, OSError,
                trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            self.broken = True
            for slot in self.pending.values():
                slot.done.set()
            self.pending.clear()
            await self.conn.aclose()

    async def request(self, message: Produce) -> protocol.Message:
        """Send ``message`` (its id from :meth:`new_id`) and return the reply;
        :class:`protocol.PeerClosed` if the link breaks first."""
        if self.broken:
            raise protocol.PeerClosed("link closed")
        slot = self.pending[message.id] = _Slot()
        try:
            await self.conn.send(message)
            await slot.done.wait()
        finally:
            self.pending.pop(message.id, None)
        if slot.reply is None:
            raise protocol.PeerClosed("link closed")
        return slot.reply


@attrs.define(eq=False)
class _Batch:
    """Messages queued for one produce request (``batch_max`` messages and
    :data:`BATCH_BYTES` of payload at most) and what became of them: every message of a
    batch is acknowledged, or refused, together, so its senders wait on one event."""

    payloads: list[bytes] = attrs.field(factory=list)
    size: int = 0
    done: trio.Event = attrs.field(factory=trio.Event)
    error: BaseException | None = None


def _check_payload(payload: bytes) -> None:
    if not isinstance(payload, bytes):
        raise errors.ConfigurationError("a message payload must be bytes")
    if len(payload) > protocol.MAX_MESSAGE:
        raise BrokerError(ErrorCode.TOO_LARGE, f"message of {len(payload)} bytes exceeds the "
                                               f"maximum of {protocol.MAX_MESSAGE}")


class Producer:
    """An idempotent, batching producer (see the module doc).  Use ``async with``."""

    def __init__(self, session: Session, *, producer_id: str | None = None,
                 batch_max: int = 200, ack_timeout: float = 5.0,
                 paths: BrokerPaths | None = None) -> None:
        if batch_max < 1:
            raise errors.ConfigurationError("batch_max must be at least 1")
        self.session = session
        self.paths = paths or BrokerPaths()
        self.router = Router(session, self.paths)
        # one id per incarnation: sequence numbers restart at 0 with every Producer, so a
        # reused id would make the broker drop new messages as retries of old ones
        self.producer_id = f"{producer_id or 'p'}-{uuid.uuid4().hex[:12]}"
        self.batch_max = batch_max
        self.ack_timeout = ack_timeout
        self.retries = 0
        #: per topic, the batches not sent yet (the last one is open to new messages)
        self._queues: dict[str, collections.deque[_Batch]] = {}
        self._wakeups: dict[str, trio.Event] = {}
        self._links: dict[str, _Link] = {}
        self._nursery: trio.Nursery | None = None

    async def __aenter__(self) -> Producer:
        self._cm = trio.open_nursery()
        self._nursery = await self._cm.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> bool | None:
        assert self._nursery is not None
        self._nursery.cancel_scope.cancel()
        return await self._cm.__aexit__(*exc)

    async def send(self, topic: str, payload: bytes) -> None:
        """Publish one message; returns once it is acknowledged (see the module doc)."""
        _check_payload(payload)
        batch = self._join(self._queue(topic), payload)
        self._wakeups[topic].set()
        await batch.done.wait()
        if batch.error is not None:
            raise batch.error

    async def send_many(self, topic: str, payloads: list[bytes]) -> None:
        """Publish ``payloads`` in this order (batched as one ``send`` each would be);
        returns once all are acknowledged, or raises the first permanent error."""
        for payload in payloads:
            _check_payload(payload)
        queue = self._queue(topic)
        joined: list[_Batch] = []
        for payload in payloads:
            batch = self._join(queue, payload)
            if not joined or joined[-1] is not batch:
                joined.append(batch)
        self._wakeups[topic].set()
        for batch in joined:
            await batch.done.wait()
            if batch.error is not None:
                raise batch.error

    def _queue(self, topic: str) -> collections.deque[_Batch]:
        """The topic's queue of batches (the first send to a topic checks its name and starts
        its sender)."""
        queue = self._queues.get(topic)
        if queue is None:
            check_topic(topic)
            if self._nursery is None:
                raise errors.ConfigurationError("use the Producer inside `async with`")
            queue = self._queues[topic] = collections.deque()
            self._wakeups[topic] = trio.Event()
            self._nursery.start_soon(self._sender, topic)
        return queue

    def _join(self, queue: collections.deque[_Batch], payload: bytes) -> _Batch:
        """Queue ``payload`` in the open batch, or in a new one when it is full."""
        batch = queue[-1] if queue else None
        if batch is None or len(batch.payloads) >= self.batch_max or \
                (batch.payloads and batch.size + len(payload) > BATCH_BYTES):
            batch = _Batch()
            queue.append(batch)
        batch.payloads.append(payload)
        batch.size += len(payload)
        return batch

    async def _link(self, address: str) -> _Link:
        link = self._links.get(address)
        if link is None or link.broken:
            link = _Link(await protocol.connect(address))
            self._links[address] = link
            assert self._nursery is not None
            self._nursery.start_soon(link.reader)
        return link

    async def _sender(self, topic: str) -> None:
        seq = 0
        queue = self._queues[topic]
        while True:
            if not queue:
                self._wakeups[topic] = trio.Event()
                await self._wakeups[topic].wait()
                continue
            batch = queue.popleft()  # sent as it is: no message joins it any more
            try:
                await self._deliver(topic, seq, batch.payloads)
            except BrokerError as exc:
                batch.error = exc
            seq += len(batch.payloads)
            batch.done.set()

    async def _deliver(self, topic: str, seq: int, payloads: list[bytes]) -> None:
        """Send one batch until acknowledged (same sequence numbers on every retry)."""
        refusals = 0
        while True:
            address, epoch = await self.router.primary(topic)
            try:
                with trio.fail_after(self.ack_timeout):
                    link = await self._link(address)
                    reply = await link.request(Produce(link.new_id(), topic, self.producer_id,
                                                       seq, payloads))  # type: ignore[arg-type]
            except (OSError, protocol.PeerClosed, trio.BrokenResourceError,
                    trio.ClosedResourceError, trio.TooSlowError) as exc:
                self.retries += 1
                log.info("producer.retry", topic=topic, error=type(exc).__name__)
                # a newer primary, if one comes soon; else the same one again (it may have
                # been out of reach only)
                with trio.move_on_after(self.ack_timeout):
                    await self.router.primary(topic, not_epoch=epoch)
                continue
            if isinstance(reply, Produced):
                return
            if not isinstance(reply, ErrorReply):
                raise BrokerError(ErrorCode.BAD_FRAME,
                                  f"the server answered a produce with a {reply.op.value} frame")
            code = reply.code
            if code is ErrorCode.UNKNOWN_TOPIC and await self.router.topic_exists(topic):
                code = ErrorCode.NOT_PRIMARY  # a stale route: that server does not serve it
            if code.permanent:
                raise BrokerError(code, reply.message or code.value)
            self.retries += 1
            if code is ErrorCode.NO_IN_SYNC_BACKUP:
                with trio.move_on_after(self.ack_timeout):
                    await self.router.wait_isr_change(topic)
            elif code is ErrorCode.SHUTTING_DOWN:  # its backup takes over: the next term
                with trio.move_on_after(self.ack_timeout):
                    await self.router.primary(topic, not_epoch=epoch)
            else:
                # not_primary: that server is starting or has just been deposed; the znode
                # tells which, so look again after a short back-off
                self.router.forget(topic)
                refusals += 1
                await RETRY_BACKOFF.sleep(refusals)


class Subscriber:
    """A durable, exclusive subscriber to ``topics`` (see the module doc).  Use ``async with``
    and iterate; call :meth:`ack` for each processed message.

    ``exclusive`` (:class:`Exclusive` or its value): ``WAIT`` for a live instance of the same
    name to go, or ``REFUSE`` (raise :class:`SubscriberBusyError` from ``async with``).
    ``start``: per topic, an offset to read from instead of the committed position (the
    position moves on from there).

    ``name=None``: an anonymous reader - no lock, no position read or committed, reading from
    ``start`` (default 0).  :meth:`head` tells where a topic's high watermark was when this
    subscriber first subscribed to it (a reader that does not follow stops there)."""

    def __init__(self, session: Session, name: str | None, topics: list[str], *,
                 commit_interval: float = 1.0, paths: BrokerPaths | None = None,
                 exclusive: Exclusive | str = Exclusive.WAIT,
                 start: dict[str, int] | None = None) -> None:
        from framework.zk import validate_name

        try:
            self.exclusive = Exclusive(exclusive)
        except ValueError:
            raise errors.ConfigurationError(
                f"exclusive must be 'wait' or 'refuse', got {exclusive!r}") from None
        self.session = session
        self.name = None if name is None else validate_name("subscriber name", name)
        self.topics = [check_topic(t) for t in topics]
        self.paths = paths or BrokerPaths()
        self.router = Router(session, self.paths)
        self.commit_interval = commit_interval
        self.start = dict(start or {})
        self.acked: dict[str, int] = {}
        self.committed: dict[str, int] = {}
        self.resubscribes = 0
        self.holding: LockHolding | None = None
        self.heads: dict[str, int] = {}
        self._heads_changed = trio.Event()
        self._send, self._receive = trio.open_memory_channel[Message](1000)

    def _set_head(self, topic: str, hw: int) -> None:
        if topic not in self.heads:
            self.heads[topic] = hw
            self._heads_changed.set()
            self._heads_changed = trio.Event()

    async def head(self, topic: str) -> int:
        """The topic's high watermark when this subscriber first subscribed to it (waits for
        that first subscription)."""
        while topic not in self.heads:
            await self._heads_changed.wait()
        return self.heads[topic]

    async def _lock(self) -> Any:
        """Acquire this name's lock (module doc); returns the entered context manager."""
        if self.name is None:
            return _NoLock()
        path = self.paths.subscriber_lock(self.name)
        identity = records.encode(SubscriberIdentity(socket.gethostname(), os.getpid()))
        if self.exclusive is Exclusive.REFUSE:
            holder = await self._holder(path)
            if holder is not None:
                raise SubscriberBusyError(f"subscriber {self.name!r} is already live ({holder})")
        manager = Lock(self.session, path, identity).acquire()
        self.holding = await manager.__aenter__()
        log.info("subscriber.exclusive", subscriber=self.name, token=self.holding.token)
        return manager

    async def _holder(self, path: str) -> str | None:
        """Who holds or waits for the lock at ``path`` (``None``: nobody)."""
        try:
            names = sorted(n for n in await self.session.children(path) if "lock-" in n)
        except errors.NoNodeError:
            return None
        for name in names:
            try:
                who = decode((await self.session.get(f"{path}/{name}"))[0], SubscriberIdentity)
            except errors.NoNodeError:
                continue
            except records.CorruptRecord:
                return "an instance that did not say who it is"
            return f"pid {who.pid} on {who.host}"
        return None

    async def __aenter__(self) -> Subscriber:
        for topic in self.topics:
            if await self.session.exists(self.paths.topic(topic)) is None:
                raise UnknownTopicError(topic)
        self._lock_cm = await self._lock()
        try:
            await self._start()
        except BaseException as exc:
            await self._lock_cm.__aexit__(type(exc), exc, exc.__traceback__)
            raise
        return self

    async def _start(self) -> None:
        for topic in self.topics:
            if self.name is None:
                self.committed[topic] = self.acked[topic] = self.start.get(topic, 0)
                continue
            path = self.paths.subscriber(topic, self.name)
            try:
                data, _ = await self.session.get(path)
                self.committed[topic] = decode(data, Position).offset
            except errors.NoNodeError:
                await self.session.create(path, records.encode(Position(0)), makepath=True)
                self.committed[topic] = 0
            if topic in self.start:  # read from there; acks move the position on
                self.committed[topic] = self.start[topic]
            self.acked[topic] = self.committed[topic]
        self._cm = trio.open_nursery()
        self._nursery = await self._cm.__aenter__()
        for topic in self.topics:
            self._nursery.start_soon(self._follow, topic, self.committed[topic])
        self._nursery.start_soon(self._committer)

    async def __aexit__(self, *exc: Any) -> bool | None:
        self._nursery.cancel_scope.cancel()
        try:
            result = await self._cm.__aexit__(*exc)
            with trio.CancelScope(shield=True), trio.move_on_after(5):
                await self.commit()
        except BaseException as inner:
            await self._lock_cm.__aexit__(type(inner), inner, inner.__traceback__)
            raise
        if result:
            exc = (None, None, None)
        return bool(await self._lock_cm.__aexit__(*exc)) or bool(result)

    def __aiter__(self) -> AsyncIterator[Message]:
        return self

    async def __anext__(self) -> Message:
        """The next message, handed out only while the session is trusted (module doc)."""
        try:
            message = await self._receive.receive()
        except trio.EndOfChannel:
            raise StopAsyncIteration from None
        if self.holding is not None:
            self.session.ensure_trusted(self.holding.session_id)
        return message

    def ack(self, message: Message) -> None:
        """Acknowledge ``message`` and everything before it in its topic."""
        if message.offset + 1 > self.acked.get(message.topic, 0):
            self.acked[message.topic] = message.offset + 1

    async def commit(self) -> None:
        """Write the acknowledged positions that moved, all topics in one multi (one
        ZooKeeper write per subscriber per ``commit_interval``, however many messages)."""
        moved = {t: o for t, o in list(self.acked.items()) if o > self.committed.get(t, 0)}
        if not moved or self.name is None or self.holding is None:
            return
        txn = self.holding.fence(self.session.transaction())  # only while we hold the name
        for topic, offset in moved.items():
            txn.set(self.paths.subscriber(topic, self.name), records.encode(Position(offset)))
        try:
            await txn.commit()
        except errors.ZooKeeperError as exc:  # positions are retried at the next interval
            log.warning("subscriber.commit_failed", subscriber=self.name, error=str(exc))
            return
        for topic, offset in moved.items():
            self.committed[topic] = max(self.committed.get(topic, 0), offset)

    async def _committer(self) -> None:
        while True:
            await trio.sleep(self.commit_interval)
            await self.commit()

    async def _follow(self, topic: str, offset: int) -> None:
        """Run for the subscriber's life: stream ``topic`` from ``offset`` into the channel
        from whichever server is its primary.  When a subscription ends, wait for a newer
        primary if the link failed, or look the primary up again after a back-off if the
        server refused (a stale route); :class:`BrokerError` for a permanent refusal."""
        cursor = _Cursor(offset)
        while True:
            address, epoch = await self.router.primary(topic)
            refused = await self._subscribe_once(topic, address, cursor)
            self.resubscribes += 1
            if not refused:  # the server died or is out of reach: wait for a newer primary
                with trio.move_on_after(LINK_RETRY):
                    await self.router.primary(topic, not_epoch=epoch)
            else:  # refused (not_primary): look the primary up again after a back-off
                self.router.forget(topic)
                cursor.refusals += 1
                await RETRY_BACKOFF.sleep(cursor.refusals)

    async def _subscribe_once(self, topic: str, address: str, cursor: _Cursor) -> bool:
        """One subscription at ``address``, from ``cursor.offset``, until it ends: ``True``
        when the server refused it in a way asking again may change, ``False`` when the
        link could not be opened (within :data:`LINK_RETRY`) or broke."""
        try:
            with trio.fail_after(LINK_RETRY):
                conn = await protocol.connect(address)
        except (OSError, trio.TooSlowError):
            return False
        try:
            await conn.send(Subscribe(1, topic, cursor.offset))
            await self._stream(conn, topic, cursor)
            return True
        except (protocol.PeerClosed, protocol.ProtocolError, OSError,
                trio.BrokenResourceError, trio.ClosedResourceError):
            return False
        finally:
            await conn.aclose()

    async def _stream(self, conn: protocol.Connection, topic: str, cursor: _Cursor) -> None:
        """Hand a subscription's messages to the channel in log order, moving
        ``cursor.offset`` past each one handed out (a batch that does not start there is
        skipped); returns at a refusal that is not permanent."""
        while True:
            frame = await conn.read()
            if isinstance(frame, ErrorReply):
                await self._check_refusal(topic, frame)
                return
            if isinstance(frame, Subscribed):
                self._set_head(topic, frame.hw)
                cursor.refusals = 0
            elif isinstance(frame, Msgs) and frame.start == cursor.offset:
                for record in frame.records:
                    await self._send.send(Message(topic, cursor.offset, record.producer,
                                                  record.seq, record.payload))
                    cursor.offset += 1

    async def _check_refusal(self, topic: str, frame: ErrorReply) -> None:
        """:class:`BrokerError` if ``frame`` refuses for good; ``unknown_topic`` from a
        server while the topic exists is a stale route (``not_primary``), not permanent."""
        code = frame.code
        if code is ErrorCode.UNKNOWN_TOPIC and await self.router.topic_exists(topic):
            code = ErrorCode.NOT_PRIMARY  # a stale route
        if code.permanent:
            raise BrokerError(code, frame.message)


@attrs.define
class _Cursor:
    """Where one topic's subscription stands: the next offset to hand out, and the
    refusals in a row since a server last accepted the subscription."""

    offset: int
    refusals: int = 0


class _NoLock:
    """The lock of an anonymous reader: nothing to hold."""

    async def __aexit__(self, *exc: Any) -> bool:
        return False
