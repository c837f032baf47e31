"""Per-partition inboxes: files of links in the shared directory, delivered at least once.

A sender writes a batch of links for partition ``q`` as one new file in ``inbox/q/``
(an :class:`InboxBatch` through :mod:`framework.records`; written under a hidden ``.tmp``
name, flushed to disk, then renamed: a reader sees whole files only), and only then deletes
those links from its outbox.  The receiver merges a file into its store and records the
file's name in the same transaction; it deletes the file only after a checkpoint that
records it was published.  So a link is always in a sender's outbox, in an inbox file, or in
the receiver's published state: a crash anywhere loses none, and may deliver some twice (the
seen-set drops the second copy).

A file that is not a batch (damaged by the file system, or written by hand) makes
:func:`read_inbox_file` raise :class:`framework.records.CorruptRecord`; the receiver then
sets it aside with :func:`quarantine` (renamed, kept for an operator, counted in the crawl's
report) instead of stopping the partition or dropping it unseen.

File names: ``<sender>-e<epoch>-<seq>.json``; epochs are unique per takeover, so two owners of
one partition (a deposed one still running) never write the same name.  Every function here
is blocking (file I/O): call it from a worker thread.
"""

from __future__ import annotations

import os
from pathlib import Path

import attrs

from framework import records

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


def write_inbox_file(directory: Path, name: str, batch: InboxBatch) -> None:
    """Write ``batch`` as ``directory/name``, durably and atomically (``OSError`` if it
    cannot be written; then no file of that name appears)."""
    target = directory / name
    tmp = directory / f".{name}.tmp"
    with open(tmp, "wb") as handle:
        handle.write(records.encode(batch))
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, target)
    _fsync_dir(directory)


def list_inbox(directory: Path) -> list[str]:
    """Names of the complete files in ``directory``, oldest name first (hidden temporary
    and quarantined files excluded; ``[]`` if the directory does not exist)."""
    try:
        return sorted(n for n in os.listdir(directory)
                      if n.endswith(SUFFIX) and not n.startswith("."))
    except FileNotFoundError:
        return []


def read_inbox_file(path: Path) -> InboxBatch:
    """The batch in one file (empty if the file is already gone: merged and deleted by
    another owner); :class:`~framework.records.CorruptRecord` if it is not a batch."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return InboxBatch()
    return records.decode(data, InboxBatch)


def quarantine(path: Path) -> Path:
    """Set an unreadable inbox file aside: renamed to a hidden ``.<name>.corrupt`` in the
    same directory (no longer listed, kept for an operator).  Returns the new path."""
    target = path.with_name(f".{path.name}{CORRUPT_SUFFIX}")
    try:
        os.replace(path, target)
    except FileNotFoundError:
        pass  # another owner set it aside already
    return target


def list_quarantined(directory: Path) -> list[str]:
    """Names of the files :func:`quarantine` set aside in ``directory``."""
    try:
        return sorted(n for n in os.listdir(directory) if n.endswith(CORRUPT_SUFFIX))
    except FileNotFoundError:
        return []


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
