"""The consumer side's watched view of a work queue: buckets, items, claims.

Layout (owned by :class:`framework.primitives.queue.WorkQueue`)::

    <path>/items/b-NNNNNNNNNN/i<priority>-<token>-NNNNNNNNNN   items, in buckets of bounded size
    <path>/claims/b-NNNNNNNNNN.i<priority>-<token>-NNNNNNNNNN  ephemeral claim of an item in use
    <path>/puts/p-<guid>                                       ephemeral: orders pipelined puts
    <path>/waiting/w-<guid>-NNNNNNNNNN                         ephemeral: the line of idle consumers
    <path>/waiting/<line>/w-<guid>-NNNNNNNNNN                  the same, of one kind of consumer

``<priority>`` is signed (``+0``, ``-5``); ``<token>`` is the GUID that lets a producer find
its item after a lost reply (16 hex digits: a batch id and the item's index in the batch);
the name ends with the server's sequence number.  Names without a token (``i+0-NNNNNNNNNN``)
parse too.

One :class:`QueueView` per ``WorkQueue`` object is shared by every consumer task of the
process.  Each list it holds was read with a watch; when the watch fires the list is dropped
and re-read on the next use (the seed's "use an up-to-date children list"), and every waiting
consumer wakes.  Refreshes are single-flight: concurrent consumers share one read.  Buckets
are read oldest first and only as far as needed to find unclaimed work (a lazily extended
window), so a large queue does not cost a full listing per item.

SUSPENDED: the session sets its watches again on the next connection, and the server fires
those whose list changed meanwhile: only those lists are dropped and read again (reads wait
for the connection).  LOST: the owner calls
:meth:`QueueView.invalidate_all`, and every list is read again, with new watches, in the new
session.
"""

from __future__ import annotations

import bisect
from typing import Any, Callable

import attrs
import trio

from framework import errors
from framework.zk import Session, gather


@attrs.frozen
class Entry:
    """One item as listed: ``bucket``/``node``, its priority and sequence number."""

    bucket: str
    node: str
    priority: int
    seq: int

    @property
    def key(self) -> str:
        """The item's name relative to the items root (``b-0000000000/i+0-1f0c...-0000000007``)."""
        return f"{self.bucket}/{self.node}"

    @property
    def claim_name(self) -> str:
        """The flat name of its claim node."""
        return claim_name_of(self.key)


def claim_name_of(key: str) -> str:
    """The flat name of the claim node of the item ``key`` (``bucket/node``)."""
    return key.replace("/", ".", 1)


#: At most this many candidates are returned per call (the rest wait for the next one).
_WINDOW = 64


def _order(entry: Entry) -> tuple[int, int]:
    return entry.priority, entry.seq


def update_listing(
    bucket: str, names: list[str], previous: tuple[set[str], list[Entry]] | None
) -> tuple[set[str], list[Entry]]:
    """A bucket's new listing as (its names, its items in (priority, seq) order), given the
    ``previous`` one: only names not seen before are parsed and put in place, so a re-read
    after an ack or a put costs a set difference and a filter, not a parse and a sort of
    the whole bucket."""
    current = set(names)
    listed: list[Entry]
    if previous is None:
        added, listed = current, []
    else:
        known, listed = previous
        added = current - known
        if len(current) - len(added) != len(known):  # some went
            listed = [e for e in listed if e.node in current]
        else:
            listed = list(listed)  # never change a list handed out before
    if len(added) * 8 > len(current):  # mostly new: sort them all
        listed = sorted([e for n in current if (e := parse_item(bucket, n)) is not None],
                        key=_order)
    else:
        for name in added:
            entry = parse_item(bucket, name)
            if entry is not None:
                bisect.insort(listed, entry, key=_order)
    return current, listed


def item_prefix(priority: int) -> str:
    return f"i{priority:+d}-"


def item_name_prefix(priority: int, token: str) -> str:
    """What a producer creates (sequentially): ``i<priority>-<token>-``."""
    return f"{item_prefix(priority)}{token}-"


