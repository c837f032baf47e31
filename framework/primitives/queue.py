"""A work queue with priorities and at-least-once delivery (seed: queues, priority queues).

Producers add persistent sequential items named ``i<priority>-<token>-NNNNNNNNNN``; consumers
take the lowest priority value first, oldest first, from an up-to-date children list (see
:mod:`framework.primitives.queue_view` for the layout and the watched view).

Puts survive lost replies: the ``token`` in every item's name is a GUID, so after a
``ConnectionLossError`` the producer lists the bucket and adopts the item it finds instead of
creating a second one.  (If consumers took and acknowledged the item before the producer could
look, it cannot be told from one never written and is put again: puts stay at-least-once.)

Delivery is at-least-once:

* claim: one transaction creates the consumer's *ephemeral* claim node and bumps the item's
  version (the version counts deliveries, so crashed deliveries count too);
* clean exit from ``async with queue.take() as item:`` acknowledges: one transaction deletes
  the claim and the item *at the version we claimed*, so it succeeds only while the claim is
  still ours - an item is never deleted twice, and never by a consumer that lost its claim.
  An acknowledgement is reported only when it is proven: if its reply is lost and the session
  changes meanwhile, or it cannot be confirmed within the session timeout (plus a second),
  :class:`ClaimLost` is raised (the item is delivered again unless that ack did apply);
* an exception releases the claim (the item is delivered again), or moves the item to the
  dead-letter path once ``max_attempts`` deliveries have been made, or at once for
  :class:`~framework.errors.PermanentFailure` (retrying cannot help);
* a ``take()`` cancelled before its block starts (even while the claim's request is in
  flight, or while its outcome is being checked after a lost reply) removes a claim it may
  have made and restores the item's delivery count, so the item is not stuck and the
  delivery that never reached a handler is not counted;
* a crashed consumer's claims vanish with its session, and the item is delivered again.

Consumers wait on watches, never poll.  Every waiting consumer, in every process, is woken
by the same watch and competes for the head of the queue, so none is starved (fair); one that
loses a race tries a random item among the next few instead of racing for the next head in
lockstep, so competitors spread out.  Within a process, consumer tasks sharing a
``WorkQueue`` share one view and never compete for the same item.  A lone consumer takes
items in strict order.

Large queues: items live in buckets ``items/b-NNNNNNNNNN``.  A bucket is closed once its
sequence counter reaches ``bucket_size`` (ZooKeeper counts every create in it); an item that
gets a number at or past ``bucket_size`` (a concurrent or stale producer's) is moved by its
producer to the newest bucket - and on again, if it lands past that one's capacity too -
before ``put`` returns.  The exact bound: a bucket holds at most ``bucket_size`` items, plus
items created past its capacity that are not moved yet.  Those exist only while the puts that
made them are in flight, except an item that a consumer claimed before its producer could
move it, or whose producer died first: it stays where it is until it is consumed (it is
delivered normally).  So once puts have returned, and without consumers racing them, no
bucket holds more than ``bucket_size`` items.  Priority order holds within the oldest bucket
that still holds unclaimed work - that is, across the whole queue while it holds fewer than
``bucket_size`` items.  The bound: an urgent item waits behind at most the unclaimed items of
the buckets older than its own (fewer than ``bucket_size`` per bucket), whatever their
priority.

Leases (``lease=``): see :mod:`framework.primitives.queue_lease`.
"""

from __future__ import annotations

import functools
import math
import os
import random
import socket
import uuid
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Callable, Iterable

import attrs
import trio

from framework import errors
from framework.errors import ClaimLost, ConfigurationError, DataTooLargeError, PermanentFailure
from framework.logs import get_logger
from framework.primitives.holding import node_scope
from framework.primitives.queue_lease import LeaseBreaker, Renewal, lease_token, renew
from framework.primitives.queue_view import (
    Entry,
    QueueView,
    bucket_index,
    bucket_name,
    gather,
    is_bucket,
    item_name_prefix,
    item_token,
    parse_item,
)
from framework.zk import (
    MAX_DATA_BYTES,
    Session,
    Transaction,
    cleanup_bound,
    cleanup_scope,
    create_protected,
    delete_guid_nodes,
    new_guid,
    validate_path,
)

log = get_logger("framework.primitives.queue")

