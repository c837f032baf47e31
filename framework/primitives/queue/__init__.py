"""A work queue with priorities and at-least-once delivery (seed: queues, priority queues).

Guarantees:

* **Puts** are never lost and, after a lost reply, not duplicated while the item is still
  queued (a GUID in each item's name is looked for before creating again).
* **Order**: lowest priority value first, across the whole queue (each priority value has
  its own lane of buckets), then oldest first within the oldest bucket of that lane that
  holds unclaimed work (``bucket_size`` items per bucket).
* **Delivery is at-least-once.**  ``async with queue.take() as item:`` claims an item; a
  clean exit acknowledges it by a multi that deletes claim and item only while the claim is
  ours; an exception hands it back (or dead-letters it after ``max_attempts`` deliveries, or
  at once for :class:`~framework.errors.PermanentFailure`).  A take cancelled before its
  block starts leaves no claim and no counted delivery.
* **SUSPENDED**: the block runs on until the session's trust deadline, then is cancelled
  with :class:`~framework.errors.ClaimLost`.  **LOST**: the block is cancelled at once; the
  ephemeral claim is gone with the session and the item is delivered again.
  :class:`ClaimLost` is also raised when an acknowledgement cannot be proven.
* Idle consumers wait in a line and never poll: a put wakes two of them, not all.

Design, costs and measurements: ``docs/architecture.md`` ("The work queue").  A
:class:`WorkQueue` is composed of parts, each an object with its own state, all built on one
:class:`~.core.QueueCore` (session, paths, settings: :mod:`.core`): a
:class:`~.producer.Producer` (puts), and for takes a :class:`~.consumer.Consumer` that asks a
:class:`~.claims.Claimer` (claim rounds; its place in :mod:`.line`, the line of idle
consumers) for a claim and an :class:`~.acks.Acker` (acks, releases, dead letters, undone
claims) to end it, while :class:`~.lease.Renewals` keeps its lease.  The claimer uses only
the acker's ``finish``/``restore_transaction``/``dead_path`` and the renewals; the producer
uses none of the others; :mod:`.moves` moves an unclaimed item into another queue
(:meth:`WorkQueue.move`, through the target's producer).  :mod:`.items` holds the records,
:mod:`.view` the watched view and the names, :mod:`.counts` the public counts; inspection
(``size``, ``dead_letters``) is here.
"""
from __future__ import annotations

import functools
import math
import os
import socket
from contextlib import AbstractAsyncContextManager
from typing import Any, Callable, Iterable

import trio

from framework import errors
from framework.errors import ConfigurationError
from framework.primitives.queue.acks import Acker
from framework.primitives.queue.claims import Claimer
from framework.primitives.queue.consumer import Consumer
from framework.primitives.queue.core import QueueCore
from framework.primitives.queue.counts import QueueCounts, queue_counts, watch_queue_counts
from framework.primitives.queue.items import ClaimExtras, Finisher, QueueItem
from framework.primitives.queue.lease import Renewals
from framework.primitives.queue.moves import move_item
from framework.primitives.queue.producer import Producer
from framework.primitives.queue.view import bucket_order, is_bucket, parse_item
from framework.retry import RetryPolicy
from framework.zk import MAX_DATA_BYTES, Session, Transaction, gather, validate_path

__all__ = ["MAX_BUCKET_SIZE", "ClaimExtras", "Finisher", "QueueCounts", "QueueItem",
           "WorkQueue", "is_bucket", "parse_item", "queue_counts", "watch_queue_counts"]

#: Largest ``bucket_size``: a bucket's listing must stay under ZooKeeper's 1 MB reply limit
#: (Java clients cannot read more) with names of up to ~45 bytes.
MAX_BUCKET_SIZE = 20_000


