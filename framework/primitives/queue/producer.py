"""The producer half of :class:`~framework.primitives.queue.WorkQueue`: puts, batched and
pipelined, recovered after lost replies by the GUIDs in item names, and the bucket chain."""

from __future__ import annotations

import enum
import uuid
from typing import Callable, Iterable

import trio

from framework import errors
from framework.errors import ConfigurationError, DataTooLargeError
from framework.logs import get_logger
from framework.primitives.queue.items import Batch, Chain
from framework.primitives.queue.state import QueueState
from framework.primitives.queue.view import (
    bucket_index,
    bucket_lane,
    bucket_name,
    is_bucket,
    item_name_prefix,
    item_token,
)
from framework.zk import Transaction, create_protected, delete_guid_nodes, new_guid

log = get_logger("framework.primitives.queue")

#: Items per multi-op in ``put_many`` (and its byte budget), well under ZooKeeper's 1 MB.
_BATCH_OPS = 500
_BATCH_BYTES = 512 * 1024
#: Batches of one ``put_many`` in flight at once.
_PIPELINE = 4


class _Then(enum.Enum):
    """What a round of batches leaves to do."""

    DONE = enum.auto()  # every batch was applied
    AGAIN = enum.auto()  # send the rest again, in order (lost, or after a lost one)
    NEW_BUCKET = enum.auto()  # the bucket is gone (a consumer dropped an old one): find the newest


