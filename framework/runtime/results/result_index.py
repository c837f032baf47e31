"""What retention needs per result record, kept beside the records in ZooKeeper.

Result records stay where their key names them (``results/<hh>/<key>``): a lookup, the
idempotency probe of a claim and the read of a redelivery are one request, whatever the
backlog.  Two structures let the active master apply the retention rules record by record,
with no memory of its own and without listing the queue (see ``docs/architecture.md``,
"Retention"):

* **The time index** ``results-log/<day>/<slot>/<key>``: an empty node created in the same
  transaction as each result record (when the record is *created*; a record rewritten in
  place keeps its entry).  ``slot`` is the writer's 10-second slot (``time // 10``) and
  ``day`` the 8,640 slots of one day, so no listing is larger than one day's slots or one
  slot's records (about 10 s of finished tasks).  Retention walks it oldest first and stops
  at the first slot under every limit.  A writer takes the slot of now to exist, and a busy
  one makes the next ahead (:class:`SlotKeeper`); an ack whose slot node is missing is
  refused and written by the slower path (:func:`write_record`, after the slot is made).
* **The queued markers** ``pending/<hh>/<key>``: a submitter of an explicitly keyed task
  (its id or idempotency key given, so another task of the same key can exist) records the
  queue item's name there right after its put (:func:`mark_queued`).  Retention deletes a
  record only with the marker of its key: gone, or naming only items that have left the
  queue (deleted at the version read, in the same fenced multi as the record).  A task with
  a generated id needs no marker: its record is written only by its own acknowledgement.

Lost replies: every write here is idempotent by name (a retried create finds the node, a
retried append finds its item name), so no GUID is needed.  SUSPENDED/LOST: a call waits for
the connection (retries after ``ConnectionLossError``) or raises on an expired session; it
holds no scope.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import attrs
import trio

from framework import errors, records
from framework.runtime.app import App
from framework.runtime.records import decode_or_none
from framework.zk import Session, gather

#: Seconds of one slot of the time index.
SLOT_SECONDS = 10

#: Slots per ``results-log/<day>`` node (one day).
SLOTS_PER_DAY = 86_400 // SLOT_SECONDS

#: Markers created per multi by :func:`mark_queued` (each about 150 bytes on the wire).
MARKS_PER_MULTI = 200

#: A marker naming more items than this drops those that left the queue when appended to.
MARKER_PRUNE_AT = 16

#: Multis of fresh markers in flight at once, and keys appended to at once.
MARK_MULTIS_IN_FLIGHT = 4
MARK_APPENDS_IN_FLIGHT = 64


def slot_of(when: float) -> int:
    """The index slot of time ``when`` (seconds since the epoch)."""
    return int(when // SLOT_SECONDS)


def slot_end(slot: int) -> float:
    """When ``slot`` ends (seconds since the epoch)."""
    return (slot + 1) * SLOT_SECONDS


def day_path(app: App, day: int) -> str:
    return f"{app.results_log}/{day:06d}"


def slot_path(app: App, slot: int) -> str:
    return f"{day_path(app, slot // SLOTS_PER_DAY)}/{slot:011d}"


def entry_path(app: App, slot: int, key: str) -> str:
    """The index entry of the record of ``key`` created in ``slot``."""
    return f"{slot_path(app, slot)}/{key}"


class SlotKeeper:
    """The index slots one process writes into.

    :meth:`current` is the slot of now, taken to exist: a writer's record in a missing slot
    is refused with its multi, and its fallback makes the slot (:meth:`made`) before writing
    the record alone.  The slot of now exists when anyone wrote in it before, or when a
    writer made it ahead: a slot used a second time by this process (a busy writer) has the
    next one made in the background by :meth:`run`.  Cost: one ``ensure_path`` per 10 s
    while the process is busy; none for a writer of one record now and then, unless it is
    the first of its slot (then its ack is refused once and written by the fallback)."""

    def __init__(self, session: Session, app: App) -> None:
        self.session = session
        self.app = app
        self._used: set[int] = set()  # slots this process wrote in (the last few)
        self._made: set[int] = set()  # slots this process made (the last few)
        self._making: dict[int, trio.Event] = {}
        self._wanted: int | None = None
        self._wake = trio.Event()

    def current(self, now: float) -> int:
        """The slot of time ``now`` (see the class doc)."""
        slot = slot_of(now)
        if slot in self._used:
            self._want(slot + 1)  # busy: the next one made before it is needed
        else:
            self._used = {s for s in self._used if s > slot - 4} | {slot}
        return slot

    async def made(self, slot: int) -> None:
        """Make ``slot`` exist (one ``ensure_path``, once; callers meanwhile wait for it)."""
        if slot in self._made:
            return
        making = self._making.get(slot)
        if making is not None:
            await making.wait()
            return
        self._making[slot] = done = trio.Event()
        try:
            await self.session.ensure_path(slot_path(self.app, slot))
            self._made = {s for s in self._made if s > slot - 4} | {slot}
        finally:
            del self._making[slot]
            done.set()

    def _want(self, slot: int) -> None:
        if slot not in self._made and (self._wanted is None or slot > self._wanted):
            self._wanted = slot
            self._wake.set()

    async def run(self) -> None:
        """Make the slots :meth:`current` asks for ahead, as they are asked for (a
        background task of the writer, for as long as it writes).  A failed create is left
        to the fallback of the first record refused for it."""
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            wanted, self._wanted = self._wanted, None
            if wanted is not None:
                try:
                    await self.made(wanted)
                except errors.ZooKeeperError:
                    pass


async def write_record(session: Session, app: App, key: str, data: bytes, slot: int) -> None:
    """Create the result record of ``key`` with its index entry in ``slot`` (one multi), or
    overwrite the record in place if it exists (its entry stays).  Used outside an
    acknowledgement: a final failure, or a record the ack's multi could not write."""
    record, entry = app.result_path(key), entry_path(app, slot, key)
    while True:
        try:
            await session.transaction().create(record, data).create(entry).commit()
            return
        except errors.TransactionFailedError as exc:
            if exc.failed_index == 0 and isinstance(exc.cause, errors.NodeExistsError):
                try:
                    await session.set(record, data)
                    return
                except errors.NoNodeError:
                    continue  # deleted meanwhile: create it again
            elif isinstance(exc.cause, errors.NodeExistsError):  # the entry is there
                try:
                    await session.create(record, data, makepath=True)
                    return
                except errors.NodeExistsError:
                    continue
            else:  # a parent is missing: the record's bucket or the entry's slot
                await session.ensure_path(record.rsplit("/", 1)[0])
                await session.ensure_path(entry.rsplit("/", 1)[0])
        except errors.ConnectionLossError:
            await session.wait_connected()  # applied or not: the next try tells