def _whole(name: str, value: object, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigurationError(f"{name} must be an int, got {value!r}")
    if value < low or (high is not None and value > high):
        bound = f"between {low:,} and {high:,}" if high is not None else f"at least {low:,}"
        raise ConfigurationError(f"{name} must be {bound}, got {value!r}")
    return value


class WorkQueue:
    """A distributed work queue at ``path`` (the recipe owns that subtree).

    ``bucket_size`` (2..20,000) bounds the items per bucket (see the module doc).
    ``max_item_bytes`` bounds a payload (:class:`DataTooLargeError` beyond).  With
    ``max_attempts``, an item delivered that many times without success goes to
    ``dead_letter`` (default ``<path>/dead``), readable with :meth:`dead_letters`.  Bad
    settings raise :class:`ConfigurationError`.  With ``lease`` (seconds), a claim must be
    renewed by its owner's trio loop within that time or it is broken and the item delivered
    again (a visibility timeout: see :mod:`framework.primitives.queue.lease`); every user
    of the queue should set the same lease.  With ``fence=(path, version)`` every put
    also checks, in the same request, that ``path`` is at ``version`` (a leader's election
    node): a deposed leader's put is refused by the server and raises
    :class:`~framework.errors.LeadershipLost`, nothing of that request applied.
    ``claim_with(item)`` (consumers) may return :class:`ClaimExtras`: operations committed in
    the same transaction as the item's claim (the runtime creates a task's ``running/``
    marker there); refused by the server, the item is claimed without them and
    ``item.extras`` is ``None``; a claim undone before its block started undoes them too.
    ``accept(item)`` (consumers) says whether this consumer takes an item at all (the
    runtime: a task of a type the worker has): an item refused is never claimed (no
    delivery counted), read once by this object and passed over since (an item's data never
    changes while queued), and waits for a consumer that accepts it.  Consumers that accept
    different items give each kind its own ``line`` (a name): idle consumers wait in the
    line of their kind, so a put wakes the first few idle consumers of each kind, and a
    kind that cannot take an item never holds the heads' places of one that can.

    SUSPENDED: waiting consumers keep waiting and re-read after reconnection; a consumer
    holding an item has its body cancelled after the session's ``suspended_grace`` and
    :class:`ClaimLost` is raised (the claim is released if the session survives, else it
    vanished with it): the item is delivered again.  LOST: claims of the expired session are
    gone and their items are delivered again; waiting consumers continue in the new session.
    Releasing, acknowledging and cleaning up after a cancelled take are shielded from
    cancellation but bounded by the session timeout (plus a second).  A producer's write
    that fails with ``ConnectionLossError`` is recovered by its GUID; one cancelled may or
    may not have been applied (retrying gives at-least-once puts).
    """

    def __init__(
        self,
        session: Session,
        path: str,
        *,
        bucket_size: int = 1_000,
        max_item_bytes: int = 64 * 1024,
        max_attempts: int | None = None,
        dead_letter: str | None = None,
        lease: float | None = None,
        fence: tuple[str, int] | None = None,
        claim_with: Callable[[QueueItem], ClaimExtras | None] | None = None,
        accept: Callable[[QueueItem], bool] | None = None,
        line: str | None = None,
    ) -> None:
        if not isinstance(session, Session):
            raise ConfigurationError(
                f"WorkQueue needs a framework Session, got {type(session).__name__}"
            )
        validate_path(path, allow_root=False)
        _whole("bucket_size", bucket_size, 2, MAX_BUCKET_SIZE)
        _whole("max_item_bytes", max_item_bytes, 1, MAX_DATA_BYTES)
        if max_attempts is not None:
            _whole("max_attempts", max_attempts, 1)
        if dead_letter is not None:
            validate_path(dead_letter, allow_root=False)
            inside = [f"{path}/{part}" for part in ("items", "claims", "puts")]
            if dead_letter == path or any(
                dead_letter == p or dead_letter.startswith(p + "/") for p in inside
            ):
                raise ConfigurationError(
                    f"dead_letter {dead_letter!r} must not be the queue's path or lie in its "
                    "items/, claims/ or puts/"
                )
        if lease is not None and (
            isinstance(lease, bool) or not isinstance(lease, (int, float))
            or not 0 < lease < math.inf
        ):
            raise ConfigurationError(f"lease must be a positive number of seconds: {lease!r}")
        if fence is not None:
            validate_path(fence[0], allow_root=False)
        waiting = f"{path}/waiting"
        if line is not None:
            if not line or "/" in line or line.startswith("w-"):
                raise ConfigurationError(
                    f"line must be a name without '/' nor the prefix 'w-', got {line!r}")
            waiting = f"{waiting}/{line}"
            validate_path(waiting)
        self._core = core = QueueCore(
            session=session, path=path, items_root=f"{path}/items",
            claims_root=f"{path}/claims", puts_root=f"{path}/puts", waiting=waiting,
            dead_letter=dead_letter or f"{path}/dead", bucket_size=bucket_size,
            max_item_bytes=max_item_bytes, max_attempts=max_attempts,
            retry=RetryPolicy(max_attempts),
            lease=float(lease) if lease is not None else None, fence=fence,
            claim_with=claim_with, accept=accept,
            owner=f"{socket.gethostname()}:{os.getpid()}",
        )
        self._producer = Producer(core)
        self._acker = Acker(core)
        self._renewals = Renewals()
        self._claimer = Claimer(core, self._acker, self._renewals)
        self._consumer = Consumer(core, self._claimer, self._acker, self._renewals)

    # ------------------------------------------------------------ settings (read-only)

    @property
    def session(self) -> Session:
        return self._core.session

    @property
    def path(self) -> str:
        return self._core.path

    @property
    def items_root(self) -> str:
        return self._core.items_root

    @property
    def claims_root(self) -> str:
        return self._core.claims_root

    @property
    def puts_root(self) -> str:
        return self._core.puts_root

    @property
    def dead_letter(self) -> str:
        return self._core.dead_letter

    @property
    def bucket_size(self) -> int:
        return self._core.bucket_size

    @property
    def max_item_bytes(self) -> int:
        return self._core.max_item_bytes

    @property
    def max_attempts(self) -> int | None:
        return self._core.max_attempts

    @property
    def lease(self) -> float | None:
        return self._core.lease

    @property
    def fence(self) -> tuple[str, int] | None:
        return self._core.fence

    @property
    def claim_with(self) -> Callable[[QueueItem], ClaimExtras | None] | None:
        return self._core.claim_with

    @property
    def accept(self) -> Callable[[QueueItem], bool] | None:
        return self._core.accept

    # ------------------------------------------------------------ producing

    #: Raises :class:`ConfigurationError` unless ``priority`` is an int below 10**9 in size.
    _check_priority = staticmethod(Producer._check_priority)

    async def put(self, data: bytes, *, priority: int = 0,
                  also: Callable[[Transaction], None] | None = None) -> str:
        """Add one item; return its name.

        ``also`` adds the caller's operations to the multi that creates the item (after the
        create, before the queue's fence): the item and they are applied together or not at
        all, once, even across lost replies.  If one of them is refused, nothing is applied
        and :class:`~framework.errors.TransactionFailedError` is raised with ``failed_index``
        counted from the first of them."""
        return (await self._producer.put_many([data], priority=priority, also=also))[0]

    async def put_many(self, items: Iterable[bytes], *, priority: int = 0,
                       also: Callable[[Transaction], None] | None = None) -> list[str]:
        """Add items in order; return their names.

        Items are written in multi-op batches (up to 1,000 items or about 512 KiB a request),
        across buckets (the first batch into a bucket creates it), and up to four batches
        are in flight at once.  Order still holds: each batch also bumps
        an ephemeral node of this call at the version the batch before it left, so batches
        are applied in order or not at all, and those after a lost one are sent again after
        it.  Each batch is atomic; if the call fails, a prefix of the items stays queued.
        After a lost reply whose batch was applied but entirely consumed before it could be
        found, names of that batch come back without their sequence number.
        """
        return await self._producer.put_many(items, priority=priority, also=also)

    async def move(self, name: str, target: WorkQueue, *,
                   also: Callable[[Transaction], None] | None = None,
                   rewrite: Callable[[bytes], bytes] | None = None) -> str | None:
        """Move item ``name`` (from :meth:`item_names`) into the queue ``target`` if nobody
        holds it: one multi - ``target``'s put (its fence, its bucket chain, recovered after
        a lost reply like any put) with this queue's delete of the item at the version read
        and a create and delete of its claim node, which proves it unclaimed - plus
        ``also``'s operations.  So the item is in exactly one of the two queues at every
        moment, and is never moved while a consumer holds it.  Returns its new name in
        ``target``, or ``None`` if it is gone or claimed now (nothing applied).  No delivery
        is counted; its priority is kept, its data too unless ``rewrite(data)`` makes the
        data it has in ``target``.  ``also``'s operations refused raise
        :class:`~framework.errors.TransactionFailedError` (``failed_index`` counted from the
        first of them), a refused fence :class:`~framework.errors.LeadershipLost`; a bad
        name or ``target`` being this queue, :class:`ConfigurationError`.  Costs one read and
        one multi (:mod:`framework.primitives.queue.moves`)."""
        return await move_item(self._core, name, target, also, rewrite)

    # ------------------------------------------------------------ consuming

    def take(self, *, renew_for: float | None = None,
             admit: Callable[[QueueItem], bool] | None = None
             ) -> AbstractAsyncContextManager[QueueItem]:
        """``async with queue.take() as item:`` wait for an item, claim it and run the block
        with it (see the module doc).

        With a ``lease``, the claim is renewed while the block runs, for at most
        ``renew_for`` seconds (default: as long as it runs); a claim not renewed for a whole
        lease is broken by an idle consumer, the block is cancelled with :class:`ClaimLost`
        and the item is delivered again (:mod:`framework.primitives.queue.lease`).

        ``admit(item)`` is called once the item is claimed, right before the block would
        start, with no checkpoint in between (a synchronous decision, e.g. "no other take
        of this slot won first"): ``False`` hands the item back as if this take had been
        cancelled before its block - the claim and its ``claim_with`` extras undone, the
        delivery not counted - and the take waits for another item (a take that refuses
        one is normally being cancelled: that wait then raises ``Cancelled``)."""
        return self._consumer.take(renew_for=renew_for, admit=admit)

    def finish_with(self, item: QueueItem, finisher: Finisher) -> None:
        """Commit ``finisher``'s operations in the same transaction as the acknowledgement
        of ``item`` (held by this queue object), when its block ends without an error: a
        result record written atomically with the ack, say.  If that transaction is refused
        while the claim is still ours, ``finisher.fallback()`` runs instead and the item is
        acknowledged alone after it; ``finisher.applied`` tells which happened."""
        self._consumer.finish_with(item, finisher)

    def renew_for(self, item: QueueItem, seconds: float) -> None:
        """Renew the lease of ``item`` (held by this queue object) for at most ``seconds``
        more: a holder that cannot stop a stuck handler still lets the item go."""
        self._renewals.extend(item.name, seconds)

    def reconsider(self) -> None:
        """What ``accept`` takes changed: read again the items it refused, and wake this
        object's idle takes that wait on the queue (the heads of its line) to look."""
        self._claimer.reconsider()

    # ------------------------------------------------------------ inspecting

    async def size(self, *, changed: trio.Event | None = None) -> int:
        """Items in the queue, including those being processed (claimed, not yet acked).

        With ``changed``, watches are left so that the event is set at the next put, ack,
        release to the dead letters or new bucket (this lists every non-empty bucket:
        meant for an observer waiting for the queue to drain, not for a hot path)."""
        waker = self.session.waker(changed) if changed is not None else None
        counts = await queue_counts(self.session, self.path, claims=False,
                                    watch=(lambda _path: waker) if waker else None)
        return counts.queued

    async def counts(self, *, changed: trio.Event | None = None) -> QueueCounts:
        """Items queued (claimed ones included), claimed, and the buckets holding them
        (:func:`~framework.primitives.queue.counts.queue_counts`); with ``changed``, the
        event is set at the next put, ack, claim, release or new bucket."""
        waker = self.session.waker(changed) if changed is not None else None
        return await queue_counts(self.session, self.path,
                                  watch=(lambda _path: waker) if waker else None)

    async def item_names(self) -> list[str]:
        """The names (``<bucket>/<item>``) of every item in the queue now, claimed ones
        included, in bucket order (one listing per bucket, pipelined: an inspection, not
        a hot path).  Read an item with :meth:`item_data`."""
        try:
            buckets = sorted((b for b in await self.session.children(self.items_root)
                              if is_bucket(b)), key=bucket_order)
        except errors.NoNodeError:
            return []
        listed: dict[str, list[str]] = {}

        async def list_bucket(bucket: str) -> None:
            try:
                listed[bucket] = await self.session.children(f"{self.items_root}/{bucket}")
            except errors.NoNodeError:
                pass

        await gather(*[_bind(list_bucket, b) for b in buckets])
        return [f"{b}/{n}" for b in buckets for n in sorted(listed.get(b, []))]

    async def newest_item(self) -> str | None:
        """The path of the item consumers will take last as things stand - in the last
        bucket (the least urgent lane's newest) that holds any, the one with the highest
        priority value, then the highest sequence number - or ``None`` if the queue is
        empty now: an observer waiting for the queue to drain watches that one node instead
        of every change (a listing of the buckets, then of the last buckets until one holds
        an item)."""
        try:
            buckets = sorted((b for b in await self.session.children(self.items_root)
                              if is_bucket(b)), key=bucket_order)
        except errors.NoNodeError:
            return None
        for bucket in reversed(buckets):
            try:
                names = await self.session.children(f"{self.items_root}/{bucket}")
            except errors.NoNodeError:
                continue
            entries = [e for e in map(functools.partial(parse_item, bucket), names) if e]
            if entries:
                last = max(entries, key=lambda e: (e.priority, e.seq))
                return f"{self.items_root}/{last.key}"
        return None

    async def item_data(self, name: str) -> bytes | None:
        """The data of item ``name`` (from :meth:`item_names`); ``None`` once it is gone.
        An item's data never changes while it is queued."""
        try:
            data, _stat = await self.session.get(f"{self.items_root}/{name}")
        except errors.NoNodeError:
            return None
        return data

    async def dead_letters(self) -> list[QueueItem]:
        """Items moved to the dead-letter path, oldest first."""
        try:
            names = await self.session.children(self.dead_letter)
        except errors.NoNodeError:
            return []
        out = []
        for name in names:
            flat, _, attempts = name.rpartition(".")
            bucket, _, node = flat.partition(".")
            entry = parse_item(bucket, node)
            if entry is None or not attempts.isdigit():
                continue
            try:
                data, _stat = await self.session.get(f"{self.dead_letter}/{name}")
            except errors.NoNodeError:
                continue
            out.append(QueueItem(entry.key, data, entry.priority, int(attempts)))
        return sorted(out, key=lambda i: (i.name.split("/")[0], int(i.name[-10:])))


def _bind(fn: Any, arg: str) -> Any:
    async def call() -> None:
        await fn(arg)

    return call
