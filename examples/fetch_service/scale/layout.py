"""Where the partitioned crawl keeps things: a few znodes, and a shared store.

ZooKeeper (control plane only; nothing per URL), under the application's base; every record
is an attrs class through :mod:`framework.records`::

    crawl/job               :class:`Job`: id, seeds, partitions, shared store URL,
                            checkpoint interval (written once by :func:`start_job`)
    crawl/desired           the wanted :class:`CrawlConfig` (written at the start, may be
                            rewritten); the master publishes it to the fetchers
    crawl/partitions/pNNN   :class:`PartitionRecord`: epoch, owner, latest checkpoint file,
                            its :class:`.store.Progress`, :class:`PartitionState`
    crawl/report            :class:`CrawlReport`; it exists once the crawl is finished

The shared store (``job.shared``, a URL: :func:`framework.open_store`; ``file://`` or a
path for a directory every fetcher machine mounts at the same path, ``s3://bucket/prefix``
for an S3-compatible object store; like the Katta example's shard store).  Only whole files
are written, each once and atomically (a temporary name renamed, or one PUT), which is what
HDFS-like stores and object stores offer; the keys::

    <job id>/parts/pNNN/ckpt-eEEEEEE-SSSSSS.sqlite   checkpoints of the partition
    <job id>/inbox/pNNN/<sender>-eEEEEEE-SSSSSSSSS.json   links for the partition
                                                          (:mod:`.inbox`)

A record that does not decode raises :class:`framework.records.CorruptRecord`; the readers
log it and wait for the node to change rather than overwrite it (see :func:`wait_job`,
:mod:`.ownership`, :mod:`.master`).
"""

from __future__ import annotations

import enum
import functools
import os
import time
import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path

import attrs
import trio

from examples.fetch_service.config import CrawlConfig
from examples.fetch_service.links import InvalidUrlError, canonicalize, host_key
from examples.fetch_service.scale.inbox import InboxBatch, write_inbox_file
from examples.fetch_service.scale.store import Progress
from examples.fetch_service.scale.urls import partition_name, partition_of
from framework import BlobStore, errors, open_store, records, store_location
from framework.logs import get_logger
from framework.runtime import App
from framework.zk import Session, watch_data

__all__ = ["APP_NAME", "CrawlReport", "Job", "PartitionRecord", "PartitionState", "ScalePaths",
           "SharedDir", "start_job", "wait_job"]

log = get_logger("examples.fetch_service.scale.layout")

#: The application name of the crawl.
APP_NAME = "fetch-scale"


@attrs.frozen
class ScalePaths:
    app: App

    @property
    def base(self) -> str:
        return f"{self.app.base}/crawl"

    job = property(lambda self: f"{self.base}/job")
    desired = property(lambda self: f"{self.base}/desired")
    partitions = property(lambda self: f"{self.base}/partitions")
    report = property(lambda self: f"{self.base}/report")

    def partition(self, name: str) -> str:
        return f"{self.partitions}/{name}"


@attrs.frozen
class Job:
    """The ``crawl/job`` record: what to crawl and how the URL space is cut.  Written once
    by :func:`start_job`; ``partitions`` never changes for a job."""

    id: str
    seeds: tuple[str, ...] = attrs.field(converter=tuple)
    partitions: int
    shared: str
    checkpoint_interval_s: float = 1.0
    obey_robots: bool = True
    created: float = 0.0

    @property
    def names(self) -> list[str]:
        return [partition_name(i) for i in range(self.partitions)]

    def directory(self) -> SharedDir:
        """The job's part of the shared store (opened once per process and URL)."""
        return SharedDir(_open_store(self.shared), self.id)


@functools.lru_cache(maxsize=16)
def _open_store(url: str) -> BlobStore:
    return open_store(url)


@attrs.frozen
class SharedDir:
    """The job's part of the shared store: its keys start with the job's id."""

    store: BlobStore
    job: str

    def parts_key(self, partition: str) -> str:
        """Where the partition's checkpoints are."""
        return f"{self.job}/parts/{partition}"

    def inbox_key(self, partition: str) -> str:
        """Where the partition's inbox files are."""
        return f"{self.job}/inbox/{partition}"

    def _local(self, key: str) -> Path:
        path = getattr(self.store, "path", None)
        if path is None:
            raise errors.ConfigurationError(f"the shared store {self.store.url} is not a "
                                            "directory")
        return Path(path(key))

    def parts(self, partition: str) -> Path:
        """The local directory of :meth:`parts_key` (a file store only)."""
        return self._local(self.parts_key(partition))

    def inbox(self, partition: str) -> Path:
        """The local directory of :meth:`inbox_key` (a file store only)."""
        return self._local(self.inbox_key(partition))

    def prepare(self, partitions: Iterable[str]) -> None:
        """On a file store, make the partitions' (empty) directories, for an operator to
        see; an object store has no directories (blocking)."""
        if getattr(self.store, "path", None) is None:
            return
        try:
            for name in partitions:
                self.parts(name).mkdir(parents=True, exist_ok=True)
                self.inbox(name).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise errors.ConfigurationError(
                f"cannot use the shared store {self.store.url}: {exc.strerror or exc}"
            ) from None


class PartitionState(enum.Enum):
    """Where a partition stands with its owners (:attr:`PartitionRecord.state`)."""

    #: Created by the master; nobody has taken it over yet.
    NEW = "new"
    #: An owner took it over; it has published no checkpoint of its own yet.
    TAKEN_OVER = "taken_over"
    #: The owner serves it; ``checkpoint`` is its latest published state.
    SERVING = "serving"
    #: The owner stopped serving (its requests are over); ``checkpoint`` is its last state.
    RELEASED = "released"


