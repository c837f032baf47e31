"""Configuration with a ready znode (the ZooKeeper paper, section 2.4).

Layout under ``path``::

    path            data: the last committed version number (ASCII)
    path/fields/K   one node per top-level field K, its value as JSON
    path/ready      exists only while the fields form a complete configuration;
                    data: that configuration's version number

The writer deletes ``ready``, writes every field node pipelined, then recreates ``ready``.
Guarantees: a reader returns only a configuration read entirely while one and the same
``ready`` node existed (checked by its ``czxid``), never a half-written one; versions grow.
One writer at a time: with ``fence=term`` from an
:class:`~framework.primitives.election.Election` every step checks the leader's node, so a
deposed leader's write fails on the server.  Concurrent unfenced writers are detected (the
root's version is claimed with a conditional set) but may leave mixed fields until the next
write; ``ready`` then stays absent only if the last writer failed.

Why the reader checks ``ready`` twice: ``docs/architecture.md`` ("Configuration with a ready
znode").
"""

from __future__ import annotations

import functools
import json
from collections.abc import AsyncIterator
from typing import Any, Generic, TypeVar, cast

import attrs
import trio

from framework import errors, records
from framework.logs import get_logger
from framework.primitives.election import Term, is_fence_failure
from framework.zk import (
    Session,
    Transaction,
    gather,
    validate_component,
    validate_data,
    validate_path,
)

log = get_logger("framework.primitives.config")

T = TypeVar("T")

READY = "ready"
FIELDS = "fields"


@attrs.frozen
class Versioned(Generic[T]):
    """A complete configuration, its version number and the ``czxid`` of its ready node."""

    version: int
    config: T
    zxid: int


class _Retry(Exception):
    """The configuration changed while it was being read: read again."""