class Producer(QueueState):
    """Puts (see the package doc for the guarantees)."""

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

    async def put(self, data: bytes, *, priority: int = 0,
                  also: Callable[[Transaction], None] | None = None) -> str:
        """Add one item; return its name.

        ``also`` adds the caller's operations to the multi that creates the item (after the
        create, before the queue's fence): the item and they are applied together or not at
        all, once, even across lost replies.  If one of them is refused, nothing is applied
        and :class:`~framework.errors.TransactionFailedError` is raised with ``failed_index``
        counted from the first of them."""
        return (await self.put_many([data], priority=priority, also=also))[0]

    async def put_many(self, items: Iterable[bytes], *, priority: int = 0,
                       also: Callable[[Transaction], None] | None = None) -> list[str]:
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
        if also is not None and len(payloads) != 1:
            raise ConfigurationError("put_many(also=...) takes exactly one item; use put()")
        await self._setup()
        names: list[str] = []
        chain: Chain | None = None
        try:
            start = 0
            while start < len(payloads):
                bucket = await self._current_bucket(priority)
                room = self.bucket_size - 1 - self._hint_of[priority]
                if room <= 0:  # known full: go to the next bucket first
                    await self._advance(bucket)
                    continue
                batches = _plan(payloads, start, room)
                if len(batches) > 1 and chain is None:
                    chain = await self._open_chain()
                ordered = chain if len(batches) > 1 else None
                await self._send_round(bucket, priority, batches, payloads, ordered, also)
                applied, then = await self._conclude(bucket, priority, batches, ordered)
                if chain is not None and not chain.alive:
                    chain = None  # gone with an expired session: a new one if needed
                end = batches[applied - 1].end if applied else start
                created = [path for batch in batches[:applied] for path in batch.outcome]
                names.extend(await self._settle(bucket, created, payloads[start:end], priority))
                start = end
                if then is _Then.NEW_BUCKET:
                    self._bucket_of.pop(priority, None)
        finally:
            if chain is not None:
                await delete_guid_nodes(self.session, self.puts_root, chain.guid)
        if names:
            log.debug("queue.put", path=self.path, items=len(names), priority=priority)
        return names

    async def _open_chain(self) -> Chain:
        guid = new_guid()
        while True:
            try:
                path = await create_protected(
                    self.session, self.puts_root, "p-", b"", guid=guid, ephemeral=True,
                    sequence=False, makepath=True,
                )
                return Chain(guid, path)
            except errors.SessionExpiredError:
                await self.session.wait_connected()
            except BaseException:
                await delete_guid_nodes(self.session, self.puts_root, guid)
                raise

    async def _send_round(
        self, bucket: str, priority: int, batches: list[Batch], payloads: list[bytes],
        chain: Chain | None, also: Callable[[Transaction], None] | None = None,
    ) -> None:
        """Send the batches, each setting its ``outcome``; several at once with a chain."""
        if chain is None:
            for batch in batches:
                batch.outcome = await self._send(bucket, priority, batch, payloads, None, 0,
                                                 also)
            return
        turns = [trio.Event() for _ in batches]
        turns[0].set()
        window = trio.Semaphore(_PIPELINE)

        async def send(k: int, batch: Batch) -> None:
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
        self, bucket: str, priority: int, batch: Batch, payloads: list[bytes],
        chain: Chain | None, k: int, also: Callable[[Transaction], None] | None = None,
    ) -> list[str] | Exception:
        parent = f"{self.items_root}/{bucket}"
        data = payloads[batch.start:batch.end]
        fence = self.fence
        extra = 0
        try:
            if chain is None and len(data) == 1 and fence is None and also is None:
                prefix = item_name_prefix(priority, batch.tokens[0])
                return [await self.session.create(f"{parent}/{prefix}", data[0], sequence=True)]
            txn = self.session.transaction()
            if chain is not None:
                txn.set(chain.path, b"", version=chain.version + k)
            for token, payload in zip(batch.tokens, data, strict=True):
                txn.create(f"{parent}/{item_name_prefix(priority, token)}", payload,
                           sequence=True)
            if also is not None:
                before = len(txn.operations)
                also(txn)
                extra = len(txn.operations) - before
            if fence is not None:  # last, so the other operations keep their indexes
                txn.check(*fence)
            results = await txn.commit()
            first = 0 if chain is None else 1
            return [str(r) for r in results[first:first + len(data)]]
        except errors.TransactionFailedError as exc:
            first_also = len(data) + (chain is not None)
            if extra and first_also <= exc.failed_index < first_also + extra:
                return _AlsoRefused(exc.results[first_also:first_also + extra])
            if fence is not None and exc.failed_index == len(data) + (chain is not None) + extra:
                return errors.LeadershipLost(
                    f"put refused: {fence[0]} is no longer at version {fence[1]} "
                    "(a new leader was elected)"
                )
            return exc  # judged by _conclude, in order
        except Exception as exc:  # judged by _conclude, in order
            return exc

    async def _conclude(
        self, bucket: str, priority: int, batches: list[Batch], chain: Chain | None
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
            applied = await self._recover(bucket, priority, batches, first, chain)
        if applied == len(batches):
            return applied, _Then.DONE
        exc = batches[applied].outcome
        if isinstance(exc, errors.NoNodeError) or (
            isinstance(exc, errors.TransactionFailedError)
            and (chain is None or exc.failed_index > 0)
        ):
            return applied, _Then.NEW_BUCKET  # a consumer dropped it: it was an old one
        return applied, _Then.AGAIN  # lost, or after a lost one: send again, in order

    async def _recover(
        self, bucket: str, priority: int, batches: list[Batch], first: int,
        chain: Chain | None,
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
        lane = bucket_lane(bucket)
        if known and self._bucket_of.get(lane) == bucket:
            top = max(known)
            self._hint_of[lane] = max(self._hint_of[lane], top)
            if top >= self.bucket_size - 1:
                await self._advance(bucket)
        names = []
        for path, seq, data in zip(created, seqs, payloads, strict=True):
            if seq is not None and seq >= self.bucket_size:
                path = await self._move(path, data, priority)
            names.append(path[len(self.items_root) + 1:])
        return names

    async def _current_bucket(self, lane: int) -> str:
        """The bucket this producer puts items of priority ``lane`` into (the newest of
        that lane, opened if the lane has none)."""
        if lane not in self._bucket_of:
            names = await self.session.children(self.items_root)
            buckets = sorted((n for n in names if is_bucket(n) and bucket_lane(n) == lane),
                             key=bucket_index)
            if not buckets:
                buckets = [bucket_name(0, lane)]
                await self.session.ensure_path(f"{self.items_root}/{buckets[0]}")
            await self._adopt(buckets[-1])
        return self._bucket_of[lane]

    async def _adopt(self, bucket: str) -> None:
        """Write to ``bucket`` from now on, knowing a lower bound of the highest sequence
        number used in it.  The server numbers children by creates only, while ``cversion``
        counts creates and deletes: so creates >= max(children, cversion / 2).  A lower
        bound never closes a bucket early; an item numbered past the capacity is moved
        (see ``_settle``), and the first put tells the exact number."""
        stat = await self.session.exists(f"{self.items_root}/{bucket}")
        lane = bucket_lane(bucket)
        self._bucket_of[lane] = bucket
        created = max(stat.numChildren, (stat.cversion + 1) // 2) if stat is not None else 0
        self._hint_of[lane] = created - 1

    async def _advance(self, full: str) -> None:
        """``full`` is closed: write to the newest bucket of its lane after it, opening one
        if none."""
        lane = bucket_lane(full)
        names = await self.session.children(self.items_root)
        newer = sorted(
            (n for n in names if is_bucket(n) and bucket_lane(n) == lane
             and bucket_index(n) > bucket_index(full)),
            key=bucket_index,
        )
        if newer:
            await self._adopt(newer[-1])
            return
        following = bucket_name(bucket_index(full) + 1, lane)
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
            bucket = await self._current_bucket(bucket_lane(source))
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


def _plan(payloads: list[bytes], start: int, room: int) -> list[Batch]:
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
        batches.append(Batch(begin, end, [f"{batch_id}{i:04x}" for i in range(end - begin)]))
        begin = end
    return batches


class _AlsoRefused(errors.TransactionFailedError):
    """The caller's operations in a put's multi were refused (``failed_index`` counts from
    the first of them): raised to the caller, never retried."""


def _in_doubt(outcome: object) -> bool:
    return isinstance(outcome, (errors.ConnectionLossError, errors.SessionExpiredError))


def _expected_put_error(exc: Exception, chain: Chain | None) -> bool:
    """Errors a put recovers from: lost replies, an old bucket gone, a broken chain."""
    if isinstance(exc, _AlsoRefused):
        return False
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
