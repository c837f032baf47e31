"""Per-partition inboxes: files of links in the shared directory, delivered at least once.

A sender writes a batch of links for partition ``q`` as one new file in ``inbox/q/``
(written under ``.tmp``, flushed to disk, then renamed: a reader sees whole files only), and
only then deletes those links from its outbox.  The receiver merges a file into its store and
records the file's name in the same transaction; it deletes the file only after a checkpoint
that records it was published.  So a link is always in a sender's outbox, in an inbox file,
or in the receiver's published state: a crash anywhere loses none, and may deliver some
twice (the seen-set drops the second copy).

File names: ``<sender>-e<epoch>-<seq>.json``; epochs are unique per takeover, so two owners of
one partition (a deposed one still running) never write the same name.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["inbox_file_name", "list_inbox", "read_inbox_file", "write_inbox_file"]

SUFFIX = ".json"


def inbox_file_name(sender: str, epoch: int, seq: int) -> str:
    return f"{sender}-e{epoch:06d}-{seq:09d}{SUFFIX}"


def write_inbox_file(directory: Path, name: str, links: Sequence[Sequence[Any]]) -> None:
    """Write ``[[url, depth], ...]`` as ``directory/name``, durably and atomically.  Blocking."""
    target = directory / name
    tmp = directory / f".{name}.tmp"
    with open(tmp, "wb") as handle:
        handle.write(json.dumps([list(link) for link in links], separators=(",", ":")).encode())
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, target)
    _fsync_dir(directory)


def list_inbox(directory: Path) -> list[str]:
    """Names of the complete files in ``directory``, oldest name first.  Blocking."""
    try:
        return sorted(n for n in os.listdir(directory)
                      if n.endswith(SUFFIX) and not n.startswith("."))
    except FileNotFoundError:
        return []


def read_inbox_file(path: Path) -> list[tuple[str, int]]:
    """The ``(url, depth)`` links of one file (``[]`` if it is already gone).  Blocking."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    return [(str(url), int(depth)) for url, depth in json.loads(data)]


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
