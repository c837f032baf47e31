"""Storing fetched pages in WARC files (warcio), and reading back what was stored.

:class:`WarcWriter` appends one gzip-compressed ``response`` record (WARC headers + the HTTP
status line and headers + the body as received) for every HTTP response a fetch received,
redirect hops included, to a file of its own (one writer per fetcher process; names carry
the host name, the pid and a random tag, so writers sharing a directory never collide).
Each file starts with a ``warcinfo`` record and is rotated once it passes ``max_bytes``.

Durability: each record is built in memory and written with one ``write`` + ``flush``, so a
process killed with ``kill -9`` leaves at most its last record cut short.  A file being
written is named ``*.warc.gz.open`` and renamed to ``*.warc.gz`` when closed; a killed
writer leaves its ``.open`` file, which the readers read too, skipping a damaged tail.

Reading: :func:`iter_stored` yields ``(url, payload_digest)`` per response record,
:func:`iter_records` the full records, :func:`summarize` counts them per URL (duplicates
come from at-least-once redelivery) and compares with an expected set of URLs.
"""

from __future__ import annotations

import datetime as dt
import io
import os
import secrets
import socket
import threading
import zlib
from collections import Counter
from collections.abc import Collection, Iterable, Iterator
from pathlib import Path

import attrs
import trio
from warcio.archiveiterator import ArchiveIterator
from warcio.exceptions import ArchiveLoadFailed
from warcio.statusandheaders import StatusAndHeaders
from warcio.timeutils import datetime_to_iso_date
from warcio.warcwriter import WARCWriter

from examples.fetch_service.fetch import FetchResult, RawResponse
from framework.logs import get_logger

__all__ = [
    "StoreSummary",
    "StoredRecord",
    "WarcWriter",
    "iter_records",
    "iter_stored",
    "summarize",
    "warc_files",
]

log = get_logger("examples.fetch_service.warc")

SUFFIX = ".warc.gz"
OPEN_SUFFIX = SUFFIX + ".open"
SOFTWARE = "framework examples.fetch_service (warcio)"
# Hop-by-hop framing that no longer describes the stored body.
_DROPPED_HEADERS = frozenset({"transfer-encoding", "content-length"})


