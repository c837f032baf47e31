"""Per-partition inboxes: objects of links in the job's shared store, delivered at least once.

A sender writes a batch of links for partition ``q`` as one new object under ``inbox/q/``
of the job's store (an :class:`InboxBatch` through :mod:`framework.records`; written
atomically by :class:`framework.BlobStore`: a temporary name renamed on a file store, one PUT
on S3, so a reader sees whole files only), and only then deletes those links from its
outbox.  The receiver merges a file into its store and records the file's name in the same
transaction; it deletes the file only after a checkpoint that records it was published.  So
a link is always in a sender's outbox, in an inbox file, or in the receiver's published
state: a crash anywhere loses none, and may deliver some twice (the seen-set drops the
second copy).

A file that is not a batch (damaged by the file system, or written by hand) makes
:func:`read_inbox_file` raise :class:`framework.records.CorruptRecord`; the receiver then
sets it aside with :func:`quarantine` (renamed, kept for an operator, counted in the crawl's
report) instead of stopping the partition or dropping it unseen.

File names: ``<sender>-e<epoch>-<seq>.json``; epochs are unique per takeover, so two owners of
one partition (a deposed one still running) never write the same name.  ``inbox`` below is
the key of one partition's inbox in the store (:meth:`.layout.SharedDir.inbox_key`).  Every
function here is blocking (file or network I/O): call it from a worker thread.  A store that
cannot be reached raises :class:`framework.StoreUnavailable` (an ``OSError``).
"""

from __future__ import annotations

import attrs

from framework import BlobMissing, BlobStore, records

__all__ = ["InboxBatch", "inbox_file_name", "list_inbox", "list_quarantined", "quarantine",
           "read_inbox_file", "write_inbox_file"]

SUFFIX = ".json"
CORRUPT_SUFFIX = ".corrupt"


@attrs.frozen
class InboxBatch:
    """One inbox file: ``(url, depth)`` links for the partition (canonical URLs)."""

    links: tuple[tuple[str, int], ...] = ()


def inbox_file_name(sender: str, epoch: int, seq: int) -> str:
    return f"{sender}-e{epoch:06d}-{seq:09d}{SUFFIX}"


def write_inbox_file(store: BlobStore, inbox: str, name: str, batch: InboxBatch) -> None:
    """Write ``batch`` as ``inbox/name``, durably and atomically (``OSError`` if it cannot
    be written; then no file of that name appears)."""
    store.put(f"{inbox}/{name}", records.encode(batch))


def _names(store: BlobStore, inbox: str) -> list[str]:
    """Names of the objects directly in ``inbox``."""
    return [info.key[len(inbox) + 1:] for info in store.list(inbox)
            if "/" not in info.key[len(inbox) + 1:]]


def list_inbox(store: BlobStore, inbox: str) -> list[str]:
    """Names of the complete files in ``inbox``, oldest name first (quarantined files
    excluded; ``[]`` if there is none)."""
    return sorted(n for n in _names(store, inbox) if n.endswith(SUFFIX) and not n.startswith("."))


def read_inbox_file(store: BlobStore, inbox: str, name: str) -> InboxBatch:
    """The batch in one file (empty if the file is already gone: merged and deleted by
    another owner); :class:`~framework.records.CorruptRecord` if it is not a batch."""
    try:
        data = store.get(f"{inbox}/{name}")
    except BlobMissing:
        return InboxBatch()
    return records.decode(data, InboxBatch)


def quarantine(store: BlobStore, inbox: str, name: str) -> str:
    """Set an unreadable inbox file aside: renamed to a hidden ``.<name>.corrupt`` in the
    same inbox (no longer listed, kept for an operator).  Returns the new key."""
    target = f"{inbox}/.{name}{CORRUPT_SUFFIX}"
    try:
        store.rename(f"{inbox}/{name}", target)
    except BlobMissing:
        pass  # another owner set it aside already
    return target


def list_quarantined(store: BlobStore, inbox: str) -> list[str]:
    """Names of the files :func:`quarantine` set aside in ``inbox``."""
    return sorted(n for n in _names(store, inbox) if n.endswith(CORRUPT_SUFFIX))
