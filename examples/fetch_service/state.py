"""The crawl's state in ZooKeeper: where it lives, the job, the wanted configuration, and
the crash-safe set of seen URLs.

Everything sits next to the runtime's own nodes, under the application's base
(``/apps/<app>``)::

    crawl/job               the job (id, seeds), written once by ``ctl start``
    crawl/desired           the wanted CrawlConfig as JSON; ``ctl set`` changes it (a
                            version-checked set), the active master publishes it to the
                            fetchers as the ready-znode configuration (``/apps/<app>/config``)
    crawl/seen/BB/HASH      one node per canonical URL enqueued or visited, created if absent;
                            data ``{"u": url, "d": depth, "k": "seed"|"link"|"hop"}``.  BB is
                            the first two hex digits of HASH: 256 buckets, so no parent holds
                            10k children before the crawl has seen ~2.5 million URLs
    crawl/plans/Lddd-ppppp  part ppppp of level ddd's batches (at most 100 batches a part)
    crawl/levels/Lddd       level ddd's plan header; it exists once the plan is complete, and
                            gets the level's statistics when the level is finished
    crawl/levels/Lddd/sent-ppppp   part ppppp was put in the work queue
    crawl/progress          the master's progress (for dashboards and ``ctl show``)
    crawl/report            the final report; it exists once the crawl is finished
    crawl/hosts/HOST        one lock per host (politeness across fetchers)

Page bodies never go into ZooKeeper: they go to WARC files on each fetcher's disk.  Only
URLs (in per-host batches of ``batch_size``), small outcome records and counters do.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any

import attrs

from examples.fetch_service.concurrency import map_concurrently
from examples.fetch_service.config import CrawlConfig
from framework import errors
from framework.runtime import App
from framework.zk import Session, Stat

__all__ = [
    "APP_NAME",
    "Batch",
    "CrawlPaths",
    "Job",
    "LevelPlan",
    "SeenSet",
    "create_job",
    "dumps",
    "loads",
    "read_desired",
    "read_job",
    "update_desired",
]

#: The application name the example's classes use unless ``--app`` says otherwise.
APP_NAME = "fetch-service"

#: Batches per plan part node (100 batches of 10 URLs: ~60 KB, far below ZooKeeper's 1 MB).
PART_BATCHES = 100

_HOST_SAFE = re.compile(r"[^A-Za-z0-9_.-]")


def dumps(value: Any) -> bytes:
    """Compact JSON bytes (what every crawl node holds)."""
    return json.dumps(value, separators=(",", ":"), sort_keys=True).encode()


def loads(data: bytes | None) -> Any:
    return json.loads(data) if data else None


def level_name(level: int) -> str:
    return f"L{level:03d}"


def level_of(name: str) -> int | None:
    """``"L007"`` -> 7; None for other names."""
    return int(name[1:]) if re.fullmatch(r"L\d{3,}", name) else None


@attrs.frozen
class CrawlPaths:
    """The crawl's node paths for application ``app``."""

    app: App

    @property
    def base(self) -> str:
        return f"{self.app.base}/crawl"

    job = property(lambda self: f"{self.base}/job")
    desired = property(lambda self: f"{self.base}/desired")
    seen = property(lambda self: f"{self.base}/seen")
    plans = property(lambda self: f"{self.base}/plans")
    levels = property(lambda self: f"{self.base}/levels")
    progress = property(lambda self: f"{self.base}/progress")
    report = property(lambda self: f"{self.base}/report")
    hosts = property(lambda self: f"{self.base}/hosts")

    def level(self, level: int) -> str:
        return f"{self.levels}/{level_name(level)}"

    def part(self, level: int, part: int) -> str:
        return f"{self.plans}/{level_name(level)}-{part:05d}"

    def sent(self, level: int, part: int) -> str:
        return f"{self.level(level)}/sent-{part:05d}"

    def host_lock(self, host: str) -> str:
        """The lock that makes one fetcher at a time talk to ``host`` (``host:port``)."""
        return f"{self.hosts}/{_HOST_SAFE.sub('_', host) or '_'}"


# ---------------------------------------------------------------- documents


@attrs.frozen
class Job:
    """What to crawl: an id (it prefixes every task id, so two jobs never mix results) and
    the seed URLs as given (the master canonicalises them and reports bad ones)."""

    id: str
    seeds: tuple[str, ...] = attrs.field(converter=tuple)
    created: float = 0.0

    def to_json(self) -> bytes:
        return dumps({"id": self.id, "seeds": list(self.seeds), "created": self.created})

    @classmethod
    def from_json(cls, data: bytes) -> Job:
        doc = loads(data)
        return cls(doc["id"], doc["seeds"], doc.get("created", 0.0))


@attrs.frozen
class Batch:
    """One work item: up to ``batch_size`` URLs of one host, at one depth."""

    id: str
    host: str
    urls: tuple[str, ...] = attrs.field(converter=tuple)

    def payload(self, job: str, depth: int) -> dict[str, Any]:
        return {"job": job, "depth": depth, "host": self.host, "urls": list(self.urls)}

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "host": self.host, "urls": list(self.urls)}

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> Batch:
        return cls(doc["id"], doc["host"], doc["urls"])