class ConfigStore(Generic[T]):
    """A typed configuration stored with the ready-znode protocol (see the module doc).

    ``cls`` is an attrs class (through :mod:`framework.records`) or ``None`` for a plain
    ``dict``; each top-level field is one znode holding JSON.

    Raises :class:`ConfigurationError` for a bad path or class, a configuration that is not
    ``cls`` (or not JSON), and a stored one that does not fit ``cls``;
    :class:`ConcurrentUpdateError` when another writer changed it during a write.

    * SUSPENDED: readers and watchers wait and read again after reconnecting; a write retries
      the whole protocol after a lost reply (it is idempotent as a whole; a retried write may
      publish the same content under the next version).
    * LOST: readers continue in the new session.  A fenced write raises
      :class:`LeadershipLost` (the term ended with the session); an unfenced write restarts
      in the new session.
    """

    def __init__(self, session: Session, path: str, cls: type[T] | None = None) -> None:
        validate_path(path, allow_root=False)
        if cls is not None and not attrs.has(cls):
            raise errors.ConfigurationError(
                f"ConfigStore needs an attrs class or None, got {cls!r}"
            )
        self.session = session
        self.path = path
        self.cls = cls
        self.ready_path = f"{path}/{READY}"
        self.fields_path = f"{path}/{FIELDS}"

    # ------------------------------------------------------------------ encoding

    def encode(self, config: T) -> dict[str, bytes]:
        """The field nodes' contents for ``config`` (validated before anything is written)."""
        if self.cls is not None:
            if not isinstance(config, self.cls):
                raise errors.ConfigurationError(
                    f"expected a {self.cls.__name__}, got {type(config).__name__}"
                )
            raw = records.unstructure(config)
        else:
            if not isinstance(config, dict):
                raise errors.ConfigurationError(
                    f"expected a dict configuration, got {type(config).__name__}"
                )
            raw = config
        fields: dict[str, bytes] = {}
        for key, value in raw.items():
            validate_component("configuration field name", key)
            try:
                blob = json.dumps(value, sort_keys=True, separators=(",", ":")).encode()
            except (TypeError, ValueError) as exc:
                raise errors.ConfigurationError(
                    f"configuration field {key!r} is not JSON-serialisable: {exc}"
                ) from None
            fields[key] = validate_data(blob)
        return fields

    def decode(self, fields: dict[str, bytes]) -> T:
        try:
            raw = {key: json.loads(blob) for key, blob in fields.items()}
        except ValueError as exc:
            raise errors.ConfigurationError(f"{self.path}: a field is not JSON: {exc}") from None
        if self.cls is None:
            return raw  # type: ignore[return-value]
        try:
            return cast(T, records.structure(raw, self.cls))
        except records.CorruptRecord as exc:
            raise errors.ConfigurationError(f"{self.path}: stored configuration: {exc}") from None

    # ------------------------------------------------------------------ writing

    async def write(self, config: T, *, fence: Term | None = None) -> int:
        """Publish ``config`` as the next version; return that version number."""
        fields = self.encode(config)
        session = self.session
        await session.ensure_path(self.fields_path)
        while True:
            try:
                version = await self._write_once(fields, fence)
            except errors.ConnectionLossError:
                await session.wait_connected()
                continue
            except errors.SessionExpiredError:
                if fence is not None:
                    raise errors.LeadershipLost("lost") from None
                continue
            log.info("config.written", path=self.path, version=version, fields=len(fields))
            return version

    async def _write_once(self, fields: dict[str, bytes], fence: Term | None) -> int:
        session = self.session
        root_data, root = await session.get(self.path)
        version = _version_of(root_data) + 1
        ready = await session.exists(self.ready_path)
        # 1. claim the root (a concurrent writer now fails) and withdraw ready
        txn = self._transaction(fence).set(self.path, root_data, version=root.version)
        if ready is not None:
            txn.delete(self.ready_path, version=ready.version)
        await self._commit(txn, fence)
        claimed = root.version + 1
        # 2. every field node at once; fields of the old configuration that are gone, deleted
        existing = set(await session.children(self.fields_path))

        async def apply(build: Any) -> None:
            await self._commit(build(self._transaction(fence)), fence)

        writes = []
        for key, blob in fields.items():
            node = f"{self.fields_path}/{key}"
            if key in existing:
                writes.append(functools.partial(apply, lambda t, n=node, b=blob: t.set(n, b)))
            else:
                writes.append(functools.partial(apply, lambda t, n=node, b=blob: t.create(n, b)))
        for key in existing - set(fields):
            node = f"{self.fields_path}/{key}"
            writes.append(functools.partial(apply, lambda t, n=node: t.delete(n)))
        await gather(*writes)
        # 3. a complete configuration again: publish its version with a new ready node
        marker = str(version).encode()
        txn = self._transaction(fence).set(self.path, marker, version=claimed)
        txn.create(self.ready_path, marker)
        await self._commit(txn, fence)
        return version

    def _transaction(self, fence: Term | None) -> Transaction:
        return fence.fenced() if fence is not None else self.session.transaction()

    async def _commit(self, txn: Transaction, fence: Term | None) -> None:
        """Commit, turning a failure into the error that says what happened."""
        try:
            await txn.commit()
        except errors.TransactionFailedError as exc:
            if fence is not None and is_fence_failure(exc):
                raise errors.LeadershipLost(
                    "fenced write rejected: our election node is gone"
                ) from exc
            cause = exc.cause
            if isinstance(cause, (errors.BadVersionError, errors.NodeExistsError,
                                  errors.NoNodeError)):
                raise errors.ConcurrentUpdateError(
                    f"{self.path}: another writer changed the configuration meanwhile "
                    "(use one writer, e.g. fence=term from an Election)"
                ) from exc
            if isinstance(cause, (errors.ConnectionLossError, errors.SessionExpiredError)):
                raise cause from exc
            raise

    # ------------------------------------------------------------------ reading

    async def read(self) -> T:
        """The current complete configuration (waits, on a watch, until there is one)."""
        return (await self.read_versioned()).config

    async def read_versioned(self) -> Versioned[T]:
        """Like :meth:`read`, with the version number."""
        while True:
            fired = trio.Event()
            result = await self._read_settled(fired)
            if result is not None:
                return result
            await fired.wait()

    async def watch(self) -> AsyncIterator[T]:
        """Yield the current configuration, then every new version (or the latest of a
        burst); never a half-written one."""
        async for item in self.watch_versioned():
            yield item.config

    async def watch_versioned(self) -> AsyncIterator[Versioned[T]]:
        """Like :meth:`watch`, with version numbers (strictly increasing)."""
        last = None
        while True:
            fired = trio.Event()
            result = await self._read_settled(fired)
            if result is not None and result.zxid != last:
                last = result.zxid
                yield result
            await fired.wait()

    async def _read_settled(self, fired: trio.Event) -> Versioned[T] | None:
        """:meth:`_read_once`, again after a change under it or a connection loss."""
        while True:
            try:
                return await self._read_once(fired)
            except _Retry:
                continue
            except (errors.ConnectionLossError, errors.SessionExpiredError):
                await self.session.wait_connected()

    async def _read_once(self, fired: trio.Event) -> Versioned[T] | None:
        """One consistent read, or ``None`` (no ready node: ``fired`` wakes us on creation).

        ``fired`` is also set when the ready node goes, i.e. when a new version starts.
        """
        session = self.session
        wake = session.waker(fired)
        try:
            marker, ready = await session.get(self.ready_path, watch=wake)
        except errors.NoNodeError:
            if await session.exists(self.ready_path, watch=wake) is None:
                return None
            raise _Retry() from None
        try:
            names = await session.children(self.fields_path)
        except errors.NoNodeError:
            raise _Retry() from None
        values: dict[str, bytes] = {}

        async def fetch(name: str) -> None:
            try:
                values[name], _ = await session.get(f"{self.fields_path}/{name}")
            except errors.NoNodeError:
                raise _Retry() from None

        await gather(*[functools.partial(fetch, name) for name in names])
        again = await session.exists(self.ready_path)
        if again is None or again.czxid != ready.czxid:
            raise _Retry()
        return Versioned(_version_of(marker), self.decode(dict(sorted(values.items()))),
                         ready.czxid)


def _version_of(data: bytes) -> int:
    try:
        return int(data or b"0")
    except ValueError:
        raise errors.ConfigurationError(f"not a configuration version: {data!r}") from None
