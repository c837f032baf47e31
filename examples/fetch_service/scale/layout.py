"""Where the partitioned crawl keeps things: a few znodes, and a shared directory.

ZooKeeper (control plane only; nothing per URL), under the application's base::

    crawl/job               the job: id, seeds, partitions, shared directory, checkpoint
                            interval (written once by :func:`start_job`)
    crawl/desired           the wanted CrawlConfig (written at the start, may be rewritten); the
                            master publishes it to the fetchers (ready-znode configuration)
    crawl/partitions/pNNN   one record per partition: epoch, owner, latest checkpoint file,
                            status counters, released (see :class:`PartitionRecord`)
    crawl/report            the final report; it exists once the crawl is finished

The shared directory (``job.shared``; stands for a distributed file system that every
fetcher machine mounts, like the Katta example's shard store; only whole files are written,
each once, under a temporary name and renamed, which is what HDFS-like stores offer)::

    <shared>/<job id>/parts/pNNN/ckpt-eEEEEEE-SSSSSS.sqlite   checkpoints of the partition
    <shared>/<job id>/inbox/pNNN/<sender>-eEEEEEE-SSSSSSSSS.json   links for the partition
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import attrs

from examples.fetch_service.config import CrawlConfig
from examples.fetch_service.links import InvalidUrlError, canonicalize, host_key
from examples.fetch_service.scale.inbox import write_inbox_file
from examples.fetch_service.scale.urls import partition_name, partition_of
from framework import errors
from framework.runtime import App
from framework.zk import Session

__all__ = ["APP_NAME", "Job", "PartitionRecord", "ScalePaths", "SharedDir", "start_job"]

#: The application name of the crawl.
APP_NAME = "fetch-scale"


def dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), sort_keys=True).encode()


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
    """What to crawl and how the URL space is cut.  ``partitions`` never changes for a job."""

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

    def to_json(self) -> bytes:
        return dumps(attrs.asdict(self))

    @classmethod
    def from_json(cls, data: bytes) -> Job:
        return cls(**json.loads(data))

    def directory(self) -> SharedDir:
        return SharedDir(Path(self.shared) / self.id)


@attrs.frozen
class SharedDir:
    """The job's directory on the shared file system."""

    root: Path

    def parts(self, partition: str) -> Path:
        return self.root / "parts" / partition

    def inbox(self, partition: str) -> Path:
        return self.root / "inbox" / partition


@attrs.frozen
class PartitionRecord:
    """The znode of one partition.

    ``epoch`` grows by one at every takeover (a version-checked set: two would-be owners
    cannot both win); ``checkpoint`` names the newest published checkpoint file; ``status``
    is what that checkpoint holds (``pending``, ``done``, ``blocked``, ``outbox`` counts and
    ``idle``: nothing pending and nothing unshipped at snapshot time; the master also checks
    the inboxes).  ``released``: the owner has stopped serving (its requests are over) and
    ``checkpoint`` is its last state: the next owner may start at once (see
    :mod:`.ownership`).  Every write after the takeover is a set at the version the owner
    last wrote, so a deposed owner's publish fails on the server (``BadVersionError``).
    """

    epoch: int = 0
    owner: str | None = None
    checkpoint: str | None = None
    status: dict[str, Any] | None = None
    released: bool = False

    def to_json(self) -> bytes:
        return dumps(attrs.asdict(self))

    @classmethod
    def from_json(cls, data: bytes) -> PartitionRecord:
        return cls(**json.loads(data)) if data else cls()

    @property
    def idle(self) -> bool:
        return bool(self.status and self.status.get("idle"))


def seed_links(seeds: Iterable[str], partitions: int) -> tuple[dict[int, list[list[Any]]],
                                                              list[dict[str, str]]]:
    """Canonical seeds grouped by partition, and the invalid ones with the reason."""
    routed: dict[int, list[list[Any]]] = {}
    invalid: list[dict[str, str]] = []
    for seed in seeds:
        try:
            url = canonicalize(seed)
        except InvalidUrlError as exc:
            invalid.append({"url": seed, "error": str(exc)})
            continue
        routed.setdefault(partition_of(host_key(url), partitions), []).append([url, 0])
    return routed, invalid


async def start_job(session: Session, app: App, seeds: Sequence[str], config: CrawlConfig, *,
                    shared: str | Path, partitions: int = 8, checkpoint_interval_s: float = 1.0,
                    obey_robots: bool = True, job_id: str | None = None) -> Job:
    """Create a partitioned crawl job: the seeds go to their partitions' inboxes first, then
    the job and its configuration are written in one transaction.

    Raises :class:`ConfigurationError` for no valid seed, a bad partition count, or when the
    application already has a job (``framework purge fetch-scale`` first).
    """
    if not 1 <= partitions <= 999:
        raise errors.ConfigurationError(f"partitions must be in 1..999, got {partitions}")
    if not checkpoint_interval_s > 0:
        raise errors.ConfigurationError(
            f"checkpoint_interval_s must be > 0, got {checkpoint_interval_s}")
    routed, invalid = seed_links(seeds, partitions)
    if not routed:
        reasons = "; ".join(i["error"] for i in invalid) or "no seed given"
        raise errors.ConfigurationError(f"a crawl needs at least one valid seed URL ({reasons})")
    job = Job(job_id or uuid.uuid4().hex[:8], tuple(seeds), partitions,
              str(Path(shared).resolve()), checkpoint_interval_s, obey_robots, time.time())
    paths = ScalePaths(app)
    if await session.exists(paths.job) is not None:
        raise errors.ConfigurationError(
            f"application {app.name!r} already has a crawl job; purge it first "
            f"(framework purge {app.name})")
    directory = job.directory()
    for name in job.names:
        directory.parts(name).mkdir(parents=True, exist_ok=True)
        directory.inbox(name).mkdir(parents=True, exist_ok=True)
    for index, links in routed.items():
        write_inbox_file(directory.inbox(partition_name(index)), "seeds-e000000-000000000.json",
                         links)
    await session.ensure_path(paths.partitions)
    try:
        await session.transaction().create(paths.job, job.to_json()).create(
            paths.desired, config.to_json()).commit()
    except errors.TransactionFailedError as exc:
        if isinstance(exc.cause, errors.NodeExistsError):
            raise errors.ConfigurationError(
                f"application {app.name!r} already has a crawl job; purge it first "
                f"(framework purge {app.name})") from None
        raise
    return job


async def read_job(session: Session, paths: ScalePaths) -> Job | None:
    try:
        return Job.from_json((await session.get(paths.job))[0])
    except errors.NoNodeError:
        return None
