"""Retention of ``results/``: one pass walks the records' time index oldest first.

The index (:mod:`framework.runtime.results.result_index`) is walked day by day, slot by slot; a
pass stops at the first slot that is neither over the age limit nor needed to bring the
count under its limit, or once it has looked at ``budget`` entries.  Each entry looked at
costs an ``exists`` of its record and a ``get`` of its key's queued marker (sent together);
then, per record:

* gone: the entry is deleted (a record deleted by hand, or purged);
* rewritten after its slot, or by a writer whose clock is behind (its ``mtime`` more than
  ``CLOCK_SKEW`` past the slot's end): the entry moves to the slot of that ``mtime``;
* kept - a dead letter of its key exists, or its marker names an item still in the queue
  (queued, claimed or running): the entry moves to the newest slot, so the record is looked
  at again only after another full age (or count) period, not at every pass;
* otherwise deleted, in a fenced multi with its entry and its marker: the record at the
  version read, the marker at the version read (or created and deleted again when there was
  none: a marker written since refuses the multi).

Nothing is kept between passes; a pass holds one day's slot names and one slot's entries.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Iterable

import attrs

from framework import errors
from framework.logs import get_logger
from framework.primitives import Term
from framework.runtime.app import App, ensure_buckets
from framework.runtime.results.result_index import (
    SLOTS_PER_DAY,
    SlotKeeper,
    day_path,
    entry_path,
    read_mark,
    slot_end,
    slot_of,
    slot_path,
    still_queued,
)
from framework.zk import Session, Stat, Transaction, gather

log = get_logger(__name__)

#: Seconds a writer's clock may be off the server's: a record modified more than this past
#: its slot's end was rewritten later (its entry moves); an empty slot or day is deleted
#: only this long after its end.
CLOCK_SKEW = 60.0

#: Records deleted per fenced multi (4 operations each, well under a request's size limit).
RECORDS_PER_MULTI = 25

#: Reads in flight at once.
READS_AT_ONCE = 256


@attrs.define
class _Look:
    """What a pass read of one index entry: its record's stat and its key's marker."""

    key: str
    record: Stat | None = None
    marker: tuple[tuple[str, ...], int] | None = None  # (item names, version)


class ResultTrimmer:
    """Deletes result records over ``count``/``seconds``, oldest first (see the module doc);
    writes fenced by ``term``."""

    def __init__(self, session: Session, app: App, term: Term, *, count: int | None,
                 seconds: float | None) -> None:
        self.session = session
        self.app = app
        self.term = term
        self.count = count
        self.seconds = seconds
        self._slots = SlotKeeper(session, app)
        self._pending_ready = False  # pending/<hh> known to exist
        #: requests and entries of the last pass (for the docs' cost figures and tests)
        self.looked_at = 0

    async def trim(self, now: float, budget: int, dead_keys: set[str]) -> int:
        """One pass: look at up to ``budget`` entries; returns how many records went.
        ``dead_keys``: the task keys that have a dead letter (their records stay)."""
        self.looked_at = 0
        if budget <= 0 or (self.count is None and self.seconds is None):
            return 0
        excess = 0
        if self.count is not None:
            excess = max(0, await self._count() - self.count)
        cutoff = now - self.seconds if self.seconds is not None else None
        deleted = 0
        for day in sorted(int(name) for name in await self._children(self.app.results_log)):
            for name in sorted(await self._children(day_path(self.app, day))):
                slot = int(name)
                aged = cutoff is not None and slot_end(slot) <= cutoff
                if not aged and excess <= 0:
                    return deleted
                keys = await self._children(slot_path(self.app, slot))
                while keys:
                    want = budget - self.looked_at if aged else min(
                        budget - self.looked_at, excess)
                    if want <= 0:
                        return deleted
                    part, keys = keys[:want], keys[want:]
                    gone = await self._retire(slot, part, now, dead_keys)
                    self.looked_at += len(part)
                    deleted += gone
                    excess -= gone
                if slot_end(slot) < now - CLOCK_SKEW:  # emptied, unless a record stays
                    await self._delete_empty(slot_path(self.app, slot))
            if slot_end((day + 1) * SLOTS_PER_DAY - 1) < now - CLOCK_SKEW:
                await self._delete_empty(day_path(self.app, day))
        return deleted

    # ------------------------------------------------------------ reading

    async def _count(self) -> int:
        """Result records now: one ``exists`` per bucket, sent together."""
        counts: list[int] = []

        async def count(bucket: str) -> None:
            stat = await self.session.exists(f"{self.app.results}/{bucket}")
            counts.append(stat.numChildren if stat is not None else 0)

        await gather(*[functools.partial(count, b) for b in self.app.result_buckets])
        return sum(counts)

    async def _children(self, path: str) -> list[str]:
        try:
            return await self.session.children(path)
        except errors.NoNodeError:
            return []

    async def _look(self, look: _Look) -> None:
        async def record() -> None:
            look.record = await self.session.exists(self.app.result_path(look.key))

        async def marker() -> None:
            path = self.app.pending_path(look.key)
            try:
                data, stat = await self.session.get(path)
            except errors.NoNodeError:
                return
            look.marker = (read_mark(data, path).items, stat.version)

        await gather(record, marker)

    # ------------------------------------------------------------ deciding

    async def _retire(self, slot: int, keys: list[str], now: float,
                      dead_keys: set[str]) -> int:
        looks = [_Look(key) for key in keys]
        await bounded(functools.partial(self._look, look) for look in looks)
        items = [name for look in looks
                 if look.marker is not None and look.key not in dead_keys
                 for name in look.marker[0]]
        queued = set(await still_queued(self.session, self.app, items)) if items else set()
        newest = slot_of(now)
        doomed: list[_Look] = []
        for look in looks:
            stat = look.record
            if stat is None:
                await self._drop_entry(slot, look.key)
            elif stat.mtime / 1000.0 > slot_end(slot) + CLOCK_SKEW:
                await self._move_entry(slot, slot_of(stat.mtime / 1000.0), look.key, now)
            elif look.key in dead_keys or (
                    look.marker is not None and any(n in queued for n in look.marker[0])):
                await self._move_entry(slot, newest, look.key, now)  # kept: looked at later
            else:
                doomed.append(look)
        gone = 0
        for start in range(0, len(doomed), RECORDS_PER_MULTI):
            chunk = doomed[start:start + RECORDS_PER_MULTI]
            if await self._delete_records(slot, chunk):
                gone += len(chunk)
            else:  # one of them changed meanwhile: each alone, the others still go
                for look in chunk:
                    gone += await self._delete_records(slot, [look])
        return gone

    # ------------------------------------------------------------ writing (fenced)

    async def _delete_records(self, slot: int, looks: list[_Look]) -> bool:
        """Delete each record at the version read, with its entry and its marker, in one
        fenced multi; ``False`` if the server refused it (nothing deleted)."""
        await self._ensure_pending_buckets()
        txn = self.term.fenced()
        for look in looks:
            assert look.record is not None
            txn.delete(self.app.result_path(look.key), version=look.record.version)
            txn.delete(entry_path(self.app, slot, look.key))
            marker = self.app.pending_path(look.key)
            if look.marker is None:  # none then: refused if one was written since
                txn.create(marker).delete(marker)
            else:  # naming only items gone: refused if one was appended since
                txn.delete(marker, version=look.marker[1])
        return await self._commit(txn)

    async def _drop_entry(self, slot: int, key: str) -> None:
        await self._commit(self.term.fenced().delete(entry_path(self.app, slot, key)))

    async def _move_entry(self, slot: int, to: int, key: str, now: float) -> None:
        """The entry of ``key`` from ``slot`` to slot ``to`` (made if missing)."""
        if to <= slot:
            return  # already where it belongs (the newest slot itself)
        await self._slots.made(to)
        old = entry_path(self.app, slot, key)
        txn = self.term.fenced().create(entry_path(self.app, to, key)).delete(old)
        if not await self._commit(txn):  # an entry there already (the record made anew)
            await self._commit(self.term.fenced().delete(old))

    async def _delete_empty(self, path: str) -> None:
        """A slot or day node, if empty (refused if something is, or was put, in it)."""
        await self._commit(self.term.fenced().delete(path))

    async def _ensure_pending_buckets(self) -> None:
        """The ``pending/`` buckets, once per term (workers make them when they start:
        then one listing): a marker's create and delete in a delete multi needs its
        parent."""
        if not self._pending_ready:
            await ensure_buckets(self.session, self.app.pending, self.app.result_buckets)
            self._pending_ready = True

    async def _commit(self, txn: Transaction) -> bool:
        return await commit_fenced_delete(txn)


async def commit_fenced_delete(txn: Transaction) -> bool:
    """Commit a fenced multi (its check first): ``False`` if the server refused one of its
    operations (nothing applied); :class:`LeadershipLost` if it refused the fence."""
    try:
        await txn.commit()
    except errors.TransactionFailedError as exc:
        if exc.failed_index == 0:
            raise errors.LeadershipLost("fenced delete refused: not the leader") from exc
        return False
    return True


async def bounded(calls: Iterable[Callable[[], Awaitable[None]]]) -> None:
    """Run ``calls`` concurrently, ``READS_AT_ONCE`` at a time."""
    pending = list(calls)
    for start in range(0, len(pending), READS_AT_ONCE):
        await gather(*pending[start:start + READS_AT_ONCE])