def parse_item(bucket: str, node: str) -> Entry | None:
    """Parse ``i<priority>-<token>-NNNNNNNNNN`` (or ``i<priority>-NNNNNNNNNN``); ``None`` for
    anything else."""
    if not node.startswith("i") or len(node) < 13 or node[-11] != "-":
        return None
    seq, body = node[-10:], node[1:-11]  # body: "+0" or "+0-<token>"
    if not seq.isdigit() or len(body) < 2 or body[0] not in "+-":
        return None
    digits, _, token = body[1:].partition("-")
    if not digits.isdigit() or (token and not token.isalnum()):
        return None
    return Entry(bucket, node, int(body[0] + digits), int(seq))


def item_token(node: str) -> str:
    """The token of an item's node name (``""`` for a name without one)."""
    return node[1:-11][1:].partition("-")[2]


def bucket_name(index: int, lane: int = 0) -> str:
    """Bucket ``index`` of priority lane ``lane``: ``b-NNNNNNNNNN`` for lane 0 (every
    bucket before lanes existed), ``b<+/-lane>-NNNNNNNNNN`` for the others."""
    return f"b-{index:010d}" if lane == 0 else f"b{lane:+d}-{index:010d}"


def bucket_index(name: str) -> int:
    return int(name[-10:])


def bucket_lane(name: str) -> int:
    """The priority lane of a bucket (its items' priority; 0 for an old mixed bucket)."""
    return 0 if len(name) == 12 else int(name[1:-11])


def bucket_order(name: str) -> tuple[int, int]:
    """Consumers' order of buckets: the most urgent lane first, then the oldest bucket."""
    return bucket_lane(name), bucket_index(name)


def is_bucket(name: str) -> bool:
    if len(name) < 12 or not name.startswith("b") or name[-11] != "-" \
            or not name[-10:].isdigit():
        return False
    lane = name[1:-11]
    return lane == "" or (len(lane) >= 2 and lane[0] in "+-" and lane[1:].isdigit())


def newest_of_lane(bucket: str, buckets: list[str]) -> bool:
    """Whether ``bucket`` is the newest of its lane among ``buckets`` (producers write only
    to that one, so only older empty buckets may be dropped)."""
    lane = bucket_lane(bucket)
    return not any(bucket_lane(b) == lane and bucket_index(b) > bucket_index(bucket)
                   for b in buckets)


