"""A topic's local log: append-only segment files on disk plus an in-memory index.

A record (:class:`Record`) is ``(producer, seq, payload)``; its offset is its position in the
log.  Each append is written to the current segment file (``<dir>/<topic>/<first-offset>.seg``,
a new segment every ``segment_bytes``) before it is visible to readers; with
``fsync="always"`` the segment is fsynced before the append returns, with ``"never"`` a
server crash keeps the data and a machine crash may not (the backup's copy is what protects
acknowledged messages).

Record format on disk (:func:`encode_records`, :func:`decode_segment`)::

    +------------------+-------------------+--------------------------------------+
    | length (u32, BE) | crc32 (u32, BE)   | body: msgpack [producer, seq, payload]|
    +------------------+-------------------+--------------------------------------+

The crc (``zlib.crc32``) covers the body.

Guarantees:

* **Recovery.**  A log opened on a directory that holds segments recovers them, in offset
  order; the first record that is cut short, fails its checksum or does not decode ends the
  log: it and everything after it are cut off (the file truncated there, later segments
  removed; ``broker.log_truncated`` says how much).  A torn tail can only be a record whose
  append never returned, so never an acknowledged one.  The directory is never removed at
  start.
* **Copies.**  ``meta.json`` (a :class:`LogMeta` record) says which *copy* of the topic the
  log is (:attr:`TopicLog.copy`, a random token drawn whenever the log starts afresh:
  :meth:`TopicLog.reset`), the in-sync term it last served as primary
  (:attr:`TopicLog.primary_term`, written *before* the takeover is attempted) and the topic
  incarnation it belongs to (:meth:`TopicLog.bind`: a log of an earlier topic of the same
  name, or of another cluster, starts afresh).  The file is replaced atomically (write,
  fsync, rename, fsync of the directory) before the log changes that it describes, so a
  crash never leaves a new log under an old token.  A ``meta.json`` that is not a record is
  logged (``broker.log_meta_corrupt``) and the log counts as a copy of its own (a new
  token): it can never be taken for the copy ZooKeeper counted in sync.
* Appends are atomic with respect to readers (a reader never sees a partial batch);
  :meth:`TopicLog.wait_beyond` wakes every waiter on each append, no polling.  Reads are
  served from memory.
* Raises: :class:`OSError` from the disk, :class:`~framework.errors.ConfigurationError` for
  an unknown fsync policy.
"""

from __future__ import annotations

import enum
import os
import struct
import uuid
import zlib
from pathlib import Path
from typing import Any, NamedTuple

import attrs
import msgpack
import trio

from framework import records
from framework.durable import fsync_dir, write_durably
from framework.errors import ConfigurationError
from framework.logs import get_logger


class Record(NamedTuple):
    """One message in a log: who sent it, its sequence number for that producer, its bytes.
    On disk and on the wire it is the array ``[producer, seq, payload]``."""

    producer: str
    seq: int
    payload: bytes


def records_from(values: Any) -> list[Record]:
    """The :class:`Record` of each array ``[producer, seq, payload]`` in ``values`` (the wire's
    and the disk's form); ``ValueError`` for one that is not a record.  On the replication
    and subscription path: one loop, no per-record dispatch."""
    out: list[Record] = []
    try:
        for producer, seq, payload in values:
            if type(producer) is not str or type(seq) is not int or type(payload) is not bytes:
                raise ValueError(f"a record must be [str, int, bytes], not "
                                 f"[{type(producer).__name__}, {type(seq).__name__}, "
                                 f"{type(payload).__name__}]")
            out.append(_new(Record, (producer, seq, payload)))
    except TypeError:
        raise ValueError("a record must be an array [producer, seq, payload]") from None
    return out


def record_from(value: Any) -> Record:
    """One :class:`Record` from its array form (:func:`records_from`)."""
    return records_from((value,))[0]


_new = tuple.__new__


class Fsync(enum.Enum):
    """When an append reaches the disk: before it returns, or when the OS flushes."""

    ALWAYS = "always"
    NEVER = "never"


@attrs.frozen
class LogMeta:
    """``meta.json``: which copy of the topic a log is (see the module doc)."""

    copy: str = ""
    primary_term: int | None = None
    topic_id: str | None = None


_HEAD = struct.Struct(">II")
_META = "meta.json"
_SUFFIX = ".seg"

