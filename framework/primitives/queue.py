"""A work queue with priorities and at-least-once delivery (seed: queues, priority queues).

Producers add persistent sequential items named ``i<priority>-NNNNNNNNNN``; consumers take
the lowest priority value first, oldest first, from an up-to-date children list (see
:mod:`framework.primitives.queue_view` for the layout and the watched view).

Delivery is at-least-once:

* claim: one transaction creates the consumer's *ephemeral* claim node and bumps the item's
  version (the version counts deliveries, so crashed deliveries count too);
* clean exit from ``async with queue.take() as item:`` acknowledges: one transaction deletes
  the claim and the item *at the version we claimed*, so it succeeds only while the claim is
  still ours - an item is never deleted twice, and never by a consumer that lost its claim;
* an exception releases the claim (the item is delivered again), or moves the item to the
  dead-letter path once ``max_attempts`` deliveries have been made;
* a crashed consumer's claims vanish with its session, and the item is delivered again.

Consumers wait on watches, never poll.  Every waiting consumer, in every process, is woken
by the same watch and competes for the head of the queue, so none is starved (fair); one that
loses a race tries a random item among the next few instead of racing for the next head in
lockstep, so competitors spread out.  Within a process, consumer tasks sharing a
``WorkQueue`` share one view and never compete for the same item.  A lone consumer takes
items in strict order.

Large queues: items live in buckets ``items/b-NNNNNNNNNN`` of at most ``bucket_size``
children (ZooKeeper's Java clients cannot list a parent with ~30k+ children).  A bucket is
closed once its sequence counter reaches ``bucket_size``; an item created past that (by a
concurrent producer) is moved to the next bucket before ``put`` returns, so no bucket keeps
more than ``bucket_size`` items (it may exceed it briefly, by the puts in flight).  Priority
order holds within the oldest bucket that still holds unclaimed work - that is, across the
whole queue while it holds fewer than ``bucket_size`` items.
"""

from __future__ import annotations

import os
import random
import socket
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Iterable

import attrs
import trio

from framework import errors
from framework.errors import ClaimLost, ConfigurationError, DataTooLargeError
from framework.logs import get_logger
from framework.primitives.holding import node_scope
from framework.primitives.queue_view import (
    Entry,
    QueueView,
    bucket_index,
    bucket_name,
    gather,
    is_bucket,
    item_prefix,
    parse_item,
)
from framework.zk import MAX_DATA_BYTES, Session, validate_path

log = get_logger("framework.primitives.queue")

#: Items per multi-op in ``put_many`` (and its byte budget), well under ZooKeeper's 1 MB.
_BATCH_OPS = 500
_BATCH_BYTES = 512 * 1024


@attrs.frozen
class QueueItem:
    """One delivery of an item.

    ``name`` identifies the item (``b-0000000000/i+0-0000000042``); ``attempts`` counts its
    deliveries including this one (for a dead letter: the deliveries made before it died).
    """

    name: str
    data: bytes
    priority: int
    attempts: int


@attrs.frozen
class _Claim:
    entry: Entry
    data: bytes
    version: int  # the item's version while our claim holds (== deliveries so far)
    claim_path: str
    session_id: int


