"""A topic's local log: append-only segment files on disk plus an in-memory index.

Records are ``(producer, seq, payload)``; a record's offset is its position in the log.  Each
append is written to the current segment file (``<dir>/<topic>/<first-offset>.seg``,
length-prefixed msgpack records, a new segment every ``segment_bytes``) before it is visible
to readers; with ``fsync="always"`` the segment is fsynced before the append returns,
``"never"`` leaves flushing to the OS (a server crash keeps the data, a machine crash may
not: the backup's copy is what protects acknowledged messages).

Reads are served from memory (the example keeps logs small).  A log that starts backing a
topic is reset (its files removed) and copied again from the primary: a backup's log is
always a prefix of its primary's log, so offsets name the same message on both copies.

Guarantees: appends are atomic with respect to readers (a reader never sees a partial
batch); :meth:`wait_beyond` wakes every waiter on each append, no polling.
"""

from __future__ import annotations

import os
import shutil
import struct
from pathlib import Path

import msgpack
import trio

Record = tuple[str, int, bytes]

FSYNC_POLICIES = ("always", "never")

_LEN = struct.Struct(">I")


class TopicLog:
    """One topic's records (see the module doc)."""

    def __init__(self, directory: Path, *, fsync: str = "never",
                 segment_bytes: int = 8 * 1024 * 1024) -> None:
        if fsync not in FSYNC_POLICIES:
            from framework.errors import ConfigurationError

            raise ConfigurationError(f"fsync must be one of {FSYNC_POLICIES}, got {fsync!r}")
        self.directory = directory
        self.fsync = fsync
        self.segment_bytes = segment_bytes
        self.records: list[Record] = []
        #: last sequence number appended per producer (idempotent retries)
        self.last_seq: dict[str, int] = {}
        self._file: object | None = None
        self._segment_size = 0
        self._grown = trio.Event()
        self.reset()

    @property
    def end(self) -> int:
        """Offset the next record will get (= number of records)."""
        return len(self.records)

    def reset(self) -> None:
        """Forget everything (a backup about to copy the primary's log again)."""
        self._close()
        shutil.rmtree(self.directory, ignore_errors=True)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.records = []
        self.last_seq = {}
        self._segment_size = 0
        self._wake()

    def _close(self) -> None:
        if self._file is not None:
            self._file.close()  # type: ignore[attr-defined]
            self._file = None

    def close(self) -> None:
        self._close()

    def _segment(self) -> object:
        if self._file is None or self._segment_size >= self.segment_bytes:
            self._close()
            self._file = open(self.directory / f"{self.end:020d}.seg", "ab")  # noqa: SIM115
            self._segment_size = 0
        return self._file

    def append(self, records: list[Record]) -> int:
        """Append ``records`` (already de-duplicated by the caller); return the new end."""
        if not records:
            return self.end
        out = self._segment()
        chunks = []
        for record in records:
            body = msgpack.packb(record, use_bin_type=True)
            chunks.append(_LEN.pack(len(body)) + body)
        blob = b"".join(chunks)
        out.write(blob)  # type: ignore[attr-defined]
        out.flush()  # type: ignore[attr-defined]
        if self.fsync == "always":
            os.fsync(out.fileno())  # type: ignore[attr-defined]
        self._segment_size += len(blob)
        for producer, seq, payload in records:
            self.records.append((producer, seq, payload))
            if seq > self.last_seq.get(producer, -1):
                self.last_seq[producer] = seq
        self._wake()
        return self.end

    def new_records(self, producer: str, seq: int, payloads: list[bytes]) -> list[Record]:
        """The records of a produce batch that the log does not hold yet (by sequence)."""
        last = self.last_seq.get(producer, -1)
        return [(producer, seq + i, p) for i, p in enumerate(payloads) if seq + i > last]

    def read(self, offset: int, limit: int, max_bytes: int = 1024 * 1024) -> list[Record]:
        """Up to ``limit`` records from ``offset`` (at least one if any), about ``max_bytes``."""
        out: list[Record] = []
        size = 0
        for record in self.records[offset:offset + limit]:
            size += len(record[2]) + 32
            if out and size > max_bytes:
                break
            out.append(record)
        return out

    def _wake(self) -> None:
        self._grown.set()
        self._grown = trio.Event()

    async def wait_beyond(self, offset: int) -> None:
        """Return once the log holds a record at ``offset`` (or was reset)."""
        while self.end <= offset:
            await self._grown.wait()
            if self.end < offset:
                return
