"""The producer part of :class:`~framework.primitives.queue.WorkQueue`: puts, batched and
pipelined, recovered after lost replies by the GUIDs in item names, and the bucket chain.

A ``put_many`` goes in rounds.  A round plans the items into the rest of the lane's current
bucket and as many following buckets as they need (up to ``_ROUND_BUCKETS``), in batches of
up to ``_BATCH_OPS`` items or ``_BATCH_BYTES`` of data, and sends them with up to
``_PIPELINE`` in flight.  The first batch into a following bucket creates that bucket in its
own multi (so a bucket never exists empty because of a put: a consumer drops only old empty
buckets, and this one holds the batch's items from the moment it exists).  If the bucket is
there already - another producer went ahead - that batch is refused whole, and the rest of
the items go to the newest bucket found by a listing, as after a bucket dropped under a put.
A bucket's sequence numbers are known from the replies, so a round costs no request besides
its batches (and a listing when its first bucket is not known yet).
"""

from __future__ import annotations

import enum
import uuid
from typing import Callable, Iterable

import attrs
import trio

from framework import errors
from framework.errors import ConfigurationError, DataTooLargeError
from framework.logs import get_logger
from framework.primitives.queue.core import QueueCore
from framework.primitives.queue.items import Batch, Chain
from framework.primitives.queue.view import (
    bucket_index,
    bucket_lane,
    bucket_name,
    is_bucket,
    item_name_prefix,
    item_token,
)
from framework.zk import (
    Stat,
    Transaction,
    cleanup_scope,
    create_protected,
    delete_guid_nodes,
    new_guid,
)

log = get_logger(__name__)

#: Items per multi-op in ``put_many``, and its byte budget: each item's data and
#: ``_OP_BYTES`` for its operation (path, ACL, headers: about 150 bytes in practice).  A
#: default bucket in one request, well under ZooKeeper's 1 MB (``Transaction`` checks that).
_BATCH_OPS = 1000
_BATCH_BYTES = 512 * 1024
_OP_BYTES = 256
#: Batches of one ``put_many`` in flight at once.
_PIPELINE = 4
#: Buckets one round of ``put_many`` plans its items into (the current one included).
_ROUND_BUCKETS = 8
#: Where an item's name is cut around its token (no token holds it).
_CUT = "\x00"


@attrs.define
class _Put(Batch):
    """A batch of a round, into ``bucket``: ``opens`` - its multi creates that bucket (the
    first batch into a bucket not made yet); ``hint`` - the highest sequence number known
    taken in the bucket before the round (-1: none)."""

    bucket: str = ""
    opens: bool = False
    hint: int = -1


class _Then(enum.Enum):
    """What a round of batches leaves to do."""

    DONE = enum.auto()  # every batch was applied
    AGAIN = enum.auto()  # send the rest again, in order (lost, or after a lost one)
    NEW_BUCKET = enum.auto()  # the bucket is gone (a consumer dropped an old one): find the newest


