"""The fetcher: takes per-host batches of URLs, fetches them politely, stores WARC records.

``FetchWorker`` is a :class:`framework.runtime.Worker`; run as many as you like, on any
machines (``python -m framework run examples.fetch_service.app:FetchWorker --zk ...``).  Each
one writes its WARC files into ``FETCH_WARC_DIR`` (default ``out/warc``) on its own disk;
page bodies never go to ZooKeeper.

For each batch (one host, one depth) it:

1. waits for the first complete configuration (the ready-znode protocol, pushed by the
   master), and applies every later one at once: the next request uses it;
2. fetches the URLs one after the other, in the batch's order (redirects by hand; an
   unreachable host or a bad URL is an outcome, not an error), and stores every response
   received in its WARC file before the next URL;
3. when the batch's depth is below ``max_depth``, returns the links found that the seen-set
   does not hold yet (the master claims them), with a small outcome record per URL.

Politeness across the cluster: every request to a host (a redirect hop to another host
included) is made while holding that host's lock (``crawl/hosts/HOST``), kept until
``politeness_delay_s`` after the request ended, so the next holder - maybe on another
machine - starts no sooner.  One lock is held at a time, so fetchers cannot deadlock.

At-least-once: if the fetcher dies mid-batch, the batch is delivered again to another one,
which fetches it all again - the WARC summary counts those duplicates.  Status and health
(pages stored, bytes, errors, the configuration in use) are published in the worker's group
node for ``framework status`` and the demo's dashboard.

SUSPENDED / LOST: handled by the runtime and the lock: a batch whose claim or host lock can
no longer be proven is cancelled (and delivered again); the worker rejoins after a new
session.  The configuration watch continues in the new session.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from examples.fetch_service.config import CrawlConfig
from examples.fetch_service.fetch import Fetcher, FetchResult
from examples.fetch_service.planning import batch_record
from examples.fetch_service.state import APP_NAME, CrawlPaths, SeenSet
from examples.fetch_service.warc import WarcWriter
from framework import errors
from framework.logs import get_logger
from framework.primitives import Lock
from framework.runtime import App, Task, Worker

__all__ = ["FetchWorker"]

log = get_logger("examples.fetch_service.worker")

WARC_DIR_ENV = "FETCH_WARC_DIR"


class FetchWorker(Worker):
    """A page fetcher (see the module doc).  ``warc_dir`` overrides ``$FETCH_WARC_DIR``."""

    app_name = APP_NAME
    concurrency = 2
    max_attempts = 5
    time_limit = 600.0
    status_interval = 0.5
    drain_timeout = 30.0

    def __init__(self, app: App | str | None = None, *, name: str | None = None,
                 address: str = "", warc_dir: str | os.PathLike[str] | None = None) -> None:
        super().__init__(app, name=name, address=address)
        self.warc_dir = Path(warc_dir or os.environ.get(WARC_DIR_ENV) or "out/warc")
        self.crawl_config = CrawlConfig()
        self.paths = CrawlPaths(self.app)
        self.pages = 0  # responses stored (a redirect hop is one)
        self.bytes = 0
        self.errors = 0
        self.batches = 0
        self._configured = trio.Event()
        self._fetcher: Fetcher | None = None
        self._warc: WarcWriter | None = None
        self._lock_dirs: set[str] = set()

    async def run(self, session: Any) -> None:
        async with Fetcher(self.crawl_config, gate=self._host_gate) as fetcher:
            with WarcWriter(self.warc_dir, prefix="crawl", writer_id=self.name,
                            max_bytes=self.crawl_config.warc_max_bytes) as warc:
                self._fetcher, self._warc = fetcher, warc
                log.info("fetcher.started", worker=self.name, warc_dir=str(self.warc_dir))
                try:
                    await super().run(session)
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
            self._fetcher.config = crawl_config
        if self._warc is not None:
            self._warc.max_bytes = crawl_config.warc_max_bytes
        self._configured.set()
        self.status_changed()
        log.info("fetcher.config_applied", worker=self.name, user_agent=crawl_config.user_agent,
                 max_depth=crawl_config.max_depth,
                 politeness_delay_s=crawl_config.politeness_delay_s)

    def health(self) -> dict[str, Any]:
        config = self.crawl_config
        return {
            "ok": True,
            "pages": self.pages,
            "bytes": self.bytes,
            "errors": self.errors,
            "batches": self.batches,
            "configured": self._configured.is_set(),
            "config": hashlib.sha1(config.to_json()).hexdigest()[:10],
            "user_agent": config.user_agent,
            "max_depth": config.max_depth,
            "politeness_delay_s": config.politeness_delay_s,
        }

    async def handle(self, task: Task) -> dict[str, Any]:
        payload = task.payload
        depth, host, urls = int(payload["depth"]), str(payload["host"]), list(payload["urls"])
        await self._configured.wait()
        assert self.session is not None and self._fetcher is not None
        outcomes = []
        for url in urls:
            result = await self._fetcher.fetch(url)
            await self._store(result)
            outcomes.append(result.outcome)
        config = self.crawl_config
        links: list[str] = []
        if depth < config.max_depth:
            found = sorted({link for o in outcomes if o.ok for link in o.links
                            if config.allows(link)})
            links = await SeenSet(self.session, self.paths).unseen(found)
        self.batches += 1
        self.errors += sum(1 for o in outcomes if not o.ok)
        log.info("fetcher.batch_done", worker=self.name, task=task.id, host=host, depth=depth,
                 urls=len(urls), new_links=len(links), attempt=task.attempts)
        return batch_record(depth, self.name, outcomes, links)

    @asynccontextmanager
    async def _host_gate(self, host: str) -> AsyncIterator[None]:
        """Hold ``host``'s lock (shared by every fetcher of the application)."""
        assert self.session is not None
        path = self.paths.host_lock(host)
        if path not in self._lock_dirs:
            await self.session.ensure_path(path)
            self._lock_dirs.add(path)
        async with Lock(self.session, path, self.name.encode()).acquire():
            yield

    async def _store(self, result: FetchResult) -> None:
        assert self._warc is not None and self.session is not None
        self.session.ensure_trusted()  # a claim of a paused, expired session writes nothing
        await self._warc.store(result)
        self.pages += len(result.responses)
        self.bytes += sum(len(r.body) for r in result.responses)