class WarcWriter:
    """Writes response records to rotating gzip WARC files in ``directory``.

    Use as a context manager (sync or async) or call :meth:`close`; closing renames the
    current file to its final name.  :meth:`write` is thread-safe and blocking;
    :meth:`store` is the trio-friendly form (runs the write in a worker thread, and a
    cancelled store still finishes its record) with the signature ``Fetcher.fetch_batch``
    expects for ``on_result``.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        prefix: str = "fetch",
        max_bytes: int = 1_000_000,
        writer_id: str | None = None,
    ) -> None:
        if max_bytes < 1:
            raise ValueError(f"max_bytes must be >= 1, got {max_bytes}")
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.prefix = prefix
        self.max_bytes = max_bytes
        self.writer_id = writer_id or f"{socket.gethostname()}-{os.getpid()}"
        self.records_written = 0
        self._tag = secrets.token_hex(3)
        self._serial = 0
        self._lock = threading.Lock()
        self._file: io.BufferedWriter | None = None
        self._path: Path | None = None
        self._size = 0
        self._closed_files: list[Path] = []

    @property
    def files(self) -> list[Path]:
        """Files this writer finished (closed and renamed), oldest first."""
        return list(self._closed_files)

    @property
    def current_path(self) -> Path | None:
        """The ``.open`` file being written, if any."""
        return self._path

    def write(self, response: RawResponse) -> Path:
        """Append one response record; returns the file it went to.  Blocking."""
        record = _response_record(response)
        with self._lock:
            if self._file is None:
                self._open()
            assert self._file is not None and self._path is not None
            self._file.write(record)
            self._file.flush()
            self._size += len(record)
            self.records_written += 1
            path = self._path
            if self._size >= self.max_bytes:
                self._close_current()
        return path

    def write_all(self, responses: Iterable[RawResponse]) -> None:
        for response in responses:
            self.write(response)

    async def store(self, result: FetchResult) -> None:
        """Store every response of a fetch result (nothing when none was received)."""
        if result.responses:
            await trio.to_thread.run_sync(self.write_all, result.responses)

    def close(self) -> None:
        with self._lock:
            self._close_current()

    def __enter__(self) -> WarcWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    async def __aenter__(self) -> WarcWriter:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await trio.to_thread.run_sync(self.close)

    def _open(self) -> None:
        self._serial += 1
        stamp = _now_stamp()
        name = f"{self.prefix}-{stamp}-{self.writer_id}-{self._tag}-{self._serial:05d}{SUFFIX}"
        path = self.directory / (name + ".open")
        handle = open(path, "xb")  # noqa: SIM115 - kept open across writes, closed in _close_current
        info = io.BytesIO()
        writer = WARCWriter(info, gzip=True, warc_version="WARC/1.1")
        writer.write_record(
            writer.create_warcinfo_record(
                name,
                {
                    "software": SOFTWARE,
                    "format": "WARC File Format 1.1",
                    "writer-id": self.writer_id,
                },
            )
        )
        handle.write(info.getvalue())
        handle.flush()
        self._file, self._path, self._size = handle, path, len(info.getvalue())
        log.debug("warc.opened", path=str(path))

    def _close_current(self) -> None:
        if self._file is None or self._path is None:
            return
        self._file.close()
        final = self._path.with_name(self._path.name.removesuffix(".open"))
        self._path.replace(final)
        self._closed_files.append(final)
        log.debug("warc.closed", path=str(final), bytes=self._size)
        self._file, self._path, self._size = None, None, 0


def _now_stamp() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y%m%d%H%M%S")


def _response_record(response: RawResponse) -> bytes:
    headers = [(k, v) for k, v in response.headers if k.lower() not in _DROPPED_HEADERS]
    headers.append(("Content-Length", str(len(response.body))))
    version = response.http_version if response.http_version.startswith("HTTP/") else "HTTP/1.1"
    status_line = f"{response.status} {response.reason}".rstrip()
    http_headers = StatusAndHeaders(status_line, headers, protocol=version)
    fetched_at = response.fetched_at
    if fetched_at.tzinfo is not None:
        fetched_at = fetched_at.astimezone(dt.UTC).replace(tzinfo=None)
    warc_headers = {"WARC-Date": datetime_to_iso_date(fetched_at, use_micros=True)}
    if response.remote_ip:
        warc_headers["WARC-IP-Address"] = response.remote_ip
    if response.truncated:
        warc_headers["WARC-Truncated"] = "length"
    buffer = io.BytesIO()
    writer = WARCWriter(buffer, gzip=True, warc_version="WARC/1.1")
    record = writer.create_warc_record(
        response.url,
        "response",
        payload=io.BytesIO(response.body),
        length=len(response.body),
        http_headers=http_headers,
        warc_headers_dict=warc_headers,
    )
    writer.write_record(record)
    return buffer.getvalue()


# -- reading ------------------------------------------------------------------------------


@attrs.frozen
class StoredRecord:
    """One stored response record."""

    url: str
    digest: str
    status: int
    date: str
    file: Path
    offset: int
    body: bytes | None = None
    headers: tuple[tuple[str, str], ...] = ()


def warc_files(directory: str | os.PathLike[str]) -> list[Path]:
    """The WARC files in ``directory`` (finished and ``.open`` ones), sorted by name."""
    root = Path(directory)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.name.endswith((SUFFIX, OPEN_SUFFIX))]
    return sorted(found)


def iter_records(
    directory: str | os.PathLike[str],
    *,
    with_body: bool = False,
    damaged: list[tuple[Path, str]] | None = None,
) -> Iterator[StoredRecord]:
    """Every ``response`` record of every WARC file in ``directory``.

    A file whose end is damaged (a writer killed mid-record) yields the records before the
    damage; ``(file, reason)`` is appended to ``damaged`` when given, and logged.
    """
    for path in warc_files(directory):
        intact = _intact_prefix(path)
        size = path.stat().st_size
        reason: str | None = None
        if intact < size:
            reason = f"{size - intact} bytes of a cut-short record at offset {intact}"
        with open(path, "rb") as stream:
            records = ArchiveIterator(stream)
            try:
                for record in records:
                    kind = record.rec_type
                    headers = record.http_headers
                    # Read the body before asking the offset (that consumes the record).
                    body = (
                        record.content_stream().read() if with_body and kind == "response" else None
                    )
                    offset = records.get_record_offset()
                    if offset >= intact:
                        break
                    if kind != "response":
                        continue
                    yield StoredRecord(
                        url=record.rec_headers.get_header("WARC-Target-URI"),
                        digest=record.rec_headers.get_header("WARC-Payload-Digest") or "",
                        status=int(headers.get_statuscode()) if headers else 0,
                        date=record.rec_headers.get_header("WARC-Date") or "",
                        file=path,
                        offset=offset,
                        body=body,
                        headers=tuple(headers.headers) if headers and with_body else (),
                    )
            except (ArchiveLoadFailed, EOFError, OSError, ValueError) as exc:
                reason = f"{type(exc).__name__}: {exc}".strip()
        if reason is not None:
            log.warning("warc.damaged", path=str(path), reason=reason)
            if damaged is not None:
                damaged.append((path, reason))


def _intact_prefix(path: Path, chunk_size: int = 1 << 16) -> int:
    """Length of the leading run of complete gzip members (one member = one record).

    warcio reads a cut-short last member without complaint, so this is how a record
    interrupted by a ``kill -9`` is told apart from a complete one.
    """
    intact = 0  # end of the last complete member
    position = 0  # bytes of the file fed to the decompressor so far
    member: zlib._Decompress | None = None
    with open(path, "rb") as stream:
        pending = b""
        while True:
            if not pending:
                pending = stream.read(chunk_size)
                if not pending:
                    return intact
            if member is None:
                member = zlib.decompressobj(wbits=31)
            try:
                member.decompress(pending)
            except zlib.error:
                return intact
            if member.eof:
                used = len(pending) - len(member.unused_data)
                position += used
                intact = position
                pending = member.unused_data
                member = None
            else:
                position += len(pending)
                pending = b""


def iter_stored(directory: str | os.PathLike[str]) -> Iterator[tuple[str, str]]:
    """``(url, payload_digest)`` for each stored response, in file order."""
    for record in iter_records(directory):
        yield record.url, record.digest


@attrs.frozen
class StoreSummary:
    """What a directory of WARC files holds, compared with the URLs that should be there.

    ``counts``: records per URL; ``duplicates``: records beyond the first per URL;
    ``missing``: expected URLs with no record; ``unexpected``: stored URLs not expected;
    ``damaged``: files with a cut-short tail.
    """

    counts: dict[str, int]
    records: int
    duplicates: int
    files: int
    missing: frozenset[str] = frozenset()
    unexpected: frozenset[str] = frozenset()
    damaged: tuple[tuple[Path, str], ...] = ()

    @property
    def duplicated_urls(self) -> dict[str, int]:
        return {url: count for url, count in self.counts.items() if count > 1}

    @property
    def complete(self) -> bool:
        """Every expected URL stored and nothing else (duplicates allowed)."""
        return not self.missing and not self.unexpected


def summarize(
    directory: str | os.PathLike[str], expected: Collection[str] | None = None
) -> StoreSummary:
    """Count stored records per URL; with ``expected``, also what is missing or extra."""
    damaged: list[tuple[Path, str]] = []
    counts = Counter(url for url, _ in _pairs(iter_records(directory, damaged=damaged)))
    stored = set(counts)
    wanted = set(expected) if expected is not None else stored
    return StoreSummary(
        counts=dict(counts),
        records=sum(counts.values()),
        duplicates=sum(count - 1 for count in counts.values()),
        files=len(warc_files(directory)),
        missing=frozenset(wanted - stored),
        unexpected=frozenset(stored - wanted),
        damaged=tuple(damaged),
    )


def _pairs(records: Iterable[StoredRecord]) -> Iterator[tuple[str, str]]:
    for record in records:
        yield record.url, record.digest