log = get_logger("examples.message_broker.log")


def new_copy_token() -> str:
    return uuid.uuid4().hex[:12]


def encode_records(records: list[Record]) -> bytes:
    """The on-disk bytes of ``records`` (module doc).  The append path of the primary and of
    every backup: one packer for the whole batch (``msgpack.packb`` builds a new one per
    call, which cost as much as the packing of a 1 KB record)."""
    pack = msgpack.Packer(use_bin_type=True).pack
    head, crc32 = _HEAD.pack, zlib.crc32
    chunks = []
    for record in records:
        body = pack(record)
        chunks.append(head(len(body), crc32(body)))
        chunks.append(body)
    return b"".join(chunks)


def decode_segment(blob: bytes) -> tuple[list[Record], int, str | None]:
    """The whole records at the start of ``blob``, the byte length they take, and why the rest
    (if any) was not taken: ``None`` when the blob ends exactly after a record."""
    records: list[Record] = []
    pos = 0
    while pos < len(blob):
        if pos + _HEAD.size > len(blob):
            return records, pos, "cut short in a record header"
        length, crc = _HEAD.unpack_from(blob, pos)
        start = pos + _HEAD.size
        if start + length > len(blob):
            return records, pos, "cut short in a record body"
        body = blob[start:start + length]
        if zlib.crc32(body) != crc:
            return records, pos, "checksum mismatch"
        try:
            record = record_from(msgpack.unpackb(body, raw=False))
        except Exception:  # msgpack raises several unrelated types
            return records, pos, "record does not decode"
        records.append(record)
        pos = start + length
    return records, pos, None