@attrs.frozen
class LevelPlan:
    """Level ``level`` of the crawl: its batches (in queue order) and its header fields.

    ``cut``: URLs found for this level but left out by the page budget; ``invalid``: seeds
    that are not crawlable URLs (level 0 only), as ``{"url", "error"}``; ``stats``: the
    level's statistics once it is finished.
    """

    level: int
    batches: tuple[Batch, ...]
    cut: int = 0
    invalid: tuple[dict[str, str], ...] = ()
    stats: dict[str, Any] | None = None

    @property
    def urls(self) -> int:
        return sum(len(b.urls) for b in self.batches)

    def parts(self) -> list[tuple[Batch, ...]]:
        return [self.batches[i : i + PART_BATCHES]
                for i in range(0, len(self.batches), PART_BATCHES)]

    def header(self) -> dict[str, Any]:
        return {"level": self.level, "urls": self.urls, "batches": len(self.batches),
                "parts": len(self.parts()), "cut": self.cut, "invalid": list(self.invalid),
                "stats": self.stats}


# ---------------------------------------------------------------- job and desired config


async def create_job(
    session: Session, paths: CrawlPaths, seeds: Iterable[str], config: CrawlConfig,
    *, job_id: str | None = None,
) -> Job:
    """Write a new job and its configuration in one transaction.

    Raises :class:`ConfigurationError` when the application already has a job (finish it
    or ``ctl reset`` first) or no seed is given.
    """
    seeds = tuple(seeds)
    if not seeds:
        raise errors.ConfigurationError("a crawl needs at least one seed URL")
    job = Job(job_id or uuid.uuid4().hex[:8], seeds, time.time())
    await session.ensure_path(paths.base)
    try:
        await session.transaction().create(paths.job, job.to_json()).create(
            paths.desired, config.to_json()
        ).commit()
    except errors.TransactionFailedError as exc:
        if isinstance(exc.cause, errors.NodeExistsError):
            raise errors.ConfigurationError(
                f"application {paths.app.name!r} already has a crawl job; "
                "reset it first (python -m examples.fetch_service.ctl reset)"
            ) from None
        raise
    return job


async def read_job(session: Session, paths: CrawlPaths) -> Job | None:
    try:
        return Job.from_json((await session.get(paths.job))[0])
    except errors.NoNodeError:
        return None


async def read_desired(session: Session, paths: CrawlPaths) -> tuple[CrawlConfig, Stat] | None:
    """The wanted configuration and its node's stat, or None before ``ctl start``."""
    try:
        data, stat = await session.get(paths.desired)
    except errors.NoNodeError:
        return None
    return CrawlConfig.from_json(data), stat


async def update_desired(
    session: Session, paths: CrawlPaths, change: Callable[[CrawlConfig], CrawlConfig]
) -> tuple[CrawlConfig, CrawlConfig]:
    """Apply ``change`` to the wanted configuration (version-checked, retried on a race).

    Returns ``(before, after)``.  The active master publishes ``after`` to every fetcher.
    """
    while True:
        current = await read_desired(session, paths)
        if current is None:
            raise errors.ConfigurationError(
                f"application {paths.app.name!r} has no crawl job yet (ctl start creates one)"
            )
        before, stat = current
        after = change(before)
        try:
            await session.set(paths.desired, after.to_json(), version=stat.version)
        except errors.BadVersionError:
            continue  # someone changed it meanwhile: apply our change to theirs
        return before, after


# ---------------------------------------------------------------- seen URLs


def url_hash(url: str) -> str:
    return hashlib.blake2b(url.encode(), digest_size=10).hexdigest()


@attrs.frozen
class Seen:
    """What the seen-set holds for one URL."""

    url: str
    depth: int
    kind: str


class SeenSet:
    """Canonical URLs the crawl has enqueued or visited, one node each (see module doc).

    A claim is a create-if-absent: exactly one claimant creates a URL's node, everybody else
    (including the same claimant retrying after a crash) reads what is stored.  Nothing is
    kept in memory, so a master that takes over continues from the same set.  A lost reply
    (``ConnectionLossError``) is retried: the create either happened (then it is read back)
    or not (then it is made), so the outcome is the same.  On SUSPENDED requests wait for the
    connection; on LOST they continue in the new session (the nodes are persistent).
    """

    def __init__(self, session: Session, paths: CrawlPaths, *, parallel: int = 64) -> None:
        self.session = session
        self.root = paths.seen
        self.parallel = parallel

    def node(self, url: str) -> str:
        digest = url_hash(url)
        return f"{self.root}/{digest[:2]}/{digest}"

    async def get(self, url: str) -> Seen | None:
        try:
            data, _ = await self.session.get(self.node(url))
        except errors.NoNodeError:
            return None
        doc = loads(data)
        return Seen(doc["u"], int(doc["d"]), doc.get("k", "link"))

    async def claim(self, url: str, depth: int, kind: str) -> Seen:
        """Mark ``url`` seen at ``depth`` unless it is already; return what is stored."""
        doc = dumps({"u": url, "d": depth, "k": kind})
        while True:
            try:
                await self.session.create(self.node(url), doc, makepath=True)
                return Seen(url, depth, kind)
            except errors.NodeExistsError:
                pass
            except errors.ConnectionLossError:
                await self.session.wait_connected()
            found = await self.get(url)
            if found is not None:
                return found

    async def get_many(self, urls: Iterable[str]) -> dict[str, Seen | None]:
        return await map_concurrently(urls, self.get, limit=self.parallel)

    async def claim_many(self, urls: Iterable[str], depth: int, kind: str) -> dict[str, Seen]:
        return await map_concurrently(
            urls, lambda url: self.claim(url, depth, kind), limit=self.parallel
        )

    async def unseen(self, urls: Iterable[str]) -> list[str]:
        """The URLs of ``urls`` not in the set (order kept)."""
        wanted = list(dict.fromkeys(urls))

        async def missing(url: str) -> bool:
            return await self.session.exists(self.node(url)) is None

        found = await map_concurrently(wanted, missing, limit=self.parallel)
        return [url for url in wanted if found[url]]
