"""Blob stores: data several hosts share, named by a URL.

Large data that several processes on several hosts read and write (Katta's shard store, the
crawler's shared directory, the runtime's payload store) lives off ZooKeeper, in a store
named by a URL:

* ``file:///srv/shared/x`` or a bare path (``/srv/shared/x``, ``out/store``): a directory
  on a file system every host mounts at the same path (NFS, CephFS, a local disk on one
  machine).  A relative path is relative to the process's working directory.
* ``s3://bucket/prefix``: any S3-compatible object store (AWS S3, MinIO, Ceph RGW, ...),
  through `obstore <https://developmentseed.org/obstore/>`_.  The endpoint and credentials
  come from the standard environment: ``AWS_ENDPOINT_URL`` (omit for AWS itself),
  ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_REGION`` (or
  ``AWS_DEFAULT_REGION``), ``AWS_ALLOW_HTTP=true`` for a plain-HTTP endpoint.

:func:`open_store` turns a URL into a :class:`BlobStore`.  Keys are relative,
``/``-separated names (``job1/inbox/p003/a.json``); no empty, ``.`` or ``..`` segment.

Guarantees, on both kinds:

* **Writes are atomic.**  A reader sees a whole object or none, never half of one: on a
  file system the data is written to a hidden temporary name in the same directory,
  fsynced, then renamed into place (and the directory fsynced); on S3 an object is one PUT,
  or a multipart upload that becomes visible only when it is completed.  A writer killed
  midway leaves at most a hidden ``.*.part`` file (never listed) or an incomplete multipart
  upload (invisible; the bucket's lifecycle rule removes it).
* **A later write of a key replaces it whole**; a key is never appended to.
* Listing is not a snapshot: a key written or deleted meanwhile may or may not be listed.

Every method blocks (file or network I/O): call it from a worker thread
(``trio.to_thread.run_sync``).  What raises, in one line each (``str(exc)`` is fit for a
user): :class:`~framework.errors.ConfigurationError` for a URL or key that is not one;
:class:`BlobMissing` (also a ``FileNotFoundError``) for a key that is not there;
:class:`StoreUnavailable` (also an ``OSError``) when the store cannot be reached or refuses
(no such bucket, connection refused, permission denied).  A network store retries a failed
request a few times (bounded: :data:`S3_RETRY_TIMEOUT_S`) before it raises.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import shutil
import stat
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol, runtime_checkable
from urllib.parse import unquote, urlsplit

import attrs

from framework.errors import ConfigurationError, FrameworkError

__all__ = ["BlobInfo", "BlobMissing", "BlobStore", "FileBlobStore", "S3BlobStore",
           "StoreUnavailable", "open_store", "store_location"]

#: The schemes :func:`open_store` knows.
SCHEMES = ("file", "s3")
#: How long a network store keeps retrying one failed request before it raises.
S3_RETRY_TIMEOUT_S = 10.0
#: Suffix of a file store's temporary files (hidden names; never listed).
PART_SUFFIX = ".part"

_SEGMENT = re.compile(r"[^/\x00]+")


class BlobMissing(FrameworkError, FileNotFoundError):
    """The key is not in the store (never written, or deleted)."""


class StoreUnavailable(FrameworkError, OSError):
    """The store cannot be reached or refused the request (the message says which)."""


@attrs.frozen
class BlobInfo:
    """One listed object: its key, size in bytes and last modification (epoch seconds)."""

    key: str
    size: int
    modified: float


@runtime_checkable
class BlobStore(Protocol):
    """A store of whole objects under keys (see the module doc for its guarantees)."""

    #: The URL the store was opened with (for messages and for other processes).
    url: str

    def put(self, key: str, data: bytes) -> None:
        """Write ``data`` under ``key`` atomically (replacing what was there)."""
        ...

    def put_file(self, key: str, path: str | os.PathLike[str]) -> None:
        """Write the local file ``path`` under ``key`` atomically (large files, and pipes,
        stream: on S3 as a multipart upload)."""
        ...

    def get(self, key: str) -> bytes:
        """The object under ``key``; :class:`BlobMissing` if there is none."""
        ...

    def get_file(self, key: str, path: str | os.PathLike[str]) -> None:
        """Copy the object under ``key`` to the local file ``path`` (written aside, then
        renamed: ``path`` is whole or untouched); :class:`BlobMissing` if there is none."""
        ...

    def list(self, prefix: str = "") -> list[BlobInfo]:
        """Every object whose key is under ``prefix`` (``prefix/...``, any depth; ``""``:
        all), sorted by key; ``[]`` if there is none."""
        ...

    def exists(self, key: str) -> bool:
        """Whether an object is stored under ``key``."""
        ...

    def delete(self, key: str) -> None:
        """Delete ``key`` (nothing if it is already gone)."""
        ...

    def delete_prefix(self, prefix: str) -> int:
        """Delete every object under ``prefix``; how many."""
        ...

    def rename(self, source: str, target: str) -> None:
        """Move ``source`` to ``target`` (on S3 a copy then a delete: not atomic, but
        ``target`` is whole when it appears); :class:`BlobMissing` if ``source`` is gone."""
        ...


def check_key(key: str, *, allow_empty: bool = False) -> str:
    """``key`` if it is a valid key (or ``""`` when ``allow_empty``), else a one-line
    :class:`ConfigurationError`."""
    if key == "" and allow_empty:
        return key
    parts = key.split("/") if isinstance(key, str) else [""]
    if not all(_SEGMENT.fullmatch(p) and p not in (".", "..") for p in parts):
        raise ConfigurationError(
            f"not a blob key: {key!r} (relative names separated by '/', no '.' or '..')")
    return key


def join(*parts: str) -> str:
    """Keys joined with ``/`` (empty parts skipped)."""
    return "/".join(p.strip("/") for p in parts if p and p.strip("/"))


def store_location(value: str | os.PathLike[str]) -> str:
    """``value`` as other hosts should be told it: a URL is checked and kept, a bare path is
    made absolute (a relative path means nothing on another host).  One-line
    :class:`ConfigurationError` for a URL that :func:`open_store` would refuse."""
    text = os.fspath(value)
    if not isinstance(text, str) or not text.strip():
        raise ConfigurationError("a store location must be a path or a URL, got an empty one")
    if "://" in text:
        _parse(text)
        return text
    return os.path.abspath(text)


def open_store(value: str | os.PathLike[str]) -> BlobStore:
    """The store named by ``value``: ``file://PATH`` or a bare path
    (:class:`FileBlobStore`), ``s3://BUCKET[/PREFIX]`` (:class:`S3BlobStore`).  A URL with
    another scheme, no bucket or a query is a one-line :class:`ConfigurationError`.
    Nothing is contacted yet: an unreachable store raises at its first use."""
    text = os.fspath(value)
    if not isinstance(text, str) or not text.strip():
        raise ConfigurationError("a store location must be a path or a URL, got an empty one")
    if "://" not in text:
        return FileBlobStore(text)
    scheme, bucket, prefix = _parse(text)
    if scheme == "file":
        return FileBlobStore(prefix, url=text)
    return S3BlobStore(bucket, prefix, url=text)


def _parse(url: str) -> tuple[str, str, str]:
    """``(scheme, bucket or "", path or prefix)`` of a store URL; one-line errors."""
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise ConfigurationError(f"not a store URL: {url!r} ({exc})") from None
    scheme = parts.scheme.lower()
    if scheme not in SCHEMES:
        raise ConfigurationError(
            f"unsupported store URL {url!r}: the scheme must be file:// (a directory every "
            "host mounts) or s3://bucket/prefix (an S3-compatible object store)")
    if parts.query or parts.fragment:
        raise ConfigurationError(f"store URL {url!r} must not have a query or a fragment "
                                 "(S3 settings come from the AWS_* environment variables)")
    if scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise ConfigurationError(
                f"file store URL {url!r} names a host: use file:///absolute/path")
        path = unquote(parts.path)
        if not path.startswith("/"):
            raise ConfigurationError(f"file store URL {url!r} needs an absolute path")
        return scheme, "", path
    bucket = parts.netloc
    if not re.fullmatch(r"[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]", bucket):
        raise ConfigurationError(
            f"store URL {url!r} has no valid bucket name (s3://bucket/prefix)")
    prefix = unquote(parts.path).strip("/")
    if prefix:
        check_key(prefix)
    return scheme, bucket, prefix


class FileBlobStore:
    """Objects as files under ``root`` (created on the first write).  Atomic writes by a
    hidden temporary file in the target's directory, fsynced, then renamed; the directory
    is fsynced after (durable on return).  Several processes may write and read at once."""

    def __init__(self, root: str | os.PathLike[str], *, url: str | None = None) -> None:
        self.root = Path(root)
        self.url = url or os.fspath(root)

    def __repr__(self) -> str:
        return f"FileBlobStore({self.url!r})"

    def path(self, key: str) -> Path:
        """The local file of ``key``."""
        return self.root / check_key(key)

    @contextmanager
    def _errors(self, verb: str, key: str) -> Iterator[None]:
        try:
            yield
        except BlobMissing:
            raise
        except FileNotFoundError:
            raise BlobMissing(f"{key} is not in the store {self.url}") from None
        except OSError as exc:
            raise StoreUnavailable(f"cannot {verb} {key} in the store {self.url}: "
                                   f"{exc.strerror or exc}") from None

    def _write(self, key: str, fill: Any) -> None:
        target = self.path(key)
        with self._errors("write", key):
            target.parent.mkdir(parents=True, exist_ok=True)
            temp = target.with_name(f".{target.name}.{uuid.uuid4().hex[:8]}{PART_SUFFIX}")
            try:
                with open(temp, "wb") as handle:
                    fill(handle)
                    handle.flush()
                    os.fsync(handle.fileno())
                os.replace(temp, target)
            except BaseException:
                temp.unlink(missing_ok=True)
                raise
            _fsync_dir(target.parent)

    def put(self, key: str, data: bytes) -> None:
        self._write(key, lambda handle: handle.write(data))

    def put_file(self, key: str, path: str | os.PathLike[str]) -> None:
        def fill(handle: Any) -> None:
            with open(path, "rb") as source:
                shutil.copyfileobj(source, handle, 1 << 20)

        self._write(key, fill)

    def get(self, key: str) -> bytes:
        with self._errors("read", key):
            return self.path(key).read_bytes()

    def get_file(self, key: str, path: str | os.PathLike[str]) -> None:
        source = self.path(key)
        with self._errors("read", key):
            _copy_aside(lambda handle: _copy_from(source, handle), Path(path))

    def list(self, prefix: str = "") -> list[BlobInfo]:
        top = self.root / check_key(prefix, allow_empty=True) if prefix else self.root
        found: list[BlobInfo] = []
        with self._errors("list", prefix or "/"):
            for directory, _, files in os.walk(top):
                for name in files:
                    if name.startswith(".") and name.endswith(PART_SUFFIX):
                        continue
                    full = os.path.join(directory, name)
                    try:
                        st = os.stat(full)
                    except FileNotFoundError:
                        continue  # deleted meanwhile
                    key = os.path.relpath(full, self.root).replace(os.sep, "/")
                    found.append(BlobInfo(key, st.st_size, st.st_mtime))
        return sorted(found, key=lambda info: info.key)

    def exists(self, key: str) -> bool:
        return self.path(key).is_file()

    def delete(self, key: str) -> None:
        with self._errors("delete", key):
            self.path(key).unlink(missing_ok=True)

    def delete_prefix(self, prefix: str) -> int:
        count = len(self.list(prefix))
        with self._errors("delete", prefix):
            shutil.rmtree(self.path(prefix), ignore_errors=True)
        return count

    def rename(self, source: str, target: str) -> None:
        with self._errors("rename", source):
            self.path(target).parent.mkdir(parents=True, exist_ok=True)
            os.replace(self.path(source), self.path(target))


class S3BlobStore:
    """Objects in ``bucket`` under ``prefix``, through obstore (see the module doc for the
    environment it reads).  ``put`` is one PUT up to :data:`PUT_CHUNK` bytes and a
    multipart upload above, or from a pipe (visible only once completed); ``get_file``
    streams."""

    #: Above this many bytes an object is sent as a multipart upload.
    PUT_CHUNK = 8 * 1024 * 1024

    def __init__(self, bucket: str, prefix: str = "", *, url: str | None = None) -> None:
        import obstore.store

        self.bucket = bucket
        self.prefix = prefix
        self.url = url or f"s3://{bucket}/{prefix}"
        retry = {"max_retries": 3, "retry_timeout": dt.timedelta(seconds=S3_RETRY_TIMEOUT_S),
                 "backoff": {"init_backoff": dt.timedelta(milliseconds=100),
                             "max_backoff": dt.timedelta(seconds=2), "base": 2}}
        options = {"connect_timeout": dt.timedelta(seconds=5),
                   "timeout": dt.timedelta(seconds=120)}
        if os.environ.get("AWS_ENDPOINT_URL", "").startswith("http://"):
            options["allow_http"] = True
        try:
            self._store = obstore.store.S3Store(
                bucket, prefix=prefix or None, retry_config=retry,  # type: ignore[arg-type]
                client_options=options)  # type: ignore[arg-type]
        except Exception as exc:
            raise ConfigurationError(
                f"cannot open the store {self.url}: {_first_line(exc)}") from None

    def __repr__(self) -> str:
        return f"S3BlobStore({self.url!r})"

    @contextmanager
    def _errors(self, verb: str, key: str) -> Iterator[None]:
        import obstore.exceptions as oe

        try:
            yield
        except (FileNotFoundError, oe.NotFoundError) as exc:
            if "NoSuchBucket" in str(exc):
                raise StoreUnavailable(
                    f"cannot {verb} {key} in the store {self.url}: no bucket "
                    f"{self.bucket!r} there") from None
            raise BlobMissing(f"{key} is not in the store {self.url}") from None
        except ConfigurationError:
            raise
        except Exception as exc:
            if isinstance(exc, BlobMissing | StoreUnavailable):
                raise
            raise StoreUnavailable(
                f"cannot {verb} {key} in the store {self.url}: {_first_line(exc)}") from None

    def put(self, key: str, data: bytes) -> None:
        import obstore

        with self._errors("write", key):
            obstore.put(self._store, check_key(key), data,
                        use_multipart=len(data) > self.PUT_CHUNK, chunk_size=self.PUT_CHUNK)

    def put_file(self, key: str, path: str | os.PathLike[str]) -> None:
        import obstore

        with self._errors("write", key), open(path, "rb") as handle:
            st = os.fstat(handle.fileno())
            if stat.S_ISREG(st.st_mode) and st.st_size <= self.PUT_CHUNK:
                obstore.put(self._store, check_key(key), handle.read(), use_multipart=False)
            else:
                obstore.put(self._store, check_key(key), handle, use_multipart=True,
                            chunk_size=self.PUT_CHUNK, max_concurrency=4)

    def get(self, key: str) -> bytes:
        import obstore

        with self._errors("read", key):
            return bytes(obstore.get(self._store, check_key(key)).bytes())

    def get_file(self, key: str, path: str | os.PathLike[str]) -> None:
        import obstore

        def fill(handle: Any) -> None:
            result = obstore.get(self._store, check_key(key))
            for chunk in result.stream(min_chunk_size=1 << 20):
                handle.write(chunk)

        with self._errors("read", key):
            _copy_aside(fill, Path(path))

    def list(self, prefix: str = "") -> list[BlobInfo]:
        import obstore

        found: list[BlobInfo] = []
        with self._errors("list", prefix or "/"):
            for batch in obstore.list(self._store, check_key(prefix, allow_empty=True) or None):
                found.extend(BlobInfo(m["path"], int(m["size"]),
                                      m["last_modified"].timestamp()) for m in batch)
        return sorted(found, key=lambda info: info.key)

    def exists(self, key: str) -> bool:
        import obstore

        try:
            with self._errors("read", key):
                obstore.head(self._store, check_key(key))
        except BlobMissing:
            return False
        return True

    def delete(self, key: str) -> None:
        import obstore

        try:
            with self._errors("delete", key):
                obstore.delete(self._store, check_key(key))
        except BlobMissing:
            pass

    def delete_prefix(self, prefix: str) -> int:
        import obstore

        keys = [info.key for info in self.list(check_key(prefix))]
        with self._errors("delete", prefix):
            for start in range(0, len(keys), 1000):
                obstore.delete(self._store, keys[start:start + 1000])
        return len(keys)

    def rename(self, source: str, target: str) -> None:
        import obstore

        with self._errors("rename", source):
            obstore.rename(self._store, check_key(source), check_key(target))


def _first_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split("\n", 1)[0].split()) or type(exc).__name__
    return text if len(text) <= 300 else text[:297] + "..."


def _copy_from(source: Path, handle: Any) -> None:
    with open(source, "rb") as stream:
        shutil.copyfileobj(stream, handle, 1 << 20)


def _copy_aside(fill: Any, target: Path) -> None:
    """Write ``target`` by ``fill(handle)`` on a hidden temporary name, then rename."""
    target.parent.mkdir(parents=True, exist_ok=True)
    temp = target.with_name(f".{target.name}.{uuid.uuid4().hex[:8]}{PART_SUFFIX}")
    try:
        with open(temp, "wb") as handle:
            fill(handle)
        os.replace(temp, target)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