class QueueView:
    """Watched, lazily refreshed lists of buckets, items and claims (see module doc)."""

    def __init__(self, session: Session, items_root: str, claims_root: str) -> None:
        self.session = session
        self.items_root = items_root
        self.claims_root = claims_root
        self._buckets: list[str] | None = None
        self._items: dict[str, list[Entry] | None] = {}
        self._claims: frozenset[str] | None = None
        self._callbacks: dict[tuple[str, ...], Callable[..., None]] = {}
        #: bucket -> (the names of its last listing, its items in order)
        self._listed: dict[str, tuple[set[str], list[Entry]]] = {}
        self._bumps: dict[tuple[str, ...], int] = {}
        self._epoch = 0
        self._lock = trio.Lock()
        #: Set (and replaced) whenever any watched list changes.
        self.changed = trio.Event()

    # ---------------------------------------------------------------- watches

    def _watch(self, *key: str) -> Callable[..., None]:
        """One callback object per watched list, so the session keeps one watcher per path."""
        callback = self._callbacks.get(key)
        if callback is None:
            def callback(*_args: Any, key: tuple[str, ...] = key) -> None:
                self._invalidate(key)

            self._callbacks[key] = callback
        return callback

    def _invalidate(self, key: tuple[str, ...]) -> None:
        self._bumps[key] = self._bumps.get(key, 0) + 1
        if key == ("buckets",):
            self._buckets = None
        elif key == ("claims",):
            self._claims = None
        else:
            self._items[key[1]] = None
        self.changed.set()
        self.changed = trio.Event()

    def wake(self) -> None:
        """Set :attr:`changed` (and replace it) with nothing dropped: the consumers waiting
        on it look again (their own reasons to take changed)."""
        self.changed.set()
        self.changed = trio.Event()

    def invalidate_all(self) -> None:
        """Forget everything (after a new session: its watches are gone)."""
        self._epoch += 1
        self._buckets = None
        self._claims = None
        self._items.clear()
        self.changed.set()
        self.changed = trio.Event()

    def _stamp(self, key: tuple[str, ...]) -> tuple[int, int]:
        return self._epoch, self._bumps.get(key, 0)

    def forget(self, entry: Entry) -> None:
        """Drop an item we found gone, without re-reading its bucket."""
        listed = self._items.get(entry.bucket)
        if listed is not None and entry in listed:
            self._items[entry.bucket] = [e for e in listed if e != entry]

    # ---------------------------------------------------------------- reads
    #
    # A list read is cached only if its watch did not fire while the read was in flight (the
    # notification can overtake the resumption of the reading task): otherwise the answer is
    # used once - the caller sees ``changed`` set and comes back - and read again next time.

    async def candidates(self, skip: set[str],
                         passed: set[str] | frozenset[str] = frozenset()) -> list[Entry]:
        """Unclaimed items (lower priority value first, then oldest), from fresh lists: the
        first ones of the first bucket holding unclaimed work, in the most urgent lane
        (each priority value has its lane of buckets, so an urgent item never waits behind
        older items of a lower priority).

        ``skip`` holds keys this process is claiming right now, ``passed`` keys it does not
        take (refused by the queue's ``accept``).  An empty answer means every
        list needed to prove the queue has no unclaimed work was read with a watch (or that
        one changed meanwhile, which has set ``changed``).
        """
        async with self._lock:
            fresh: dict[str, Any] = {"buckets": self._buckets, "claims": self._claims}
            reads = []
            if fresh["buckets"] is None:
                reads.append(lambda: self._read_buckets(fresh))
            if fresh["claims"] is None:
                reads.append(lambda: self._read_claims(fresh))
            await gather(*reads)
            buckets: list[str] = fresh["buckets"]
            claims: frozenset[str] = fresh["claims"]
            window: list[Entry] = []
            for bucket in buckets:  # the most urgent lane first, oldest bucket first
                listed = self._items.get(bucket)
                if listed is None:
                    listed = await self._read_bucket(bucket)
                if not listed and not newest_of_lane(bucket, buckets):
                    await self._drop_empty_bucket(bucket)
                for e in listed:  # already in (priority, seq) order
                    if e.claim_name not in claims and e.key not in skip \
                            and e.key not in passed:
                        window.append(e)
                        if len(window) >= _WINDOW:
                            break
                if window:
                    break
            return window

    def listed_keys(self) -> set[str]:
        """The keys of every item in the buckets' last listings (no read)."""
        return {f"{bucket}/{name}" for bucket, (names, _) in self._listed.items()
                for name in names}

    async def claims(self) -> frozenset[str]:
        """The names of the current claims, from a watched list."""
        async with self._lock:
            if self._claims is not None:
                return self._claims
            fresh: dict[str, Any] = {}
            await self._read_claims(fresh)
            claims: frozenset[str] = fresh["claims"]
            return claims

    async def _read_buckets(self, fresh: dict[str, Any]) -> None:
        stamp = self._stamp(("buckets",))
        names = await self.session.children(self.items_root, watch=self._watch("buckets"))
        buckets = sorted((n for n in names if is_bucket(n)), key=bucket_order)
        for gone in set(self._items) - set(buckets):
            del self._items[gone]
            self._listed.pop(gone, None)
            self._callbacks.pop(("bucket", gone), None)
        fresh["buckets"] = buckets
        if self._stamp(("buckets",)) == stamp:
            self._buckets = buckets

    async def _read_claims(self, fresh: dict[str, Any]) -> None:
        stamp = self._stamp(("claims",))
        names = await self.session.children(self.claims_root, watch=self._watch("claims"))
        fresh["claims"] = frozenset(names)
        if self._stamp(("claims",)) == stamp:
            self._claims = fresh["claims"]

    async def _read_bucket(self, bucket: str) -> list[Entry]:
        stamp = self._stamp(("bucket", bucket))
        try:
            names = await self.session.children(
                f"{self.items_root}/{bucket}", watch=self._watch("bucket", bucket)
            )
        except errors.NoNodeError:
            names = []
        self._listed[bucket] = update_listing(bucket, names, self._listed.get(bucket))
        listed = self._listed[bucket][1]
        if self._stamp(("bucket", bucket)) == stamp:
            self._items[bucket] = listed
        return listed

    async def _drop_empty_bucket(self, bucket: str) -> None:
        """An old bucket that is empty will never be written again (producers only add to
        the newest of its lane): delete it.  A concurrent add makes the delete fail harmlessly."""
        try:
            await self.session.delete(f"{self.items_root}/{bucket}", missing_ok=True)
        except errors.NotEmptyError:
            pass
