"""One partition's crawl state in sqlite: frontier, seen-set, outbox, consumed inbox files,
robots.txt answers.

The working copy lives on the owner's local disk and is written with ``synchronous=OFF``:
it is disposable (another machine never sees it).  Durability comes from
:meth:`PartitionStore.checkpoint`, a consistent snapshot (sqlite's online backup) written to
a new file; the owner publishes it in ZooKeeper (see :mod:`.partition`).  Every mutation is
one sqlite transaction, and every method is synchronous and short, so a snapshot taken from
the trio thread never sees half of a step.

Tables:

- ``urls(url, host, depth, state)``: the seen-set *and* the frontier: a URL is inserted once
  (``INSERT OR IGNORE``); ``state`` is a :class:`UrlState`: ``PENDING``, ``DONE`` (fetched,
  whatever the HTTP outcome) or ``BLOCKED`` (robots.txt forbids it).
- ``outbox(id, dst, url, depth)``: links found here for other partitions, inserted in the
  same transaction that marks their page done, deleted once shipped to the receiver's inbox.
  So a snapshot never holds a page done whose links are neither shipped nor in the outbox.
- ``consumed(name)``: inbox files already merged into ``urls``; forgotten once a checkpoint
  that includes them is published and the files are deleted.
- ``robots(host, status, body)``: the robots.txt answer of each host (politeness state).

A checkpoint that cannot be read back (missing, cut short, not sqlite, failing sqlite's
``quick_check``) makes :meth:`PartitionStore.restore` raise :class:`CorruptCheckpoint`, never
an sqlite error from inside a later step.
"""

from __future__ import annotations

import enum
import sqlite3
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import NamedTuple

import attrs

from framework.records import CorruptRecord

__all__ = ["CorruptCheckpoint", "Link", "OutboxRow", "PartitionStore", "Progress", "UrlState"]


class UrlState(enum.IntEnum):
    """A URL's state in the ``urls`` table (stored as its integer)."""

    PENDING = 0
    DONE = 1
    BLOCKED = 2


class CorruptCheckpoint(CorruptRecord):
    """A published checkpoint file that cannot be restored (missing or damaged)."""


class OutboxRow(NamedTuple):
    """A link waiting in the outbox: its row ``id``, the destination partition ``dst``."""

    id: int
    dst: int
    url: str
    depth: int