#: Items per multi-op in ``put_many`` (and its byte budget), well under ZooKeeper's 1 MB.
_BATCH_OPS = 500
_BATCH_BYTES = 512 * 1024
#: Batches of one ``put_many`` in flight at once.
_PIPELINE = 4
#: Largest ``bucket_size``: a bucket's listing must stay under ZooKeeper's 1 MB reply limit
#: (Java clients cannot read more) with names of up to ~45 bytes.
MAX_BUCKET_SIZE = 20_000
#: An abandoned claim restores its item's delivery count exactly up to this many deliveries
#: (one operation per delivery); beyond that the lost delivery stays counted.
_RESTORE_MAX = 64


@attrs.frozen
class QueueItem:
    """One delivery of an item.

    ``name`` identifies the item (``b-0000000000/i+0-<token>-0000000042``); ``attempts``
    counts its deliveries including this one (for a dead letter: the deliveries made before
    it died).
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
    token: bytes  # the claim node's data: tells our claim from any other


@attrs.define
class _Batch:
    """Items ``start:end`` of a ``put_many`` call, sent as one request."""

    start: int
    end: int
    tokens: list[str]
    outcome: Any = None  # the created paths, or the error the request ended with


@attrs.define
class _Chain:
    """An ephemeral node whose version orders the pipelined batches of one ``put_many``.

    Batch ``k`` of a round sets it at version ``version + k``: a batch can be applied only
    after every batch before it, so the applied batches are always a prefix - whatever was
    lost on the way - and the node's version says how long that prefix is.
    """

    guid: str
    path: str
    version: int = 0
    alive: bool = True


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
    again (a visibility timeout: see :mod:`framework.primitives.queue_lease`); every user
    of the queue should set the same lease.

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
        bucket_size: int = 10_000,
        max_item_bytes: int = 64 * 1024,
        max_attempts: int | None = None,
        dead_letter: str | None = None,
        lease: float | None = None,
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
        self.session = session
        self.path = path
        self.lease = float(lease) if lease is not None else None
        self.bucket_size = bucket_size
        self.max_item_bytes = max_item_bytes
        self.max_attempts = max_attempts
        self.dead_letter = dead_letter or f"{path}/dead"
        self.items_root = f"{path}/items"
        self.claims_root = f"{path}/claims"
        self.puts_root = f"{path}/puts"
        self._owner = f"{socket.gethostname()}:{os.getpid()}"
        self._ready = False
        self._view: QueueView | None = None
        self._claiming: set[str] = set()
        self._contended = False  # the last claim lost a race to another consumer
        self._breaker = LeaseBreaker(session, self.claims_root)
        self._renewals: dict[str, Renewal] = {}
        self._bucket: str | None = None  # where this producer puts
        self._bucket_hint = -1  # highest sequence number known taken in it

    async def _setup(self) -> None:
        if not self._ready:
            await gather(
                lambda: self.session.ensure_path(self.items_root),
                lambda: self.session.ensure_path(self.claims_root),
            )
            self._ready = True

    # ================================================================ producers

    def _check(self, data: bytes) -> bytes:
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise DataTooLargeError(
                f"queue items must be bytes, got {type(data).__name__} (encode it first)"
            )
        if len(data) > self.max_item_bytes:
            raise DataTooLargeError(
                f"queue item is {len(data):,} bytes; this queue accepts at most "
                f"{self.max_item_bytes:,} (store large payloads elsewhere and queue a reference)"
            )
        return bytes(data)

    @staticmethod
    def _check_priority(priority: int) -> None:
        if isinstance(priority, bool) or not isinstance(priority, int) or abs(priority) >= 10**9:
            raise ConfigurationError(f"priority must be an int below 10**9 in size: {priority!r}")

    async def put(self, data: bytes, *, priority: int = 0) -> str:
        """Add one item; return its name."""
        return (await self.put_many([data], priority=priority))[0]

    async def put_many(self, items: Iterable[bytes], *, priority: int = 0) -> list[str]:
        """Add items in order; return their names.

        Items are written in multi-op batches (up to 500 items or 512 KiB per request), and
        up to four batches are in flight at once.  Order still holds: each batch also bumps
        an ephemeral node of this call at the version the batch before it left, so batches
        are applied in order or not at all, and those after a lost one are sent again after
        it.  Each batch is atomic; if the call fails, a prefix of the items stays queued.
        After a lost reply whose batch was applied but entirely consumed before it could be
        found, names of that batch come back without their sequence number.
        """
        if isinstance(items, (bytes, bytearray, memoryview, str)):
            raise ConfigurationError(
                "put_many() takes an iterable of items (bytes each); use put() for one item"
            )
        self._check_priority(priority)
        payloads = [self._check(d) for d in items]
        await self._setup()
        names: list[str] = []
        chain: _Chain | None = None
        try:
            start = 0
            while start < len(payloads):
                bucket = await self._current_bucket()
                room = self.bucket_size - 1 - self._bucket_hint
                if room <= 0:  # known full: go to the next bucket first
                    await self._advance(bucket)
                    continue
                batches = _plan(payloads, start, room)
                if len(batches) > 1 and chain is None:
                    chain = await self._open_chain()
                ordered = chain if len(batches) > 1 else None
                await self._send_round(bucket, priority, batches, payloads, ordered)
                applied, verdict = await self._conclude(bucket, priority, batches, ordered)
                if chain is not None and not chain.alive:
                    chain = None  # gone with an expired session: a new one if needed
                end = batches[applied - 1].end if applied else start
                created = [path for batch in batches[:applied] for path in batch.outcome]
                names.extend(await self._settle(bucket, created, payloads[start:end], priority))
                start = end
                if verdict == "bucket gone":
                    self._bucket = None
        finally:
            if chain is not None:
                await delete_guid_nodes(self.session, self.puts_root, chain.guid)
        if names:
            log.debug("queue.put", path=self.path, items=len(names), priority=priority)
        return names

    async def _open_chain(self) -> _Chain:
        guid = new_guid()
        while True:
            try:
                path = await create_protected(
                    self.session, self.puts_root, "p-", b"", guid=guid, ephemeral=True,
                    sequence=False, makepath=True,
                )
                return _Chain(guid, path)
            except errors.SessionExpiredError:
                await self.session.wait_connected()
            except BaseException:
                await delete_guid_nodes(self.session, self.puts_root, guid)
                raise

    async def _send_round(
        self, bucket: str, priority: int, batches: list[_Batch], payloads: list[bytes],
        chain: _Chain | None,
    ) -> None:
        """Send the batches, each setting its ``outcome``; several at once with a chain."""
        if chain is None:
            for batch in batches:
                batch.outcome = await self._send(bucket, priority, batch, payloads, None, 0)
            return
        turns = [trio.Event() for _ in batches]
        turns[0].set()
        window = trio.Semaphore(_PIPELINE)

        async def send(k: int, batch: _Batch) -> None:
            try:
                await turns[k].wait()
                if k + 1 < len(turns):
                    turns[k + 1].set()
                # No checkpoint from here until the request is handed to kazoo (a free
                # in-flight slot and a live connection cost none), so batches usually leave
                # in order; when they do not, the chain makes the early one fail, harmlessly.
                batch.outcome = await self._send(bucket, priority, batch, payloads, chain, k)
            finally:
                window.release()

        async with trio.open_nursery() as nursery:
            for k, batch in enumerate(batches):
                await window.acquire()
                nursery.start_soon(send, k, batch)

    async def _send(
        self, bucket: str, priority: int, batch: _Batch, payloads: list[bytes],
        chain: _Chain | None, k: int,
    ) -> list[str] | Exception:
        parent = f"{self.items_root}/{bucket}"
        data = payloads[batch.start:batch.end]
        try:
            if chain is None and len(data) == 1:
                prefix = item_name_prefix(priority, batch.tokens[0])
                return [await self.session.create(f"{parent}/{prefix}", data[0], sequence=True)]
            txn = self.session.transaction()
            if chain is not None:
                txn.set(chain.path, b"", version=chain.version + k)
            for token, payload in zip(batch.tokens, data, strict=True):
                txn.create(f"{parent}/{item_name_prefix(priority, token)}", payload,
                           sequence=True)
            results = await txn.commit()
            return [str(r) for r in results[0 if chain is None else 1:]]
        except Exception as exc:  # judged by _conclude, in order
            return exc

    async def _conclude(
        self, bucket: str, priority: int, batches: list[_Batch], chain: _Chain | None
    ) -> tuple[int, str | None]:
        """How many leading batches were applied (their outcomes become the paths created),
        and why the next one was not (``None``: all were)."""
        first = next((k for k, b in enumerate(batches) if not isinstance(b.outcome, list)),
                     len(batches))
        if first == len(batches):
            if chain is not None:
                chain.version += len(batches)
            return first, None
        for batch in batches[first:]:
            exc = batch.outcome
            if isinstance(exc, Exception) and not _expected_put_error(exc, chain):
                raise exc
        applied = first
        if chain is not None or any(_in_doubt(b.outcome) for b in batches[first:]):
            applied = await self._recover(bucket, priority, batches, first, chain)
        if applied == len(batches):
            return applied, None
        exc = batches[applied].outcome
        if isinstance(exc, errors.NoNodeError) or (
            isinstance(exc, errors.TransactionFailedError)
            and (chain is None or exc.failed_index > 0)
        ):
            return applied, "bucket gone"  # a consumer dropped it: we were writing to an old one
        return applied, "again"  # lost, or after a lost one: send again, in order

    async def _recover(
        self, bucket: str, priority: int, batches: list[_Batch], first: int,
        chain: _Chain | None,
    ) -> int:
        """After lost replies: find which batches were applied - by the chain's version
        while it lives, else by the GUIDs in the bucket - and fill in their paths."""
        parent = f"{self.items_root}/{bucket}"
        doubt = any(_in_doubt(b.outcome) for b in batches[first:])
        while True:
            try:
                await self.session.wait_connected()
                listed: list[str] = []
                if doubt:
                    await self.session.sync(parent)
                    try:
                        listed = await self.session.children(parent)
                    except errors.NoNodeError:
                        pass
                chain_stat = None
                if chain is not None:
                    chain_stat = await self.session.exists(chain.path)
                break
            except (errors.ConnectionLossError, errors.SessionExpiredError):
                continue
        found = {item_token(name): name for name in listed}
        applied = first
        if chain is not None:
            if chain_stat is None:
                chain.alive = False
            else:
                applied = max(applied, chain_stat.version - chain.version)
                chain.version = chain_stat.version
        for k in range(first, len(batches)):
            outcome = batches[k].outcome
            if isinstance(outcome, list) or any(t in found for t in batches[k].tokens):
                applied = max(applied, k + 1)
        for batch in batches[first:applied]:
            if not isinstance(batch.outcome, list):
                batch.outcome = _recovered_paths(parent, priority, batch.tokens, found)
        if applied > first:
            log.info("queue.put_recovered", path=self.path, bucket=bucket,
                     batches=applied - first)
        return applied

    async def _settle(
        self, bucket: str, created: list[str], payloads: list[bytes], priority: int
    ) -> list[str]:
        """Close a full bucket and move items created past its capacity (in order)."""
        seqs = [_sequence(path) for path in created]
        known = [s for s in seqs if s is not None]
        if known and self._bucket == bucket:
            top = max(known)
            self._bucket_hint = max(self._bucket_hint, top)
            if top >= self.bucket_size - 1:
                await self._advance(bucket)
        names = []
        for path, seq, data in zip(created, seqs, payloads, strict=True):
            if seq is not None and seq >= self.bucket_size:
                path = await self._move(path, data, priority)
            names.append(path[len(self.items_root) + 1:])
        return names

    async def _current_bucket(self) -> str:
        if self._bucket is None:
            names = await self.session.children(self.items_root)
            buckets = sorted(n for n in names if is_bucket(n))
            if not buckets:
                buckets = [bucket_name(0)]
                await self.session.ensure_path(f"{self.items_root}/{buckets[0]}")
            await self._adopt(buckets[-1])
        assert self._bucket is not None
        return self._bucket

    async def _adopt(self, bucket: str) -> None:
        """Write to ``bucket`` from now on, knowing a lower bound of the highest sequence
        number used in it.  The server numbers children by creates only, while ``cversion``
        counts creates and deletes: so creates >= max(children, cversion / 2).  A lower
        bound never closes a bucket early; an item numbered past the capacity is moved
        (see ``_settle``), and the first put tells the exact number."""
        stat = await self.session.exists(f"{self.items_root}/{bucket}")
        self._bucket = bucket
        created = max(stat.numChildren, (stat.cversion + 1) // 2) if stat is not None else 0
        self._bucket_hint = created - 1

    async def _advance(self, full: str) -> None:
        """``full`` is closed: write to the newest bucket after it, opening one if none."""
        names = await self.session.children(self.items_root)
        newer = sorted(
            n for n in names if is_bucket(n) and bucket_index(n) > bucket_index(full)
        )
        if newer:
            await self._adopt(newer[-1])
            return
        following = bucket_name(bucket_index(full) + 1)
        await self.session.ensure_path(f"{self.items_root}/{following}")
        log.info("queue.bucket_opened", path=self.path, bucket=following)
        await self._adopt(following)

    async def _move(self, path: str, data: bytes, priority: int) -> str:
        """Move an item created past its bucket's capacity to a newer bucket with room, and
        on again if it lands past that one's capacity too.  If a consumer claimed it
        meanwhile (its version moved), it stays: it is being consumed."""
        source, node = path.split("/")[-2:]
        token = item_token(node)
        while True:
            bucket = await self._current_bucket()
            if bucket_index(bucket) <= bucket_index(source):
                await self._advance(source)
                continue
            parent = f"{self.items_root}/{bucket}"
            txn = self.session.transaction()
            txn.delete(path, version=0)
            txn.create(f"{parent}/{item_name_prefix(priority, token)}", data, sequence=True)
            try:
                moved: str | None = str((await txn.commit())[1])
            except errors.TransactionFailedError as exc:
                if exc.failed_index == 1:  # that bucket went away: look again
                    self._bucket = None
                    continue
                return path  # claimed or consumed meanwhile: it stays
            except (errors.ConnectionLossError, errors.SessionExpiredError):
                moved = await self._find_moved(parent, token, path)
                if moved is None:
                    continue  # not applied: again
                if moved == "":
                    return path  # consumed meanwhile
            assert moved is not None
            seq = int(moved[-10:])
            if self._bucket == bucket:
                self._bucket_hint = max(self._bucket_hint, seq)
                if seq >= self.bucket_size - 1:
                    await self._advance(bucket)
            log.debug("queue.item_moved", path=self.path, item=path, to=moved)
            if seq < self.bucket_size:
                return moved
            path, source = moved, bucket  # past this bucket's capacity too: move on

    async def _find_moved(self, parent: str, token: str, old: str) -> str | None:
        """After a lost reply to a move: the new path, ``""`` if the item is gone (consumed),
        ``None`` if the move did not happen."""
        while True:
            try:
                await self.session.wait_connected()
                await self.session.sync(parent)
                try:
                    names = await self.session.children(parent)
                except errors.NoNodeError:
                    names = []
                for name in names:
                    if item_token(name) == token:
                        return f"{parent}/{name}"
                return None if await self.session.exists(old) is not None else ""
            except (errors.ConnectionLossError, errors.SessionExpiredError):
                continue

    # ================================================================ consumers

    @asynccontextmanager
    async def take(self, *, renew_for: float | None = None) -> AsyncIterator[QueueItem]:
        """Wait for an item, claim it and run the block with it (see the module doc).

        With a ``lease``, the claim is renewed while the block runs, for at most
        ``renew_for`` seconds (default: as long as it runs); a claim not renewed for a whole
        lease is broken by an idle consumer, the block is cancelled with :class:`ClaimLost`
        and the item is delivered again (:mod:`framework.primitives.queue_lease`)."""
        await self._setup()
        claim = await self._claim()
        entry = claim.entry
        item = QueueItem(entry.key, claim.data, entry.priority, claim.version)
        keepalive = None
        if self.lease is not None:
            renewal = self._renewals[entry.key] = Renewal()
            if renew_for is not None:
                renewal.until = trio.current_time() + renew_for
            keepalive = functools.partial(
                renew, self.session, claim.claim_path, claim.token, self.lease, renewal
            )
        started = False
        try:
            async with node_scope(
                self.session, claim.claim_path, session_id=claim.session_id, error=ClaimLost,
                keepalive=keepalive,
            ):
                started = True
                yield item
        except BaseException as exc:
            self._renewals.pop(entry.key, None)
            await self._fail(claim, exc, started=started)
            raise
        self._renewals.pop(entry.key, None)
        await self._ack(claim)

    def renew_for(self, item: QueueItem, seconds: float) -> None:
        """Renew the lease of ``item`` (held by this queue object) for at most ``seconds``
        more: a holder that cannot stop a stuck handler still lets the item go."""
        renewal = self._renewals.get(item.name)
        if renewal is not None:
            renewal.until = trio.current_time() + seconds

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
                    # nothing to take: the moment to break leases that ran out (if any
                    # can run out, wake up when the next one could)
                    expiry = math.inf
                    if self.lease is not None:
                        expiry = await self._breaker.check(await view.claims())
                    with trio.move_on_at(expiry):
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
                    if isinstance(claim, _Claim):
                        return claim
                    if claim is _GONE:  # our list was older than that item's end: next one
                        index += 1
                        continue
                    self._contended = True
                    index = _spread(entries, index)
            except (errors.ConnectionLossError, errors.SessionExpiredError):
                view.invalidate_all()
                await self.session.wait_connected()

    async def _try_claim(self, view: QueueView, entry: Entry) -> _Claim | object | None:
        """Our claim; ``_GONE`` if the item is gone (acked, or dead-lettered now); ``None``
        if another consumer claimed it first."""
        session = self.session
        item_path = f"{self.items_root}/{entry.key}"
        try:
            data, stat = await session.get(item_path)
        except errors.NoNodeError:
            view.forget(entry)
            return _GONE
        if self.max_attempts is not None and stat.version >= self.max_attempts:
            await self._bury_unclaimed(entry, data, stat.version)
            return _GONE
        session_id = await session.wait_connected()
        claim = _Claim(
            entry, data, stat.version + 1, f"{self.claims_root}/{entry.claim_name}",
            session_id, lease_token(f"{self._owner}:{uuid.uuid4().hex[:16]}", self.lease),
        )
        txn = session.transaction()
        txn.create(claim.claim_path, claim.token, ephemeral=True)
        txn.set(item_path, data, version=stat.version)
        try:
            try:
                await txn.commit()
            except errors.TransactionFailedError:
                return None  # claimed (or changed) by someone else
            except errors.SessionExpiredError:
                return None  # whatever it made went with that session
            except errors.ConnectionLossError:
                if not await self._holds(claim):
                    return None
        except BaseException:
            # interrupted (cancelled, most likely) while the claim may exist: a claim left
            # behind would block the item for everyone as long as this session lives
            await self._abandon(claim)
            raise
        log.debug("queue.claimed", path=self.path, item=entry.key, attempt=claim.version)
        return claim

    async def _holds(self, claim: _Claim) -> bool:
        """Whether our claim node exists, in the session that made it (after a lost reply)."""
        if await self.session.wait_connected() != claim.session_id:
            return False
        await self.session.sync(claim.claim_path)
        try:
            data, stat = await self.session.get(claim.claim_path)
        except errors.NoNodeError:
            return False
        return data == claim.token and stat.ephemeralOwner == claim.session_id

    async def _abandon(self, claim: _Claim) -> None:
        """Undo a claim that may have been made by an interrupted take (shielded, bounded):
        if it exists, delete it and restore the item's delivery count."""
        why: str | None = "absent"
        with cleanup_scope(self.session) as scope:
            try:
                if await self._holds(claim):
                    why = await self._finish(
                        claim, functools.partial(self._restore_transaction, claim)
                    )
            except errors.ZooKeeperError:
                why = "lost"  # the session ended: so did the claim
        if scope.cancelled_caught:
            log.warning("queue.claim_left", path=self.path, item=claim.entry.key,
                        note="not removed within the session timeout; goes with the session")
        elif why is None:
            log.info("queue.claim_abandoned", path=self.path, item=claim.entry.key)

    def _restore_transaction(self, claim: _Claim) -> Transaction:
        """Delete our claim and put the item back as it was before it: a node's version
        cannot go down, so the item is recreated (same name, same data) and set again up to
        the delivery count it had.  Atomic, and valid only while the item is at our
        version (so only while the claim is ours)."""
        item_path = f"{self.items_root}/{claim.entry.key}"
        before = claim.version - 1
        txn = self.session.transaction()
        if before > _RESTORE_MAX:
            return txn.check(item_path, claim.version).delete(claim.claim_path)
        txn.delete(claim.claim_path).delete(item_path, version=claim.version)
        txn.create(item_path, claim.data if before == 0 else b"")
        for version in range(before):
            txn.set(item_path, claim.data if version == before - 1 else b"", version=version)
        return txn

    async def _finish(self, claim: _Claim, build: Callable[[], Transaction]) -> str | None:
        """Commit ``build()`` - a transaction that ends our claim and holds only while the
        item is at our version - and confirm it.  ``None`` once it is proven applied, else
        why not: ``"lost"`` (the session, and so the claim, ended first), ``"ended"`` (the
        claim ended), ``"unknown"`` (the reply was lost and the session changed before we
        could look).  Callers bound it in time."""
        while True:
            if self.session.session_id != claim.session_id:
                return "lost"
            try:
                await build().commit()
                return None
            except errors.TransactionFailedError:
                return "ended"
            except (errors.SessionExpiredError, errors.NotConnectedError):
                return "unknown"
            except errors.ConnectionLossError:
                pass
            # The reply was lost.  While our session lives, the claim node is ours and only
            # our own transaction removes it: gone means applied.  In another session, an
            # item gone could also be another consumer's ack: we cannot tell.
            try:
                if await self.session.wait_connected() != claim.session_id:
                    return "unknown"
                await self.session.sync(claim.claim_path)
                stat = await self.session.exists(claim.claim_path)
            except (errors.SessionExpiredError, errors.NotConnectedError):
                return "unknown"
            except errors.ConnectionLossError:
                continue
            if stat is None:
                return None
            if stat.ephemeralOwner != claim.session_id:
                return "ended"
            # not applied: send it again

    def _ack_transaction(self, claim: _Claim) -> Transaction:
        """Delete claim and item in one transaction that holds only while the claim is ours."""
        txn = self.session.transaction()
        return txn.delete(claim.claim_path).delete(
            f"{self.items_root}/{claim.entry.key}", version=claim.version
        )

    async def _ack(self, claim: _Claim) -> None:
        """Acknowledge; raise :class:`ClaimLost` unless the ack is proven applied."""
        why: str | None = "unconfirmed"
        with cleanup_scope(self.session) as scope:
            why = await self._finish(claim, functools.partial(self._ack_transaction, claim))
        if scope.cancelled_caught:
            why = "unconfirmed"
        if why is None:
            log.debug("queue.acked", path=self.path, item=claim.entry.key)
            return
        reason = {
            "lost": "the session ended before the item was acknowledged; it will be "
                    "delivered again",
            "ended": "the claim ended before the item was acknowledged; it will be "
                     "delivered again",
            "unknown": "the session changed while the acknowledgement was in flight: it may "
                       "or may not have been applied (if not, the item is delivered again)",
            "unconfirmed": "the acknowledgement was not confirmed within "
                           f"{cleanup_bound(self.session):g}s "
                           "(ZooKeeper unreachable); unless it was applied, the item is "
                           "delivered again",
        }[why]
        log.warning("queue.claim_lost", path=self.path, item=claim.entry.key, during="ack",
                    why=why)
        raise ClaimLost(reason)

    async def _fail(self, claim: _Claim, exc: BaseException, *, started: bool) -> None:
        """End a delivery that did not succeed: release the claim (the item is delivered
        again), dead-letter the item after ``max_attempts``, or - if the block never started
        - undo the delivery altogether."""
        entry = claim.entry
        bury = (
            started
            and isinstance(exc, Exception)
            and not isinstance(exc, ClaimLost)
            and (
                isinstance(exc, PermanentFailure)
                or (self.max_attempts is not None and claim.version >= self.max_attempts)
            )
        )
        why: str | None = "unconfirmed"
        with cleanup_scope(self.session):
            try:
                if bury:
                    await self.session.ensure_path(self.dead_letter)
                    build = self._bury_transaction
                elif started:
                    build = self._release_transaction
                else:
                    build = self._restore_transaction
                why = await self._finish(claim, functools.partial(build, claim))
            except errors.ZooKeeperError:
                why = "lost"
        if why is not None:
            log.info("queue.claim_already_ended", path=self.path, item=entry.key, why=why,
                     error=type(exc).__name__)
        elif bury:
            log.warning("queue.dead_lettered", path=self.path, item=entry.key,
                        attempts=claim.version, error=repr(exc))
        else:
            log.info("queue.released", path=self.path, item=entry.key,
                     attempt=claim.version, error=type(exc).__name__, restored=not started)

    def _release_transaction(self, claim: _Claim) -> Transaction:
        txn = self.session.transaction()
        return txn.check(f"{self.items_root}/{claim.entry.key}", claim.version).delete(
            claim.claim_path
        )

    def _bury_transaction(self, claim: _Claim) -> Transaction:
        txn = self.session.transaction()
        txn.delete(claim.claim_path)
        txn.delete(f"{self.items_root}/{claim.entry.key}", version=claim.version)
        return txn.create(self._dead_path(claim.entry, claim.version), claim.data)

    async def _bury_unclaimed(self, entry: Entry, data: bytes, deliveries: int) -> None:
        """Dead-letter an item already delivered ``max_attempts`` times (its last consumer
        crashed), atomically and only if nobody holds a claim on it."""
        await self.session.ensure_path(self.dead_letter)
        claim_path = f"{self.claims_root}/{entry.claim_name}"
        txn = self.session.transaction()
        txn.create(claim_path, self._owner.encode(), ephemeral=True).delete(claim_path)
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

    async def size(self, *, changed: trio.Event | None = None) -> int:
        """Items in the queue, including those being processed (claimed, not yet acked).

        With ``changed``, watches are left so that the event is set at the next put, ack,
        release to the dead letters or new bucket (this lists every non-empty bucket:
        meant for an observer waiting for the queue to drain, not for a hot path)."""
        session = self.session
        watch = session.waker(changed) if changed is not None else None
        try:
            names = await session.children(self.items_root, watch=watch)
        except errors.NoNodeError:
            if changed is not None and await session.exists(self.items_root, watch=watch):
                changed.set()  # created meanwhile: look again
            return 0
        counts: list[int] = []

        async def count(bucket: str) -> None:
            path = f"{self.items_root}/{bucket}"
            try:
                if watch is not None:
                    counts.append(len(await session.children(path, watch=watch)))
                    return
                stat = await session.exists(path)
                counts.append(stat.numChildren if stat else 0)
            except errors.NoNodeError:
                counts.append(0)

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


