"""Payloads too large for the queue, stored off ZooKeeper by reference.

A task travels in one queue item of at most :data:`MAX_TASK_BYTES` (64 KiB) of JSON: its
payload with a small envelope (id, key, type, time limit).  A larger payload is refused at
submit, in one line that gives the limit and the way out (:func:`too_large`), unless the
submitter has a *payload store*: then the payload is written to the store, the task carries
only its reference (``Task.payload_ref``), and the worker reads the payload back before the
handler runs (the handler sees the payload itself).  The stored copy is deleted once the
task is acknowledged (succeeded, failed for good or revoked: its record is written); one
whose task never gets there (dead-lettered and discarded, say) goes by the store's own
retention.

A store is any object with ``put(data) -> ref``, ``get(ref) -> bytes`` and
``delete(ref)`` (:class:`PayloadStore`; plain blocking methods, run in a worker thread).
:class:`BlobPayloadStore` is the one given by a URL: one object per payload in a
:mod:`framework.blobstore` store that every submitter and worker reaches, ``file://`` (or
a bare path: :class:`LocalDirectoryStore`; a local disk on one machine, a shared mount
across several) or ``s3://bucket/prefix`` (an S3-compatible object store).  Submitters
(``Client(payload_store=...)``, ``BlockingClient``, ``framework submit``, masters and
workers) and workers (a ``payload_store`` attribute on the Worker class) take a store, a
URL or a directory path, else ``FRAMEWORK_PAYLOAD_STORE``.
A reference is a name the store made (letters, digits, ``._-``), never a path: a task
record cannot make a worker read or delete a file outside its store.
"""

from __future__ import annotations

import os
import re
import time
import uuid
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from framework import errors
from framework.blobstore import BlobMissing, BlobStore, FileBlobStore, open_store

#: Largest task (payload and envelope, as JSON) one queue item takes.
MAX_TASK_BYTES = 64 * 1024

#: The environment variable naming the default store's directory.
STORE_ENV = "FRAMEWORK_PAYLOAD_STORE"

_REF = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,200}")


class PayloadMissing(errors.PermanentFailure):
    """A task's stored payload is not in the store (deleted, or another store): retrying
    cannot bring it back, so the task fails for good."""


@runtime_checkable
class PayloadStore(Protocol):
    """Where large payloads are kept (see the module doc).  Methods may block."""

    def put(self, data: bytes) -> str:
        """Store ``data``; return its reference (a name: letters, digits, ``._-``)."""
        ...

    def get(self, ref: str) -> bytes:
        """The data stored under ``ref``; :class:`PayloadMissing` if there is none."""
        ...

    def delete(self, ref: str) -> None:
        """Delete ``ref``'s data (nothing if it is already gone)."""
        ...


class BlobPayloadStore:
    """One object per payload in a :class:`~framework.blobstore.BlobStore` (a directory every
    host mounts, or an S3-compatible bucket: see :mod:`framework.blobstore`).

    ``put`` writes a new object atomically (a reader never sees half a payload); objects
    older than ``retention`` seconds are removed by a ``put``, at most once per
    ``prune_every`` seconds (one listing of the store).  A store that cannot be reached
    raises :class:`~framework.errors.ConfigurationError` from ``put`` (the submitter's
    mistake or outage, in one line) and :class:`~framework.blobstore.StoreUnavailable` (an
    ``OSError``: retried like any failed attempt) from ``get``."""

    def __init__(self, blobs: BlobStore, *, retention: float = 30 * 86400.0,
                 prune_every: float = 3600.0) -> None:
        self.blobs = blobs
        self.retention = retention
        self.prune_every = prune_every
        self._pruned = 0.0

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.blobs.url!r})"

    @staticmethod
    def _key(ref: str) -> str:
        if not _REF.fullmatch(ref) or ref.startswith(".") or ".." in ref:
            raise PayloadMissing(f"not a payload reference of this store: {ref!r}")
        return ref

    def put(self, data: bytes) -> str:
        ref = f"{uuid.uuid4().hex}.json"
        try:
            self.blobs.put(ref, data)
        except OSError as exc:
            raise errors.ConfigurationError(f"cannot store a payload: {exc}") from None
        now = time.time()
        if now - self._pruned >= self.prune_every:
            self._pruned = now
            self.prune(now - self.retention)
        return ref

    def get(self, ref: str) -> bytes:
        try:
            return self.blobs.get(self._key(ref))
        except BlobMissing:
            raise PayloadMissing(
                f"the payload {ref} is not in {self.blobs.url} (deleted by retention, or "
                "the worker's payload store is not the submitter's)"
            ) from None

    def delete(self, ref: str) -> None:
        self.blobs.delete(self._key(ref))

    def prune(self, before: float) -> int:
        """Delete the payloads written before ``before`` (epoch seconds); how many."""
        removed = 0
        try:
            entries = self.blobs.list()
        except OSError:
            return 0
        for entry in entries:
            if entry.modified < before and _REF.fullmatch(entry.key):
                try:
                    self.blobs.delete(entry.key)
                    removed += 1
                except OSError:
                    pass  # gone meanwhile, or the store is away: the next prune
        return removed