#: ``(url, host, depth)`` of a link to crawl.
Link = tuple[str, str, int]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS urls (url TEXT PRIMARY KEY, host TEXT NOT NULL,
                                 depth INTEGER NOT NULL, state INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS urls_pending ON urls(state) WHERE state = 0;
CREATE TABLE IF NOT EXISTS outbox (id INTEGER PRIMARY KEY AUTOINCREMENT, dst INTEGER NOT NULL,
                                   url TEXT NOT NULL, depth INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS consumed (name TEXT PRIMARY KEY);
CREATE TABLE IF NOT EXISTS robots (host TEXT PRIMARY KEY, status INTEGER NOT NULL,
                                   body TEXT NOT NULL);
"""


@attrs.frozen
class Progress:
    """How far a partition is: URLs ``pending``, ``done`` (fetched, whatever the HTTP
    outcome) and ``blocked`` (robots.txt); links in the ``outbox`` (found for other
    partitions, not shipped yet)."""

    pending: int = 0
    done: int = 0
    blocked: int = 0
    outbox: int = 0

    @property
    def idle(self) -> bool:
        """Nothing pending and nothing unshipped."""
        return self.pending == 0 and self.outbox == 0


class PartitionStore:
    """The sqlite working copy of one partition (see the module doc).  Not thread-safe:
    use it from one trio thread."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=OFF")
        self._db.executescript(_SCHEMA)

    @classmethod
    def restore(cls, checkpoint: Path | None, working: Path) -> PartitionStore:
        """A working copy at ``working`` made from ``checkpoint`` (empty when ``None``);
        :class:`CorruptCheckpoint` if ``checkpoint`` cannot be read back whole (the working
        copy is then removed; the checkpoint is left as it is)."""
        for stale in (working, working.with_name(working.name + "-wal"),
                      working.with_name(working.name + "-shm")):
            stale.unlink(missing_ok=True)
        working.parent.mkdir(parents=True, exist_ok=True)
        if checkpoint is not None:
            try:
                _copy_checked(checkpoint, working)
            except (sqlite3.DatabaseError, CorruptCheckpoint) as exc:
                working.unlink(missing_ok=True)
                raise CorruptCheckpoint(f"checkpoint {checkpoint} cannot be restored: "
                                        f"{exc}") from None
        return cls(working)

    def close(self) -> None:
        self._db.close()

    # ------------------------------------------------------------ reads

    def pending(self) -> list[Link]:
        return list(self._db.execute("SELECT url, host, depth FROM urls WHERE state = 0"))

    def progress(self) -> Progress:
        by_state = dict(self._db.execute("SELECT state, COUNT(*) FROM urls GROUP BY state"))
        (outbox,) = self._db.execute("SELECT COUNT(*) FROM outbox").fetchone()
        return Progress(by_state.get(UrlState.PENDING, 0), by_state.get(UrlState.DONE, 0),
                        by_state.get(UrlState.BLOCKED, 0), outbox)

    def depth(self, url: str) -> int | None:
        row = self._db.execute("SELECT depth FROM urls WHERE url = ?", (url,)).fetchone()
        return None if row is None else int(row[0])

    def consumed(self) -> set[str]:
        return {name for (name,) in self._db.execute("SELECT name FROM consumed")}

    def robots(self) -> dict[str, tuple[int, str]]:
        return {host: (status, body) for host, status, body
                in self._db.execute("SELECT host, status, body FROM robots")}

    def outbox(self, limit: int) -> list[OutboxRow]:
        """Up to ``limit`` unshipped links, oldest first."""
        return [OutboxRow(*row) for row in self._db.execute(
            "SELECT id, dst, url, depth FROM outbox ORDER BY id LIMIT ?", (limit,))]

    # ------------------------------------------------------------ writes (one transaction each)

    def add(self, links: Iterable[Link]) -> list[Link]:
        """Insert the links not seen yet; returns them (now pending)."""
        with self._txn():
            return self._add(links)

    def consume(self, name: str, links: Iterable[Link]) -> list[Link]:
        """Merge inbox file ``name``: its new links become pending, the name is recorded."""
        with self._txn():
            self._db.execute("INSERT OR IGNORE INTO consumed(name) VALUES (?)", (name,))
            return self._add(links)

    def complete(self, url: str, state: UrlState, own: Sequence[Link],
                 others: Sequence[tuple[int, str, int]]) -> list[Link]:
        """Mark ``url`` done (or blocked), add its links for this partition (returns the new
        ones) and queue ``(dst, url, depth)`` links for other partitions in the outbox."""
        with self._txn():
            self._db.execute("UPDATE urls SET state = ? WHERE url = ?", (int(state), url))
            if others:
                self._db.executemany("INSERT INTO outbox(dst, url, depth) VALUES (?, ?, ?)",
                                     others)
            return self._add(own)

    def shipped(self, ids: Sequence[int]) -> None:
        with self._txn():
            self._db.executemany("DELETE FROM outbox WHERE id = ?", ((i,) for i in ids))

    def forget_consumed(self, names: Iterable[str]) -> None:
        with self._txn():
            self._db.executemany("DELETE FROM consumed WHERE name = ?", ((n,) for n in names))

    def set_robots(self, host: str, status: int, body: str) -> None:
        with self._txn():
            self._db.execute("INSERT OR REPLACE INTO robots(host, status, body) VALUES (?, ?, ?)",
                             (host, status, body))

    # ------------------------------------------------------------ snapshot

    def checkpoint(self, target: Path) -> None:
        """Write a consistent snapshot of the whole store to ``target`` (a new file)."""
        target.unlink(missing_ok=True)
        copy = sqlite3.connect(target)
        try:
            self._db.backup(copy)
        finally:
            copy.close()

    # ------------------------------------------------------------ internals

    def _add(self, links: Iterable[Link]) -> list[Link]:
        new: list[Link] = []
        insert = "INSERT OR IGNORE INTO urls(url, host, depth, state) VALUES (?, ?, ?, 0)"
        for link in links:
            if self._db.execute(insert, link).rowcount:
                new.append(link)
            else:  # found again by a shorter path while still pending: keep the smaller depth
                self._db.execute("UPDATE urls SET depth = ? WHERE url = ? AND state = 0 "
                                 "AND depth > ?", (link[2], link[0], link[2]))
        return new

    def _txn(self) -> _Transaction:
        return _Transaction(self._db)


def _copy_checked(checkpoint: Path, working: Path) -> None:
    """Copy ``checkpoint`` to ``working`` (sqlite's online backup) and check the copy."""
    if not checkpoint.is_file():
        raise CorruptCheckpoint("the file is missing")
    source = sqlite3.connect(f"file:{checkpoint}?mode=ro", uri=True)
    target = sqlite3.connect(working)
    try:
        source.backup(target)
        (verdict,) = target.execute("PRAGMA quick_check").fetchone()
        if verdict != "ok":
            raise CorruptCheckpoint(f"sqlite quick_check: {verdict}")
        target.executescript(_SCHEMA)  # not sqlite at all would fail here at the latest
    finally:
        source.close()
        target.close()


class _Transaction:
    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def __enter__(self) -> None:
        self._db.execute("BEGIN IMMEDIATE")

    def __exit__(self, kind: object, *_: object) -> None:
        self._db.execute("COMMIT" if kind is None else "ROLLBACK")
