"""``PartitionFetcher``: a fetcher process of the partitioned crawl (a runtime ``Worker``).

It takes no tasks: the master assigns it partitions (push-mode shards) and it serves each
one with a :class:`PartitionServer` while it owns it.  One httpx client (the politeness
state per host lives in it) and one WARC writer are shared by its partitions.  Directories:
``$FETCH_WARC_DIR`` (default ``out/warc``) for WARC files and ``$FETCH_LOCAL_DIR`` (default
``out/local/<worker name>``) for the partitions' working stores; both are local disk.  The
durable state of a partition is in the job's shared directory (see :mod:`.layout`).

Contract of :meth:`PartitionFetcher.serve_shard` (one assigned partition): it waits for the
first configuration and a readable job record, then serves the partition until the runtime
cancels it (unassigned, or the session SUSPENDED past its trust deadline or LOST: the
partition's last checkpoint is published on the way out when the session still allows).
A partition whose takeover another fetcher won (:class:`PartitionLost`) is held idle until
the master moves it; any other error (a damaged checkpoint, the shared directory, ZooKeeper)
is logged as ``partition.failed`` with its reason and the partition served again after the
worker's backoff, from its last published checkpoint.  Nothing is raised to the runtime.

Its group status carries a :class:`FetcherHealth` as ``health``; readers decode it with
:class:`FetcherStatus`.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import trio

from examples.fetch_service.config import CrawlConfig
from examples.fetch_service.fetch import Fetcher
from examples.fetch_service.scale.layout import APP_NAME, Job, ScalePaths, wait_job
from examples.fetch_service.scale.ownership import PartitionLost
from examples.fetch_service.scale.partition import (
    PartitionContext,
    PartitionServer,
    PartitionStats,
)
from examples.fetch_service.warc import WarcWriter
from framework import errors, records
from framework.logs import get_logger
from framework.runtime import App, Worker

__all__ = ["LOCAL_DIR_ENV", "FetcherHealth", "FetcherStatus", "PartitionFetcher"]

log = get_logger("examples.fetch_service.scale.worker")

WARC_DIR_ENV = "FETCH_WARC_DIR"
LOCAL_DIR_ENV = "FETCH_LOCAL_DIR"


@attrs.frozen
class FetcherHealth:
    """The ``health`` of a fetcher's group status: its counters since it started (all its
    partitions), whether a configuration reached it, and which one (``config``: the first
    10 hex digits of the SHA-1 of :meth:`CrawlConfig.to_json`)."""

    ok: bool = True
    pages: int = 0
    bytes: int = 0
    errors: int = 0
    blocked: int = 0
    checkpoints: int = 0
    corrupt_inbox_files: int = 0
    configured: bool = False
    config: str = ""
    politeness_delay_s: float = 0.0


@attrs.frozen
class FetcherStatus:
    """What this example reads of a fetcher's ``workers/<name>`` status (the runtime's own
    keys are ignored)."""

    health: FetcherHealth = FetcherHealth()


def config_digest(config: CrawlConfig) -> str:
    """The :attr:`FetcherHealth.config` of a fetcher running under ``config``."""
    return hashlib.sha1(config.to_json()).hexdigest()[:10]


class PartitionFetcher(Worker):
    app_name = APP_NAME
    status_interval = 1.0

    def __init__(self, app: App | str | None = None, *, name: str | None = None,
                 address: str = "", warc_dir: str | os.PathLike[str] | None = None,
                 local_dir: str | os.PathLike[str] | None = None) -> None:
        super().__init__(app, name=name, address=address)
        self.warc_dir = Path(warc_dir or os.environ.get(WARC_DIR_ENV) or "out/warc")
        self.local_dir = Path(local_dir or os.environ.get(LOCAL_DIR_ENV)
                              or Path("out/local") / self.name)
        self.crawl_config = CrawlConfig()
        self.paths = ScalePaths(self.app)
        self.stats = PartitionStats()
        self._configured = trio.Event()
        self._fetcher: Fetcher | None = None
        self._warc: WarcWriter | None = None
        self._job: Job | None = None

    @asynccontextmanager
    async def lifetime(self, session: Any) -> AsyncIterator[None]:
        """The HTTP client and the WARC writer, for as long as the fetcher runs."""
        async with Fetcher(_fetch_config(self.crawl_config)) as fetcher:
            with WarcWriter(self.warc_dir, prefix="crawl", writer_id=self.name,
                            max_bytes=self.crawl_config.warc_max_bytes) as warc:
                self._fetcher, self._warc = fetcher, warc
                log.info("fetcher.started", worker=self.name, warc_dir=str(self.warc_dir),
                         local_dir=str(self.local_dir))
                try:
                    yield
                finally:
                    self._fetcher = None

    async def on_config(self, config: Any) -> None:
        try:
            crawl_config = CrawlConfig.from_dict(config)
        except errors.ConfigurationError as exc:
            log.error("fetcher.bad_config", worker=self.name, error=str(exc))
            return
        self.crawl_config = crawl_config
        if self._fetcher is not None:
            self._fetcher.config = _fetch_config(crawl_config)
        if self._warc is not None:
            self._warc.max_bytes = crawl_config.warc_max_bytes
        self._configured.set()
        self.status_changed()

    def health(self) -> dict[str, Any]:
        stats = self.stats
        return records.unstructure(FetcherHealth(
            pages=stats.pages, bytes=stats.bytes, errors=stats.errors, blocked=stats.blocked,
            checkpoints=stats.checkpoints, corrupt_inbox_files=stats.corrupt_inbox_files,
            configured=self._configured.is_set(), config=config_digest(self.crawl_config),
            politeness_delay_s=self.crawl_config.politeness_delay_s))

    async def serve_shard(self, shard: str, spec: bytes) -> None:
        """Serve partition ``shard`` (see the module doc)."""
        await self._configured.wait()
        job = await self._read_job()
        assert self.session is not None and self._fetcher is not None and self._warc is not None
        ctx = PartitionContext(self.session, self.name, job, self.paths, self._fetcher,
                               self._warc, self.local_dir, lambda: self.crawl_config,
                               self.stats, self.status_changed)
        failures = 0
        while True:
            try:
                await PartitionServer(ctx, shard).serve()
            except PartitionLost as exc:
                log.warning("partition.lost", worker=self.name, partition=shard, reason=exc.reason)
                await trio.sleep_forever()  # until the master moves it (this is cancelled)
            except (errors.FrameworkError, OSError) as exc:
                log.warning("partition.failed", worker=self.name, partition=shard,
                            error=f"{type(exc).__name__}: {exc}")
            except Exception:
                log.exception("partition.crashed", worker=self.name, partition=shard)
            failures += 1
            await self.backoff.sleep(failures)  # then serve it again from its checkpoint

    async def _read_job(self) -> Job:
        if self._job is None:
            assert self.session is not None
            self._job = await wait_job(self.session, self.paths)
        return self._job


def _fetch_config(config: CrawlConfig) -> CrawlConfig:
    """Redirects are not followed inline: a target is a link routed to its host's partition."""
    return config.evolve(max_redirects=0)