class LocalDirectoryStore(BlobPayloadStore):
    """A :class:`BlobPayloadStore` in ``directory`` (created if missing): one file per
    payload, written under a temporary name and renamed."""

    def __init__(self, directory: str | os.PathLike[str], *,
                 retention: float = 30 * 86400.0, prune_every: float = 3600.0) -> None:
        self.directory = Path(directory)
        super().__init__(FileBlobStore(directory), retention=retention,
                         prune_every=prune_every)

    def __repr__(self) -> str:
        return f"LocalDirectoryStore({str(self.directory)!r})"


def store_from(value: PayloadStore | str | os.PathLike[str] | None) -> PayloadStore | None:
    """The store ``value`` names (a store, or a store URL or directory for a
    :class:`BlobPayloadStore`: see :func:`framework.blobstore.open_store`), else the one in
    ``FRAMEWORK_PAYLOAD_STORE``, else ``None`` (no store).  A URL that is not one is a
    one-line :class:`~framework.errors.ConfigurationError`."""
    if value is None:
        value = os.environ.get(STORE_ENV) or None
        if value is None:
            return None
    if isinstance(value, (str, os.PathLike)):
        if "://" not in os.fspath(value):
            return LocalDirectoryStore(value)
        return BlobPayloadStore(open_store(value))
    if not isinstance(value, PayloadStore):
        raise errors.ConfigurationError(
            f"payload_store must be a store URL, a directory or have put/get/delete, "
            f"got {value!r}")
    return value


def store_of(owner: Any) -> PayloadStore | None:
    """The payload store of a worker (its class's ``payload_store``, else the
    environment's)."""
    return store_from(getattr(owner, "payload_store", None))


def too_large(size: int, limit: int = MAX_TASK_BYTES) -> errors.DataTooLargeError:
    """The one-line refusal of a task of ``size`` bytes with no payload store."""
    return errors.DataTooLargeError(
        f"the task is {size:,} bytes as JSON, over the {limit:,}-byte limit of a queue item: "
        f"set {STORE_ENV}=/a/shared/directory or s3://bucket/prefix (or pass "
        "payload_store=) to store large "
        "payloads off ZooKeeper by reference, or submit a reference of your own"
    )


async def resolve(task: Any, owner: Any) -> Any:
    """``task`` with its stored payload read back from ``owner``'s store (a worker's: see
    :func:`store_of`), ready for the handler; :class:`PayloadMissing` (a permanent failure)
    if the worker has no store or the payload is not in it."""
    import json

    import attrs
    import trio

    store = store_of(owner)
    if store is None:
        raise PayloadMissing(
            f"task {task.id} carries a stored payload ({task.payload_ref}) but this worker "
            f"has no payload store: set {STORE_ENV} or the Worker's payload_store"
        )
    data = await trio.to_thread.run_sync(store.get, task.payload_ref)
    try:
        payload = json.loads(data)
    except ValueError:
        raise PayloadMissing(f"the stored payload {task.payload_ref} of task {task.id} is not "
                             "JSON") from None
    return attrs.evolve(task, payload=payload)


async def discard(data: bytes, owner: Any) -> None:
    """Delete the stored payload of the task in queue item ``data`` (acknowledged), if it
    has one.  A failure is logged and left to the store's retention."""
    if b'"ref":"' not in data:  # most tasks: no stored payload, no decoding
        return
    import trio

    from framework.logs import get_logger
    from framework.runtime.tasks import Task

    try:
        ref = Task.decode(data).payload_ref
        store = store_of(owner)
        if ref is not None and store is not None:
            await trio.to_thread.run_sync(store.delete, ref)
    except Exception as exc:
        get_logger("framework.runtime.payloads").warning(
            "payload.delete_failed", error=str(exc))