class TopicLog:
    """One topic's records (see the module doc).  Opening recovers what the directory holds."""

    def __init__(self, directory: Path, *, fsync: Fsync | str = Fsync.NEVER,
                 segment_bytes: int = 8 * 1024 * 1024) -> None:
        try:
            self.fsync = Fsync(fsync)
        except ValueError:
            raise ConfigurationError(f"fsync must be one of "
                                     f"{', '.join(f.value for f in Fsync)}, got {fsync!r}") \
                from None
        self.directory = directory
        self.segment_bytes = segment_bytes
        self.records: list[Record] = []
        #: last sequence number appended per producer (idempotent retries)
        self.last_seq: dict[str, int] = {}
        #: this copy's token, and the in-sync term it last served as primary (module doc)
        self.copy = ""
        self.primary_term: int | None = None
        #: the topic incarnation this log belongs to (``None``: not bound yet)
        self.topic_id: str | None = None
        #: records found on disk when the log was opened, and bytes cut off as a torn tail
        self.recovered = 0
        self.cut_bytes = 0
        self._file: Any = None
        self._segment_size = 0
        self._grown = trio.Event()
        self.directory.mkdir(parents=True, exist_ok=True)
        self._recover()

    @property
    def end(self) -> int:
        """Offset the next record will get (= number of records)."""
        return len(self.records)

    # ------------------------------------------------------------ metadata

    def _read_meta(self) -> LogMeta:
        try:
            data = (self.directory / _META).read_bytes()
        except FileNotFoundError:
            return LogMeta()
        try:
            return records.decode(data, LogMeta)
        except records.CorruptRecord as exc:
            log.warning("broker.log_meta_corrupt", directory=str(self.directory),
                        error=str(exc))
            return LogMeta()

    def _write_meta(self) -> None:
        write_durably(self.directory / _META, records.encode(
            LogMeta(self.copy, self.primary_term, self.topic_id)))

    def bind(self, topic_id: str) -> None:
        """This log belongs to topic incarnation ``topic_id``; a log recovered for another one
        (or for none) is reset first (module doc).  Idempotent."""
        if self.topic_id == topic_id:
            return
        if self.end or self.topic_id is not None:
            log.warning("broker.log_foreign", directory=str(self.directory), records=self.end,
                        was=self.topic_id, topic_id=topic_id)
            self.reset()
        self.topic_id = topic_id
        self._write_meta()

    def mark_primary(self, term: int) -> None:
        """Record (durably) that this log serves the in-sync term ``term`` as primary; call
        before attempting the takeover (a failed attempt leaves a term someone else holds)."""
        if self.primary_term != term:
            self.primary_term = term
            self._write_meta()

    # ------------------------------------------------------------ recovery

    def _segments(self) -> list[Path]:
        found = []
        for path in self.directory.glob(f"*{_SUFFIX}"):
            try:
                found.append((int(path.stem), path))
            except ValueError:
                continue
        return [path for _first, path in sorted(found)]

    def _recover(self) -> None:
        meta = self._read_meta()
        self.copy, self.primary_term, self.topic_id = meta.copy, meta.primary_term, meta.topic_id
        segments = self._segments()
        cut_at: tuple[Path, int, str] | None = None
        for index, path in enumerate(segments):
            if int(path.stem) != self.end:
                cut_at = (path, 0, f"segment starts at {path.stem}, log ends at {self.end}")
            else:
                records, used, why = decode_segment(path.read_bytes())
                self._take(records)
                if why is not None:
                    cut_at = (path, used, why)
            if cut_at is not None:
                self._cut(cut_at, segments[index + 1:])
                break
        self.recovered = self.end
        if not self.copy:  # a log without its metadata is a copy of its own
            self.copy = new_copy_token()
            self._write_meta()
        if segments and cut_at is None:
            last = segments[-1]
            self._file = open(last, "ab")  # noqa: SIM115
            self._segment_size = last.stat().st_size
        if self.recovered or self.cut_bytes:
            log.info("broker.log_recovered", directory=str(self.directory), records=self.end,
                     cut_bytes=self.cut_bytes, copy=self.copy, primary_term=self.primary_term)

    def _cut(self, at: tuple[Path, int, str], later: list[Path]) -> None:
        path, size, why = at
        self.cut_bytes = path.stat().st_size - size + sum(p.stat().st_size for p in later)
        log.warning("broker.log_truncated", directory=str(self.directory), segment=path.name,
                    offset=self.end, bytes=self.cut_bytes, reason=why)
        for extra in later:
            extra.unlink()
        if size == 0:
            path.unlink()
        else:
            os.truncate(path, size)
            with open(path, "ab") as out:
                os.fsync(out.fileno())
            self._file = open(path, "ab")  # noqa: SIM115
            self._segment_size = size
        fsync_dir(self.directory)

    # ------------------------------------------------------------ changes

    def reset(self) -> None:
        """Start a new, empty copy (a backup about to copy a new primary term from offset 0):
        a new token is written first, then the segments are removed (module doc)."""
        self._close()
        self.copy = new_copy_token()
        self.primary_term = None
        self._write_meta()
        for path in self._segments():
            path.unlink()
        self.records = []
        self.last_seq = {}
        self._segment_size = 0
        self._wake()

    def _close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def close(self) -> None:
        self._close()

    def _segment(self) -> Any:
        if self._file is None or self._segment_size >= self.segment_bytes:
            self._close()
            self._file = open(self.directory / f"{self.end:020d}{_SUFFIX}", "ab")  # noqa: SIM115
            self._segment_size = 0
        return self._file

    def _take(self, records: list[Record]) -> None:
        self.records.extend(records)
        last_seq = self.last_seq
        for producer, seq, _payload in records:
            if seq > last_seq.get(producer, -1):
                last_seq[producer] = seq

    def append(self, records: list[Record]) -> int:
        """Append ``records`` (already de-duplicated by the caller); return the new end."""
        if not records:
            return self.end
        out = self._segment()
        blob = encode_records(records)
        out.write(blob)
        out.flush()
        if self.fsync is Fsync.ALWAYS:
            os.fsync(out.fileno())
        self._segment_size += len(blob)
        self._take(records)
        self._wake()
        return self.end

    def new_records(self, producer: str, seq: int, payloads: list[bytes]) -> list[Record]:
        """The records of a produce batch that the log does not hold yet (by sequence)."""
        skip = max(0, self.last_seq.get(producer, -1) + 1 - seq)
        return [_new(Record, (producer, number, payload))
                for number, payload in enumerate(payloads[skip:], seq + skip)]

    def read(self, offset: int, limit: int, max_bytes: int = 1024 * 1024) -> list[Record]:
        """Up to ``limit`` records from ``offset`` (at least one if any), about ``max_bytes``."""
        out: list[Record] = []
        size = 0
        for record in self.records[offset:offset + limit]:
            size += len(record.payload) + 32
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