@attrs.frozen
class QueuedMark:
    """A ``pending/<hh>/<key>`` marker: the names of queue items of the key (relative to the
    queue's ``items`` node) that were queued when written; some may have left since."""

    items: tuple[str, ...] = ()


async def mark_queued(session: Session, app: App, marks: Sequence[tuple[str, str]]) -> None:
    """Record, for each ``(key, item name)``, that the item of task key ``key`` is queued.
    Called right after the put, for tasks with an explicit key only.  Fresh keys go in
    multis of creates (``MARKS_PER_MULTI`` at a time, ``MARK_MULTIS_IN_FLIGHT`` in flight;
    a multi refused for a missing ``pending/<hh>`` is sent again once those exist).  Keys
    that have a marker already (a job submitted again; or a multi refused otherwise, or its
    reply lost) are appended to: their markers read together and set in multis at the
    versions read (:func:`_append_many`), and one by one (``MARK_APPENDS_IN_FLIGHT`` keys at
    once, a key's names in order) those a multi could not take."""
    fresh: dict[str, str] = {}
    single: list[tuple[str, str]] = []
    for key, name in marks:
        if key in fresh:
            single.append((key, name))  # a second item of the key in this call
        else:
            fresh[key] = name
    refused = await _create_marks(session, app, list(fresh.items()))
    names_of: dict[str, list[str]] = {}
    for key, name in refused + single:  # a key's first name (in ``fresh``) comes first
        names_of.setdefault(key, []).append(name)
    await _append_marks(session, app, names_of)


async def _create_marks(session: Session, app: App, pairs: list[tuple[str, str]]
                        ) -> list[tuple[str, str]]:
    """Create a marker for each fresh ``(key, item name)``, in multis; returns those no
    multi created (the key has a marker already, or the reply was lost)."""
    refused: list[tuple[str, str]] = []

    async def create(chunk: list[tuple[str, str]]) -> None:
        for attempt in range(2):
            txn = session.transaction()
            for key, name in chunk:
                txn.create(app.pending_path(key), records.encode(QueuedMark((name,))))
            try:
                await txn.commit()
                return
            except errors.TransactionFailedError as exc:
                if attempt or not isinstance(exc.cause, errors.NoNodeError):
                    break
                parents = {app.pending_path(key).rsplit("/", 1)[0] for key, _name in chunk}
                await gather(*[functools.partial(session.ensure_path, p) for p in parents])
            except errors.ConnectionLossError:
                break
        refused.extend(chunk)

    await _at_most(MARK_MULTIS_IN_FLIGHT, [
        functools.partial(create, pairs[start:start + MARKS_PER_MULTI])
        for start in range(0, len(pairs), MARKS_PER_MULTI)])
    return refused