class Producer:
    """The puts of one queue object (see the package doc for the guarantees).  Its own
    state: per priority lane, the bucket it puts into and the highest sequence number
    known taken in it."""

    def __init__(self, core: QueueCore) -> None:
        self.core = core
        self.session = core.session
        self._bucket_of: dict[int, str] = {}  # per priority lane: where this producer puts
        self._hint_of: dict[int, int] = {}  # highest sequence number known taken in it

    def _check(self, data: bytes) -> bytes:
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise DataTooLargeError(
                f"queue items must be bytes, got {type(data).__name__} (encode it first)"
            )
        limit = self.core.max_item_bytes
        if len(data) > limit:
            raise DataTooLargeError(
                f"queue item is {len(data):,} bytes; this queue accepts at most "
                f"{limit:,} (store large payloads elsewhere and queue a reference)"
            )
        return bytes(data)

    @staticmethod
    def _check_priority(priority: int) -> None:
        if isinstance(priority, bool) or not isinstance(priority, int) or abs(priority) >= 10**9:
            raise ConfigurationError(f"priority must be an int below 10**9 in size: {priority!r}")

    async def put_many(self, items: Iterable[bytes], *, priority: int = 0,
                       also: Callable[[Transaction], None] | None = None) -> list[str]:
        """Add items in order; return their names (``WorkQueue.put_many``)."""
        if isinstance(items, (bytes, bytearray, memoryview, str)):
            raise ConfigurationError(
                "put_many() takes an iterable of items (bytes each); use put() for one item"
            )
        self._check_priority(priority)
        payloads = [self._check(d) for d in items]
        if also is not None and len(payloads) != 1:
            raise ConfigurationError("put_many(also=...) takes exactly one item; use put()")
        await self.core.ensure_layout()
        names: list[str] = []
        chain: Chain | None = None
        try:
            start = 0
            while start < len(payloads):
                batches = await self._plan_round(priority, payloads, start)
                if len(batches) > 1 and chain is None:
                    chain = await self._open_chain()
                ordered = chain if len(batches) > 1 else None
                await self._send_round(batches, payloads, ordered, also)
                applied, then = await self._conclude(priority, batches, ordered)
                if chain is not None and not chain.alive:
                    chain = None  # gone with an expired session: a new one if needed
                names.extend(await self._settle(priority, batches[:applied], payloads))
                start = batches[applied - 1].end if applied else start
                if then is _Then.NEW_BUCKET:
                    self._bucket_of.pop(priority, None)
        finally:
            if chain is not None:
                await self._close_chain(chain)
        if names:
            log.debug("queue.put", path=self.core.path, items=len(names), priority=priority)
        return names

    async def _plan_round(self, lane: int, payloads: list[bytes], start: int) -> list[_Put]:
        """The next round's batches of ``payloads[start:]``: the room left in the lane's
        current bucket, then following buckets (each opened by its first batch), up to
        ``_ROUND_BUCKETS`` buckets."""
        bucket = await self._current_bucket(lane)
        hint = self._hint_of[lane]
        index = bucket_index(bucket)
        opens = False
        batches: list[_Put] = []
        for _ in range(_ROUND_BUCKETS):
            room = self.core.bucket_size - 1 - hint
            if room > 0:
                batches += _plan(payloads, start, room, bucket, hint, opens)
                start = batches[-1].end
                if start >= len(payloads):
                    break
            index += 1
            bucket, hint, opens = bucket_name(index, lane), -1, True
        return batches

    async def _open_chain(self) -> Chain:
        guid = new_guid()
        while True:
            try:
                path = await create_protected(
                    self.session, self.core.puts_root, "p-", b"", guid=guid, ephemeral=True,
                    sequence=False, makepath=True,
                )
                return Chain(guid, path)
            except errors.SessionExpiredError:
                await self.session.wait_connected()
            except BaseException:
                await delete_guid_nodes(self.session, self.core.puts_root, guid)
                raise

    async def _close_chain(self, chain: Chain) -> None:
        """Delete the chain's node by its path (one request), else - the connection lost, a
        new session - by its GUID; shielded and bounded either way (see
        :func:`~framework.zk.delete_guid_nodes`)."""
        with cleanup_scope(self.session) as scope:
            try:
                await self.session.delete(chain.path, missing_ok=True)
                return
            except (errors.ConnectionLossError, errors.SessionExpiredError,
                    errors.NotConnectedError):
                pass
        if scope.cancelled_caught:
            self.session.delete_guid_later(self.core.puts_root, chain.guid)
        else:
            await delete_guid_nodes(self.session, self.core.puts_root, chain.guid)

    async def _send_round(
        self, batches: list[_Put], payloads: list[bytes], chain: Chain | None,
        also: Callable[[Transaction], None] | None = None,
    ) -> None:
        """Send the batches, each setting its ``outcome``; several at once with a chain."""
        if chain is None:
            for batch in batches:
                batch.outcome = await self._send(batch, payloads, None, 0, also)
            return
        turns = [trio.Event() for _ in batches]
        turns[0].set()
        window = trio.Semaphore(_PIPELINE)

        async def send(k: int, batch: _Put) -> None:
            try:
                await turns[k].wait()
                if k + 1 < len(turns):
                    turns[k + 1].set()
                # No checkpoint from here until the request is handed to kazoo (a free
                # in-flight slot and a live connection cost none), so batches usually leave
                # in order; when they do not, the chain makes the early one fail, harmlessly.
                batch.outcome = await self._send(batch, payloads, chain, k)
            finally:
                window.release()

        async with trio.open_nursery() as nursery:
            for k, batch in enumerate(batches):
                await window.acquire()
                nursery.start_soon(send, k, batch)

    async def _send(
        self, batch: _Put, payloads: list[bytes], chain: Chain | None, k: int,
        also: Callable[[Transaction], None] | None = None,
    ) -> list[str] | Exception:
        parent = f"{self.core.items_root}/{batch.bucket}"
        data = payloads[batch.start:batch.end]
        fence = self.core.fence
        extra = 0
        head = (chain is not None) + batch.opens  # operations before the items'
        priority = bucket_lane(batch.bucket)
        try:
            if not head and len(data) == 1 and fence is None and also is None:
                prefix = item_name_prefix(priority, batch.tokens[0])
                return [await self.session.create(f"{parent}/{prefix}", data[0], sequence=True)]
            txn = self.session.transaction()
            if chain is not None:
                txn.set(chain.path, b"", version=chain.version + k)
            if batch.opens:
                txn.create(parent, b"")
            before_token, after_token = f"{parent}/{item_name_prefix(priority, _CUT)}".split(
                _CUT)
            for token, payload in zip(batch.tokens, data, strict=True):
                txn.create(f"{before_token}{token}{after_token}", payload, sequence=True)
            if also is not None:
                before = len(txn.operations)
                also(txn)
                extra = len(txn.operations) - before
            if fence is not None:  # last, so the other operations keep their indexes
                txn.check(*fence)
            results = await txn.commit()
            return [str(r) for r in results[head:head + len(data)]]
        except errors.TransactionFailedError as exc:
            first_also = head + len(data)
            if extra and first_also <= exc.failed_index < first_also + extra:
                return _AlsoRefused(exc.results[first_also:first_also + extra])
            if fence is not None and exc.failed_index == first_also + extra:
                return errors.LeadershipLost(
                    f"put refused: {fence[0]} is no longer at version {fence[1]} "
                    "(a new leader was elected)"
                )
            if batch.opens and exc.failed_index == head - 1:
                return _BucketTaken(exc.results)  # another producer made it: find the newest
            return exc  # judged by _conclude, in order
        except Exception as exc:  # judged by _conclude, in order
            return exc

    async def _conclude(
        self, priority: int, batches: list[_Put], chain: Chain | None
    ) -> tuple[int, _Then]:
        """How many leading batches were applied (their outcomes become the paths created),
        and what to do about the rest."""
        first = next((k for k, b in enumerate(batches) if not isinstance(b.outcome, list)),
                     len(batches))
        if first == len(batches):
            if chain is not None:
                chain.version += len(batches)
            return first, _Then.DONE
        for batch in batches[first:]:
            exc = batch.outcome
            if isinstance(exc, Exception) and not _expected_put_error(exc, chain):
                raise exc
        applied = first
        if chain is not None or any(_in_doubt(b.outcome) for b in batches[first:]):
            applied = await self._recover(priority, batches, first, chain)
        if applied == len(batches):
            return applied, _Then.DONE
        exc = batches[applied].outcome
        if isinstance(exc, errors.NoNodeError) or (
            isinstance(exc, errors.TransactionFailedError)
            and (chain is None or exc.failed_index > 0)
        ):
            return applied, _Then.NEW_BUCKET  # dropped by a consumer, or opened by another
        return applied, _Then.AGAIN  # lost, or after a lost one: send again, in order

    async def _recover(
        self, priority: int, batches: list[_Put], first: int, chain: Chain | None,
    ) -> int:
        """After lost replies: find which batches were applied - by the chain's version
        while it lives, else by the GUIDs in their buckets - and fill in their paths."""
        doubt = any(_in_doubt(b.outcome) for b in batches[first:])
        buckets = sorted({b.bucket for b in batches[first:]}) if doubt else []
        listed, chain_stat = await self._read_after_loss(buckets, chain)
        found = {bucket: {item_token(name): name for name in names}
                 for bucket, names in listed.items()}
        applied = first
        if chain is not None:
            if chain_stat is None:
                chain.alive = False
            else:
                applied = max(applied, chain_stat.version - chain.version)
                chain.version = chain_stat.version
        for k in range(first, len(batches)):
            outcome, there = batches[k].outcome, found.get(batches[k].bucket, {})
            if isinstance(outcome, list) or any(t in there for t in batches[k].tokens):
                applied = max(applied, k + 1)
        for batch in batches[first:applied]:
            if not isinstance(batch.outcome, list):
                batch.outcome = _recovered_paths(f"{self.core.items_root}/{batch.bucket}", priority,
                                                 batch.tokens, found.get(batch.bucket, {}))
        if applied > first:
            log.info("queue.put_recovered", path=self.core.path, buckets=buckets,
                     batches=applied - first)
        return applied

    async def _read_after_loss(self, buckets: list[str], chain: Chain | None
                               ) -> tuple[dict[str, list[str]], Stat | None]:
        """What :meth:`_recover` decides from, read once the connection is back (again
        after each loss, in the new session after an expiry): the listing of each of
        ``buckets`` (after a ``sync``, so that it shows every write the server applied),
        and the chain node's stat (``None``: gone)."""
        while True:
            try:
                await self.session.wait_connected()
                listed: dict[str, list[str]] = {}
                if buckets:
                    await self.session.sync(self.core.items_root)
                for bucket in buckets:
                    try:
                        listed[bucket] = await self.session.children(
                            f"{self.core.items_root}/{bucket}")
                    except errors.NoNodeError:
                        listed[bucket] = []
                chain_stat = None
                if chain is not None:
                    chain_stat = await self.session.exists(chain.path)
                return listed, chain_stat
            except (errors.ConnectionLossError, errors.SessionExpiredError):
                continue

    async def _settle(self, lane: int, batches: list[_Put], payloads: list[bytes]
                      ) -> list[str]:
        """After a round's applied ``batches``: write to the last bucket they reached from
        now on, knowing a lower bound of the highest sequence number taken in it (a full one
        makes the next round open the following bucket), and move items created past their
        bucket's capacity (in order).  Their names."""
        top: dict[str, int] = {}
        past: set[int] = set()  # batches with items numbered past their bucket's capacity
        for k, batch in enumerate(batches):
            # one multi's items got rising numbers, all known or none (_recovered_paths)
            last = _sequence(batch.outcome[-1])
            low = top.get(batch.bucket, batch.hint) + len(batch.outcome)
            top[batch.bucket] = low if last is None else max(low, last)
            if last is not None and last >= self.core.bucket_size:
                past.add(k)
        if batches:
            last_bucket, current = batches[-1].bucket, self._bucket_of.get(lane)
            if current is None or bucket_index(last_bucket) > bucket_index(current):
                self._bucket_of[lane], self._hint_of[lane] = last_bucket, top[last_bucket]
            elif last_bucket == current:
                self._hint_of[lane] = max(self._hint_of[lane], top[last_bucket])
        cut = len(self.core.items_root) + 1
        names: list[str] = []
        for k, batch in enumerate(batches):
            if k not in past:
                names += [path[cut:] for path in batch.outcome]
                continue
            for path, data in zip(batch.outcome, payloads[batch.start:batch.end], strict=True):
                seq = _sequence(path)
                if seq is not None and seq >= self.core.bucket_size:
                    path = await self._move(path, data, lane)
                names.append(path[cut:])
        return names

    async def _current_bucket(self, lane: int) -> str:
        """The bucket this producer puts items of priority ``lane`` into (the newest of
        that lane, opened if the lane has none)."""
        if lane not in self._bucket_of:
            names = await self.session.children(self.core.items_root)
            buckets = sorted((n for n in names if is_bucket(n) and bucket_lane(n) == lane),
                             key=bucket_index)
            if not buckets:
                buckets = [bucket_name(0, lane)]
                await self.session.ensure_path(f"{self.core.items_root}/{buckets[0]}")
            await self._adopt(buckets[-1])
        return self._bucket_of[lane]

    async def _adopt(self, bucket: str) -> None:
        """Write to ``bucket`` from now on, knowing a lower bound of the highest sequence
        number used in it.  The server numbers children by creates only, while ``cversion``
        counts creates and deletes: so creates >= max(children, cversion / 2).  A lower
        bound never closes a bucket early; an item numbered past the capacity is moved
        (see ``_settle``), and the first put tells the exact number."""
        stat = await self.session.exists(f"{self.core.items_root}/{bucket}")
        lane = bucket_lane(bucket)
        self._bucket_of[lane] = bucket
        created = max(stat.numChildren, (stat.cversion + 1) // 2) if stat is not None else 0
        self._hint_of[lane] = created - 1

    async def _advance(self, full: str) -> None:
        """``full`` is closed: write to the newest bucket of its lane after it, opening one
        if none."""
        lane = bucket_lane(full)
        names = await self.session.children(self.core.items_root)
        newer = sorted(
            (n for n in names if is_bucket(n) and bucket_lane(n) == lane
             and bucket_index(n) > bucket_index(full)),
            key=bucket_index,
        )
        if newer:
            await self._adopt(newer[-1])
            return
        following = bucket_name(bucket_index(full) + 1, lane)
        await self.session.ensure_path(f"{self.core.items_root}/{following}")
        log.info("queue.bucket_opened", path=self.core.path, bucket=following)
        await self._adopt(following)

    async def _move(self, path: str, data: bytes, priority: int) -> str:
        """Move an item created past its bucket's capacity to a newer bucket with room, and
        on again if it lands past that one's capacity too.  If a consumer claimed it
        meanwhile (its version moved), it stays: it is being consumed."""
        source, node = path.split("/")[-2:]
        token = item_token(node)
        while True:
            bucket = await self._current_bucket(bucket_lane(source))
            if bucket_index(bucket) <= bucket_index(source):
                await self._advance(source)
                continue
            parent = f"{self.core.items_root}/{bucket}"
            txn = self.session.transaction()
            txn.delete(path, version=0)
            txn.create(f"{parent}/{item_name_prefix(priority, token)}", data, sequence=True)
            try:
                moved: str | None = str((await txn.commit())[1])
            except errors.TransactionFailedError as exc:
                if exc.failed_index == 1:  # that bucket went away: look again
                    self._bucket_of.pop(bucket_lane(bucket), None)
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
            lane = bucket_lane(bucket)
            if self._bucket_of.get(lane) == bucket:
                self._hint_of[lane] = max(self._hint_of[lane], seq)
                if seq >= self.core.bucket_size - 1:
                    await self._advance(bucket)
            log.debug("queue.item_moved", path=self.core.path, item=path, to=moved)
            if seq < self.core.bucket_size:
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


def _plan(payloads: list[bytes], start: int, room: int, bucket: str, hint: int,
          opens: bool) -> list[_Put]:
    """Split the next ``room`` items into batches of at most ``_BATCH_OPS`` items /
    ``_BATCH_BYTES`` (their data and ``_OP_BYTES`` each) into ``bucket`` (the first one
    opening it if ``opens``)."""
    stop = min(len(payloads), start + room)
    batches: list[_Put] = []
    begin = start
    while begin < stop:
        end, size = begin, 0
        while end < stop and end - begin < _BATCH_OPS:
            cost = len(payloads[end]) + _OP_BYTES
            if end > begin and size + cost > _BATCH_BYTES:
                break
            size += cost
            end += 1
        batch_id = uuid.uuid4().hex[:12]
        batches.append(_Put(begin, end, [f"{batch_id}{i:04x}" for i in range(end - begin)],
                            bucket=bucket, opens=opens and not batches, hint=hint))
        begin = end
    return batches


class _BucketTaken(errors.TransactionFailedError):
    """A batch's bucket was there already when the batch would open it (another producer
    went ahead): the rest of the items go to the newest bucket."""


class _AlsoRefused(errors.TransactionFailedError):
    """The caller's operations in a put's multi were refused (``failed_index`` counts from
    the first of them): raised to the caller, never retried."""


def _in_doubt(outcome: object) -> bool:
    return isinstance(outcome, (errors.ConnectionLossError, errors.SessionExpiredError))


def _expected_put_error(exc: Exception, chain: Chain | None) -> bool:
    """Errors a put recovers from: lost replies, an old bucket gone, a broken chain."""
    if isinstance(exc, _AlsoRefused):
        return False
    if _in_doubt(exc) or isinstance(exc, (errors.NoNodeError, _BucketTaken)):
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