class WorkQueue:
    """A distributed work queue at ``path`` (the recipe owns that subtree).

    ``max_item_bytes`` bounds a payload (:class:`DataTooLargeError` beyond).  With
    ``max_attempts``, an item delivered that many times without success goes to
    ``dead_letter`` (default ``<path>/dead``), readable with :meth:`dead_letters`.

    SUSPENDED: waiting consumers keep waiting and re-read after reconnection; a consumer
    holding an item has its body cancelled after the session's ``suspended_grace`` and
    :class:`ClaimLost` is raised (the claim is released if the session survives, else it
    vanished with it): the item is delivered again.  LOST: claims of the expired session are
    gone and their items are delivered again; waiting consumers continue in the new session.
    A producer's write that fails with ``ConnectionLossError`` may or may not have been
    applied (retrying gives at-least-once puts).
    """

    def __init__(
        self,
        session: Session,
        path: str,
        *,
        bucket_size: int = 10_000,
        max_item_bytes: int = 64 * 1024,
        max_attempts: int | None = None,
        dead_letter: str | None = None,
    ) -> None:
        validate_path(path, allow_root=False)
        if bucket_size < 2:
            raise ConfigurationError(f"bucket_size must be at least 2, got {bucket_size}")
        if not 0 < max_item_bytes <= MAX_DATA_BYTES:
            raise ConfigurationError(
                f"max_item_bytes must be in 1..{MAX_DATA_BYTES}, got {max_item_bytes}"
            )
        if max_attempts is not None and max_attempts < 1:
            raise ConfigurationError(f"max_attempts must be at least 1, got {max_attempts}")
        if dead_letter is not None:
            validate_path(dead_letter, allow_root=False)
        self.session = session
        self.path = path
        self.bucket_size = bucket_size
        self.max_item_bytes = max_item_bytes
        self.max_attempts = max_attempts
        self.dead_letter = dead_letter or f"{path}/dead"
        self.items_root = f"{path}/items"
        self.claims_root = f"{path}/claims"
        self._owner = f"{socket.gethostname()}:{os.getpid()}".encode()
        self._ready = False
        self._view: QueueView | None = None
        self._claiming: set[str] = set()
        self._contended = False  # the last claim lost a race to another consumer
        self._bucket: str | None = None  # where this producer puts
        self._bucket_hint = -1  # highest sequence number seen in it

    async def _setup(self) -> None:
        if not self._ready:
            await gather(
                lambda: self.session.ensure_path(self.items_root),
                lambda: self.session.ensure_path(self.claims_root),
            )
            self._ready = True

    # ================================================================ producers

    def _check(self, data: bytes, priority: int) -> bytes:
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise DataTooLargeError(
                f"queue items must be bytes, got {type(data).__name__} (encode it first)"
            )
        if len(data) > self.max_item_bytes:
            raise DataTooLargeError(
                f"queue item is {len(data):,} bytes; this queue accepts at most "
                f"{self.max_item_bytes:,} (store large payloads elsewhere and queue a reference)"
            )
        if not isinstance(priority, int) or abs(priority) >= 10**9:
            raise ConfigurationError(f"priority must be an int below 10**9 in size: {priority!r}")
        return bytes(data)

    async def put(self, data: bytes, *, priority: int = 0) -> str:
        """Add one item; return its name."""
        return (await self.put_many([data], priority=priority))[0]

    async def put_many(self, items: Iterable[bytes], *, priority: int = 0) -> list[str]:
        """Add items in order; return their names.

        Items are written in multi-op batches (up to 500 items or 512 KiB per request), one
        request per batch rather than one per item.  Each batch is atomic; if one fails, the
        batches before it stay queued.
        """
        payloads = [self._check(d, priority) for d in items]
        await self._setup()
        names: list[str] = []
        start = 0
        while start < len(payloads):
            bucket = await self._current_bucket()
            room = max(1, self.bucket_size - 1 - self._bucket_hint)
            end, size = start, 0
            while end < len(payloads) and end - start < min(room, _BATCH_OPS):
                if end > start and size + len(payloads[end]) > _BATCH_BYTES:
                    break
                size += len(payloads[end])
                end += 1
            created = await self._create_batch(bucket, payloads[start:end], priority)
            if created is None:  # the bucket was removed meanwhile: find the newest again
                self._bucket = None
                continue
            names.extend(await self._settle(bucket, created, payloads[start:end], priority))
            start = end
        if names:
            log.debug("queue.put", path=self.path, items=len(names), priority=priority)
        return names

    async def _create_batch(
        self, bucket: str, payloads: list[bytes], priority: int
    ) -> list[str] | None:
        prefix = f"{self.items_root}/{bucket}/{item_prefix(priority)}"
        try:
            if len(payloads) == 1:
                return [await self.session.create(prefix, payloads[0], sequence=True)]
            txn = self.session.transaction()
            for data in payloads:
                txn.create(prefix, data, sequence=True)
            return list(await txn.commit())
        except errors.NoNodeError:
            return None
        except errors.TransactionFailedError as exc:
            if isinstance(exc.cause, errors.NoNodeError):
                return None
            raise

    async def _settle(
        self, bucket: str, created: list[str], payloads: list[bytes], priority: int
    ) -> list[str]:
        """Close a full bucket and move items created past its capacity."""
        names = []
        top = max(int(p[-10:]) for p in created)
        if self._bucket == bucket:
            self._bucket_hint = max(self._bucket_hint, top)
        if top >= self.bucket_size - 1 and self._bucket == bucket:
            await self._open_next(bucket)
        for path, data in zip(created, payloads, strict=True):
            if int(path[-10:]) >= self.bucket_size:
                path = await self._move(path, data, priority)
            names.append(path[len(self.items_root) + 1:])
        return names

    async def _current_bucket(self) -> str:
        if self._bucket is None:
            names = await self.session.children(self.items_root)
            buckets = sorted(n for n in names if is_bucket(n))
            if buckets:
                self._bucket = buckets[-1]
            else:
                self._bucket = bucket_name(0)
                await self.session.ensure_path(f"{self.items_root}/{self._bucket}")
            self._bucket_hint = -1
        return self._bucket

    async def _open_next(self, full: str) -> None:
        following = bucket_name(bucket_index(full) + 1)
        await self.session.ensure_path(f"{self.items_root}/{following}")
        log.info("queue.bucket_opened", path=self.path, bucket=following)
        self._bucket = following
        self._bucket_hint = -1

    async def _move(self, path: str, data: bytes, priority: int) -> str:
        """Move an item created past its bucket's capacity to the newest bucket.  If a
        consumer claimed it meanwhile (its version moved), it stays: it is being consumed."""
        while True:
            bucket = await self._current_bucket()
            txn = self.session.transaction()
            txn.delete(path, version=0)
            txn.create(f"{self.items_root}/{bucket}/{item_prefix(priority)}", data, sequence=True)
            try:
                results = await txn.commit()
            except errors.TransactionFailedError as exc:
                if exc.failed_index == 1:  # the newest bucket went away: look again
                    self._bucket = None
                    continue
                return path
            moved = str(results[1])
            if int(moved[-10:]) >= self.bucket_size - 1 and self._bucket == bucket:
                await self._open_next(bucket)
            return moved

    # ================================================================ consumers

    @asynccontextmanager
    async def take(self) -> AsyncIterator[QueueItem]:
        """Wait for an item, claim it and run the block with it (see the module doc)."""
        await self._setup()
        claim = await self._claim()
        entry = claim.entry
        item = QueueItem(entry.key, claim.data, entry.priority, claim.version)
        try:
            async with node_scope(
                self.session, claim.claim_path, session_id=claim.session_id, error=ClaimLost
            ):
                yield item
        except BaseException as exc:
            await self._fail(claim, exc)
            raise
        await self._ack(claim)

    def _get_view(self) -> QueueView:
        if self._view is None:
            self._view = QueueView(self.session, self.items_root, self.claims_root)
        return self._view

    async def _claim(self) -> _Claim:
        """Claim the first unclaimed item of an up-to-date list.

        Competing consumers read the same list and go for the same head.  The one that loses
        (its claim's create finds the claim node) does not re-read and race again for the
        next head: it tries a random item among the next few of the same priority, and starts
        its next take the same way, so consumers spread out instead of colliding in lockstep.
        A lone consumer never collides and so takes items in strict order.
        """
        view = self._get_view()
        while True:
            changed = view.changed
            try:
                entries = await view.candidates(self._claiming)
                if not entries:
                    await changed.wait()
                    continue
                # after a contended take, start at a random item near the head right away
                index = _spread(entries, -1) if self._contended else 0
                self._contended = False
                while index < len(entries):
                    entry = entries[index]
                    if entry.key in self._claiming:
                        index += 1
                        continue
                    self._claiming.add(entry.key)
                    try:
                        claim = await self._try_claim(view, entry)
                    finally:
                        self._claiming.discard(entry.key)
                    if claim is not None:
                        return claim
                    self._contended = True
                    index = _spread(entries, index)
            except (errors.ConnectionLossError, errors.SessionExpiredError):
                view.invalidate_all()
                await self.session.wait_connected()

    async def _try_claim(self, view: QueueView, entry: Entry) -> _Claim | None:
        session = self.session
        item_path = f"{self.items_root}/{entry.key}"
        try:
            data, stat = await session.get(item_path)
        except errors.NoNodeError:
            view.forget(entry)
            return None
        if self.max_attempts is not None and stat.version >= self.max_attempts:
            await self._bury_unclaimed(entry, data, stat.version)
            return None
        session_id = await session.wait_connected()
        claim_path = f"{self.claims_root}/{entry.claim_name}"
        txn = session.transaction()
        txn.create(claim_path, self._owner, ephemeral=True)
        txn.set(item_path, data, version=stat.version)
        try:
            await txn.commit()
        except errors.TransactionFailedError:
            return None  # claimed (or changed) by someone else
        except errors.ConnectionLossError:
            await session.wait_connected()
            mine = await session.exists(claim_path)
            if mine is None or mine.ephemeralOwner != session_id:
                return None
        log.debug("queue.claimed", path=self.path, item=entry.key, attempt=stat.version + 1)
        return _Claim(entry, data, stat.version + 1, claim_path, session_id)

    async def _ack(self, claim: _Claim) -> None:
        """Delete claim and item in one transaction that holds only while the claim is ours."""
        item_path = f"{self.items_root}/{claim.entry.key}"
        with trio.CancelScope(shield=True):
            while True:
                txn = self.session.transaction()
                txn.delete(claim.claim_path).delete(item_path, version=claim.version)
                try:
                    await txn.commit()
                    log.debug("queue.acked", path=self.path, item=claim.entry.key)
                    return
                except errors.TransactionFailedError:
                    break
                except errors.SessionExpiredError:
                    break
                except errors.ConnectionLossError:
                    session_id = await self.session.wait_connected()
                    if await self.session.exists(item_path) is None:
                        return  # our transaction was applied
                    if session_id != claim.session_id:
                        break
        log.warning("queue.claim_lost", path=self.path, item=claim.entry.key, during="ack")
        raise ClaimLost("the claim ended before the item was acknowledged; it will be redelivered")

    async def _fail(self, claim: _Claim, exc: BaseException) -> None:
        """Release the claim after a failed delivery, or dead-letter the item."""
        entry = claim.entry
        item_path = f"{self.items_root}/{entry.key}"
        bury = (
            self.max_attempts is not None
            and claim.version >= self.max_attempts
            and isinstance(exc, Exception)
            and not isinstance(exc, ClaimLost)
        )
        with trio.CancelScope(shield=True) as scope:
            scope.deadline = trio.current_time() + max(self.session.session_timeout, 1.0) + 1.0
            if bury:
                await self.session.ensure_path(self.dead_letter)
            while True:
                txn = self.session.transaction()
                if bury:
                    txn.delete(claim.claim_path)
                    txn.delete(item_path, version=claim.version)
                    txn.create(self._dead_path(entry, claim.version), claim.data)
                else:
                    txn.check(item_path, claim.version).delete(claim.claim_path)
                try:
                    await txn.commit()
                except errors.ConnectionLossError:
                    await self.session.wait_connected()
                    if await self.session.exists(claim.claim_path) is None:
                        return
                    continue
                except (errors.ZooKeeperError, errors.NotConnectedError):
                    return  # the claim is gone already: nothing of ours to release
                break
        if bury:
            log.warning("queue.dead_lettered", path=self.path, item=entry.key,
                        attempts=claim.version, error=repr(exc))
        else:
            log.info("queue.released", path=self.path, item=entry.key,
                     attempt=claim.version, error=type(exc).__name__)

    async def _bury_unclaimed(self, entry: Entry, data: bytes, deliveries: int) -> None:
        """Dead-letter an item already delivered ``max_attempts`` times (its last consumer
        crashed), atomically and only if nobody holds a claim on it."""
        await self.session.ensure_path(self.dead_letter)
        claim_path = f"{self.claims_root}/{entry.claim_name}"
        txn = self.session.transaction()
        txn.create(claim_path, self._owner, ephemeral=True).delete(claim_path)
        txn.delete(f"{self.items_root}/{entry.key}", version=deliveries)
        txn.create(self._dead_path(entry, deliveries), data)
        try:
            await txn.commit()
            log.warning("queue.dead_lettered", path=self.path, item=entry.key,
                        attempts=deliveries, error="consumer crashed")
        except errors.TransactionFailedError:
            pass

    def _dead_path(self, entry: Entry, attempts: int) -> str:
        return f"{self.dead_letter}/{entry.claim_name}.{attempts}"

    # ================================================================ inspection

    async def size(self) -> int:
        """Items in the queue, including those being processed (claimed, not yet acked)."""
        try:
            names = await self.session.children(self.items_root)
        except errors.NoNodeError:
            return 0
        counts: list[int] = []

        async def count(bucket: str) -> None:
            stat = await self.session.exists(f"{self.items_root}/{bucket}")
            counts.append(stat.numChildren if stat else 0)

        await gather(*[_bind(count, b) for b in names if is_bucket(b)])
        return sum(counts)

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


#: After a lost race, the next attempt is drawn from this many following items.
_SPREAD = 8


def _spread(entries: list[Entry], lost: int) -> int:
    """The index to try after losing the race for ``entries[lost]``: a random one among
    the next ``_SPREAD`` items of the same priority (or simply the next one)."""
    priority = entries[max(lost, 0)].priority
    end = lost + 1
    while end < len(entries) and end - lost <= _SPREAD and entries[end].priority == priority:
        end += 1
    return random.randrange(lost + 1, end) if end > lost + 1 else lost + 1


def _bind(fn: Any, arg: str) -> Any:
    async def call() -> None:
        await fn(arg)

    return call