async def _append_marks(session: Session, app: App, names_of: dict[str, list[str]]) -> None:
    """Append each key's names to its marker: keys with one name in multis
    (:func:`_append_many`), the others and those a multi could not take one by one."""
    lone = [(key, names[0]) for key, names in names_of.items() if len(names) == 1]
    left: list[tuple[str, str]] = []

    async def append_chunk(chunk: list[tuple[str, str]]) -> None:
        left.extend(await _append_many(session, app, chunk))

    await _at_most(MARK_MULTIS_IN_FLIGHT, [
        functools.partial(append_chunk, lone[start:start + MARKS_PER_MULTI])
        for start in range(0, len(lone), MARKS_PER_MULTI)])
    for key, _name in lone:
        del names_of[key]
    for key, name in left:
        names_of[key] = [name]

    async def append(key: str) -> None:
        for name in names_of[key]:
            await _append(session, app, key, name, create_first=False)

    await _at_most(MARK_APPENDS_IN_FLIGHT,
                   [functools.partial(append, key) for key in names_of])


async def _append_many(session: Session, app: App, marks: list[tuple[str, str]]
                       ) -> list[tuple[str, str]]:
    """Add each name to its key's marker (distinct keys): the markers read together, then
    one multi setting each at the version read.  Returns the marks left to :func:`_append`:
    a marker missing or long enough to prune, or all of them if the multi was refused (a
    marker changed meanwhile) or its reply lost (each is found there, or added, then)."""
    read: dict[str, tuple[tuple[str, ...], int]] = {}

    async def get(key: str) -> None:
        path = app.pending_path(key)
        try:
            data, stat = await session.get(path)
        except (errors.NoNodeError, errors.ConnectionLossError):
            return  # left to _append
        read[key] = (read_mark(data, path).items, stat.version)

    await gather(*[functools.partial(get, key) for key, _name in marks])
    txn = session.transaction()
    sent: list[tuple[str, str]] = []
    left: list[tuple[str, str]] = []
    for key, name in marks:
        items, version = read.get(key, ((), -1))
        if version < 0 or len(items) >= MARKER_PRUNE_AT:
            left.append((key, name))
        elif name not in items:  # else: there already (a try whose reply was lost)
            txn.set(app.pending_path(key), records.encode(QueuedMark((*items, name))),
                    version=version)
            sent.append((key, name))
    try:
        await txn.commit()
    except (errors.TransactionFailedError, errors.ConnectionLossError):
        left += sent
    return left


async def _at_most(limit: int, jobs: list[functools.partial[Any]]) -> None:
    """Run ``jobs``, at most ``limit`` at once (in their order; the first error raised)."""
    todo = iter(jobs)

    async def worker() -> None:
        for job in todo:
            await job()

    await gather(*[worker for _ in range(min(limit, len(jobs)))])


async def _append(session: Session, app: App, key: str, name: str, *,
                  create_first: bool = True) -> None:
    """Add ``name`` to the marker of ``key``: create it, else read it and set it at the
    version read.  ``create_first=False``: the marker is likely there (one for the key was
    just created or refused): read first."""
    path = app.pending_path(key)
    create = create_first
    while True:
        try:
            if create:
                await session.create(path, records.encode(QueuedMark((name,))), makepath=True)
                return
        except errors.NodeExistsError:
            pass
        except errors.ConnectionLossError:
            await session.wait_connected()
            continue
        create = True  # from now on, whenever the marker is found missing
        try:
            data, stat = await session.get(path)
        except errors.NoNodeError:
            continue
        items = read_mark(data, path).items
        if name in items:
            return  # ours, from a try whose reply was lost
        if len(items) >= MARKER_PRUNE_AT:
            items = tuple(await still_queued(session, app, items))
        try:
            await session.set(path, records.encode(QueuedMark((*items, name))),
                              version=stat.version)
            return
        except (errors.BadVersionError, errors.NoNodeError):
            continue
        except errors.ConnectionLossError:
            await session.wait_connected()


def read_mark(data: bytes, path: str) -> QueuedMark:
    """A marker's record; one that does not decode names nothing (logged)."""
    return decode_or_none(data, QueuedMark, path=path) or QueuedMark()


async def still_queued(session: Session, app: App, items: Sequence[str]) -> list[str]:
    """Those of ``items`` (queue items as markers name them, :meth:`App.item_ref`: of any
    queue) still in their queue (queued, claimed or running): one ``exists`` each, sent
    together."""
    present: dict[str, bool] = {}

    async def look(name: str) -> None:
        present[name] = await session.exists(app.item_path(name)) is not None

    await gather(*[functools.partial(look, name) for name in items])
    return [name for name in items if present[name]]