@attrs.frozen
class PartitionRecord:
    """The ``crawl/partitions/pNNN`` record of one partition.

    ``epoch`` grows by one at every takeover (a version-checked set: two would-be owners
    cannot both win); ``checkpoint`` names the newest published checkpoint file (``None``:
    start empty), ``progress`` is what it holds and ``at`` when it was published (wall
    clock); ``state`` says whether the current
    ``owner`` has published its own checkpoint yet and whether it has released the
    partition (see :mod:`.ownership`).  Every write after the takeover is a set at the
    version the owner last wrote, so a deposed owner's publish fails on the server.
    """

    epoch: int = 0
    owner: str | None = None
    checkpoint: str | None = None
    state: PartitionState = PartitionState.NEW
    progress: Progress = attrs.Factory(Progress)
    at: float = 0.0

    @property
    def released(self) -> bool:
        return self.state is PartitionState.RELEASED

    @property
    def idle(self) -> bool:
        """The current owner published a checkpoint with nothing pending and nothing
        unshipped (the master also checks the inboxes before it ends the crawl)."""
        return (self.state in (PartitionState.SERVING, PartitionState.RELEASED)
                and self.progress.idle)


@attrs.frozen
class CrawlReport:
    """The ``crawl/report`` record the master writes once the crawl is finished: totals of
    the partitions' last checkpoints, the epoch each partition reached, who wrote it, and
    the inbox files set aside as unreadable (their links were not crawled)."""

    job: str
    seeds: tuple[str, ...]
    partitions: int
    done: int
    blocked: int
    started: float
    finished: float
    master: str
    epochs: dict[str, int] = attrs.Factory(dict)
    quarantined: tuple[str, ...] = ()


def seed_links(seeds: Iterable[str], partitions: int) -> tuple[
        dict[int, list[tuple[str, int]]], list[str]]:
    """Canonical seeds (at depth 0) grouped by partition, and why the others are invalid."""
    routed: dict[int, list[tuple[str, int]]] = {}
    invalid: list[str] = []
    for seed in seeds:
        try:
            url = canonicalize(seed)
        except InvalidUrlError as exc:
            invalid.append(str(exc))
            continue
        routed.setdefault(partition_of(host_key(url), partitions), []).append((url, 0))
    return routed, invalid


async def start_job(session: Session, app: App, seeds: Sequence[str], config: CrawlConfig, *,
                    shared: str | Path, partitions: int = 8, checkpoint_interval_s: float = 1.0,
                    obey_robots: bool = True, job_id: str | None = None) -> Job:
    """Create a partitioned crawl job: the seeds go to their partitions' inboxes first, then
    the job and its configuration are written in one transaction (so a job that exists has
    its seeds delivered).

    ``shared`` is the shared store: a URL (``file://``, ``s3://bucket/prefix``) or a path
    (made absolute: every host must mount it at that path).

    Raises :class:`ConfigurationError` for no valid seed, a bad partition count, a store
    URL that is not one, or when the application already has a job (``framework purge
    fetch-scale`` first); ``OSError`` (:class:`framework.StoreUnavailable`) when the shared
    store cannot be written; ZooKeeper errors as they come (nothing is retried: after a
    ``ConnectionLossError`` the job may or may not exist).
    """
    if not 1 <= partitions <= 999:
        raise errors.ConfigurationError(f"partitions must be in 1..999, got {partitions}")
    if not checkpoint_interval_s > 0:
        raise errors.ConfigurationError(
            f"checkpoint_interval_s must be > 0, got {checkpoint_interval_s}")
    routed, invalid = seed_links(seeds, partitions)
    if not routed:
        reasons = "; ".join(invalid) or "no seed given"
        raise errors.ConfigurationError(f"a crawl needs at least one valid seed URL ({reasons})")
    job = Job(job_id or uuid.uuid4().hex[:8], tuple(seeds), partitions,
              store_location(os.fspath(shared)), checkpoint_interval_s, obey_robots,
              time.time())
    paths = ScalePaths(app)
    if await session.exists(paths.job) is not None:
        raise errors.ConfigurationError(
            f"application {app.name!r} already has a crawl job; purge it first "
            f"(framework purge {app.name})")
    directory = job.directory()
    await trio.to_thread.run_sync(directory.prepare, job.names)
    for index, links in routed.items():
        await trio.to_thread.run_sync(
            write_inbox_file, directory.store, directory.inbox_key(partition_name(index)),
            "seeds-e000000-000000000.json", InboxBatch(tuple(links)))
    await session.ensure_path(paths.partitions)
    try:
        await session.transaction().create(paths.job, records.encode(job)).create(
            paths.desired, config.to_json()).commit()
    except errors.TransactionFailedError as exc:
        if isinstance(exc.cause, errors.NodeExistsError):
            raise errors.ConfigurationError(
                f"application {app.name!r} already has a crawl job; purge it first "
                f"(framework purge {app.name})") from None
        raise
    return job


async def wait_job(session: Session, paths: ScalePaths) -> Job:
    """The job, once ``crawl/job`` exists and holds a valid record.  A record that is not
    one is logged (``crawl.job_corrupt``, an error) and waited out: nothing is crawled under
    a job nobody can read, and the wait ends when the node is rewritten."""
    async for snap in watch_data(session, paths.job):
        if snap.data is None:
            continue
        try:
            return records.decode(snap.data, Job)
        except records.CorruptRecord as exc:
            log.error("crawl.job_corrupt", path=paths.job, error=str(exc),
                      action="waiting for the job record to be rewritten")
    raise AssertionError("watch_data never ends")  # pragma: no cover