def _plan(payloads: list[bytes], start: int, room: int) -> list[_Batch]:
    """Split the next ``room`` items into batches of at most 500 items / 512 KiB."""
    stop = min(len(payloads), start + room)
    batches = []
    begin = start
    while begin < stop:
        end, size = begin, 0
        while end < stop and end - begin < _BATCH_OPS:
            if end > begin and size + len(payloads[end]) > _BATCH_BYTES:
                break
            size += len(payloads[end])
            end += 1
        batch_id = uuid.uuid4().hex[:12]
        batches.append(_Batch(begin, end, [f"{batch_id}{i:04x}" for i in range(end - begin)]))
        begin = end
    return batches


def _in_doubt(outcome: object) -> bool:
    return isinstance(outcome, (errors.ConnectionLossError, errors.SessionExpiredError))


def _expected_put_error(exc: Exception, chain: _Chain | None) -> bool:
    """Errors a put recovers from: lost replies, an old bucket gone, a broken chain."""
    if _in_doubt(exc) or isinstance(exc, errors.NoNodeError):
        return True
    if isinstance(exc, errors.TransactionFailedError):
        if chain is not None and exc.failed_index == 0:
            return isinstance(exc.cause, (errors.BadVersionError, errors.NoNodeError))
        return isinstance(exc.cause, errors.NoNodeError)
    return False


def _recovered_paths(
    parent: str, priority: int, tokens: list[str], found: dict[str, str]
) -> list[str]:
    """The paths of an applied batch, from the names found by token.  The items of one
    multi-op got consecutive sequence numbers, so those already consumed are deduced from
    any one found; if none is left, the names lack their sequence number."""
    known = [(i, found[t]) for i, t in enumerate(tokens) if t in found]
    if not known:
        return [f"{parent}/{item_name_prefix(priority, t)}" for t in tokens]
    index, name = known[0]
    first = int(name[-10:]) - index
    return [
        f"{parent}/{found[t]}" if t in found
        else f"{parent}/{item_name_prefix(priority, t)}{first + i:010d}"
        for i, t in enumerate(tokens)
    ]


def _sequence(path: str) -> int | None:
    tail = path[-10:]
    return int(tail) if len(path) > 10 and tail.isdigit() and path[-11] == "-" else None


#: What ``_try_claim`` returns for an item that is gone.
_GONE = object()

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
