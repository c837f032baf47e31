"""Serving one partition: fetch its frontier politely, merge its inbox, ship links found for
other partitions, and checkpoint it, while (and only while) this fetcher owns it.

The runtime calls :meth:`PartitionServer.serve` from ``Worker.serve_shard`` and cancels it
when the shard is moved away, and when the session can no longer be trusted (SUSPENDED past
its trust deadline, or LOST); every effect outside ZooKeeper that only the owner may cause
(an inbox file shipped, a checkpoint written) is preceded by ``session.ensure_trusted()``,
so a process paused past its deadline writes nothing even before it is cancelled.

Guarantees:

* **No URL is lost.**  A page's completion is one store transaction, after its responses
  are written to WARC: the URL marked done, its links for this partition added to the
  frontier, its links for other partitions put in the outbox.  A kill -9 loses only the
  work since the last published checkpoint: the next owner fetches those pages again
  (duplicate WARC records) and re-reads the inbox files not yet covered by a checkpoint.
  (WARC records are flushed, not fsynced: a process dying keeps them, a machine crash may
  not.)
* **Politeness per host**: one request at a time per host (the fetch slots take hosts from
  :class:`.hostqueue.HostQueues`; the fetcher spaces them by ``politeness_delay_s``),
  robots.txt consulted first; after a takeover from another owner the fetch slots start
  ``politeness_delay_s`` late.
* **Hand-over**: when cancelled, the fetch slots stop first, then a last checkpoint is
  published as released (bounded by :data:`FINAL_CHECKPOINT_S`; a deposed owner's is
  refused), which lets the next owner start at once.

What :meth:`PartitionServer.serve` raises: :class:`.ownership.PartitionLost` (another owner
took over, or the partition is not assigned here), :class:`CorruptCheckpoint` (the published
checkpoint cannot be read: nothing is served and nothing overwritten), ZooKeeper errors and
``OSError`` from the shared store (:class:`framework.StoreUnavailable` when it cannot be
reached); the fetcher logs them and serves again after a backoff.  Checkpoints are written
on the fetcher's local disk, then uploaded to the shared store atomically (a whole file or
none), and downloaded to local disk before they are restored.  An inbox file that is not a batch is
set aside (:func:`.inbox.quarantine`), logged as ``partition.inbox_corrupt`` and counted;
the partition goes on.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import attrs
import trio

from examples.fetch_service.config import CrawlConfig
from examples.fetch_service.fetch import ErrorKind, Fetcher, FetchResult
from examples.fetch_service.links import InvalidUrlError, canonicalize, host_key
from examples.fetch_service.scale.hostqueue import HostQueues
from examples.fetch_service.scale.inbox import (
    InboxBatch,
    inbox_file_name,
    list_inbox,
    quarantine,
    read_inbox_file,
    write_inbox_file,
)
from examples.fetch_service.scale.layout import Job, ScalePaths
from examples.fetch_service.scale.ownership import Ownership, PartitionLost
from examples.fetch_service.scale.robots import RobotsRules, robots_url
from examples.fetch_service.scale.store import CorruptCheckpoint, Link, PartitionStore, UrlState
from examples.fetch_service.scale.urls import partition_of
from examples.fetch_service.warc import WarcWriter
from framework import BlobMissing, BlobStore, errors, records, single_body_error
from framework.logs import get_logger
from framework.zk import Session

__all__ = ["CorruptCheckpoint", "PartitionContext", "PartitionServer", "PartitionStats"]

log = get_logger("examples.fetch_service.scale.partition")

#: Seconds between two listings of the inbox while it has nothing new (a shared file system
#: or an object store offers no change notification).
INBOX_POLL_S = 0.1
#: Seconds between two shipments of the outbox (links are batched into one file per
#: destination partition per shipment).
SHIP_INTERVAL_S = 0.2
#: Most links shipped in one round.
SHIP_BATCH = 20_000
#: Bound on the last checkpoint when the partition is released.
FINAL_CHECKPOINT_S = 3.0
#: Redirect outcomes whose target is a link of its own (redirects are not followed inline).
REDIRECTED = frozenset({ErrorKind.TOO_MANY_REDIRECTS, ErrorKind.REDIRECT_LOOP})


@attrs.define
class PartitionStats:
    """Counters of one fetcher process (all its partitions), for its status."""

    pages: int = 0  # responses stored in WARC
    bytes: int = 0
    errors: int = 0
    blocked: int = 0
    robots: int = 0  # robots.txt fetched
    checkpoints: int = 0
    shipped_files: int = 0
    corrupt_inbox_files: int = 0  # set aside unread (see .inbox.quarantine)


@attrs.define
class PartitionContext:
    """What the fetcher process gives each partition it serves."""

    session: Session
    worker: str
    job: Job
    paths: ScalePaths
    fetcher: Fetcher
    warc: WarcWriter
    local_dir: Path
    config: Callable[[], CrawlConfig]
    stats: PartitionStats
    on_checkpoint: Callable[[], None] = lambda: None  # e.g. republish the worker's status


class PartitionServer:
    def __init__(self, ctx: PartitionContext, name: str) -> None:
        self.ctx = ctx
        self.name = name
        self.index = ctx.job.names.index(name)
        self.shared = ctx.job.directory()
        app = ctx.paths.app
        self.ownership = Ownership(ctx.session, ctx.paths.partition(name), ctx.worker,
                                   assignment=f"{app.assignment_dir(ctx.worker)}/{name}",
                                   members=app.workers)
        self.store: PartitionStore | None = None
        self.queues = HostQueues()
        self._rules: dict[str, RobotsRules] = {}
        self._consumed: set[str] = set()
        self._dirty = True
        self._outbox = trio.Event()
        self._ship_seq = 0
        self._ckpt_seq = 0

    # ------------------------------------------------------------ lifecycle

    async def serve(self) -> None:
        """Own and crawl the partition until cancelled (see the module doc for what it
        raises)."""
        record = await self.ownership.take_over()
        previous = self.ownership.previous.owner
        epoch = record.epoch
        working = self.ctx.local_dir / f"{self.name}-e{epoch:06d}.sqlite"
        source = None
        if record.checkpoint:
            source = self.ctx.local_dir / f"{self.name}-e{epoch:06d}-restore" / record.checkpoint
        try:
            if source is not None:
                key = f"{self.shared.parts_key(self.name)}/{record.checkpoint}"
                await trio.to_thread.run_sync(_download, self.shared.store, key, source)
            self.store = store = await trio.to_thread.run_sync(PartitionStore.restore, source,
                                                               working)
        except CorruptCheckpoint as exc:
            log.error("partition.checkpoint_corrupt", partition=self.name, epoch=epoch,
                      checkpoint=record.checkpoint, store=self.shared.store.url,
                      error=str(exc))
            raise
        finally:
            if source is not None:
                shutil.rmtree(source.parent, ignore_errors=True)
        try:
            self._consumed = store.consumed()
            self._rules = {host: RobotsRules.from_answer(status, body)
                           for host, (status, body) in store.robots().items()}
            self.queues = HostQueues(store.pending())
            progress = store.progress()
            log.info("partition.serving", partition=self.name, epoch=epoch,
                     checkpoint=record.checkpoint, pending=progress.pending, done=progress.done,
                     outbox=progress.outbox)
            lost = False
            try:
                with single_body_error():  # PartitionLost raised as itself
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(self._read_inbox)
                        nursery.start_soon(self._ship)
                        nursery.start_soon(self._checkpoints)
                        if previous is not None:
                            # politeness across owners: the previous owner's last request
                            # ended before it released the partition (or its session
                            # ended); keep the delay after that (a policy, not a sync)
                            await trio.sleep(self.ctx.config().politeness_delay_s)
                        for _ in range(max(self.ctx.config().fetch_concurrency, 1)):
                            nursery.start_soon(self._fetch_slot)
            except PartitionLost:
                lost = True
                raise
            finally:
                with trio.CancelScope(shield=True), trio.move_on_after(FINAL_CHECKPOINT_S):
                    try:
                        if lost:
                            pass  # our publish was refused: nothing left to hand over
                        elif self._dirty:
                            await self._checkpoint(released=True)
                        else:
                            await self.ownership.release()
                    except (PartitionLost, errors.ZooKeeperError, OSError) as exc:
                        log.info("partition.final_checkpoint_skipped", partition=self.name,
                                 epoch=epoch, reason=str(exc))
        finally:
            store.close()
            for suffix in ("", "-wal", "-shm"):
                Path(f"{working}{suffix}").unlink(missing_ok=True)
            log.info("partition.released", partition=self.name, epoch=epoch)

    # ------------------------------------------------------------ fetching

    async def _fetch_slot(self) -> None:
        while True:
            url, host, depth = await self.queues.take()
            try:
                await self._fetch_one(url, host, depth)
            finally:
                self.queues.release(host)

    async def _fetch_one(self, url: str, host: str, depth: int) -> None:
        store, stats = self._store(), self.ctx.stats
        config = self.ctx.config()
        depth = store.depth(url) or depth
        if self.ctx.job.obey_robots:
            rules = await self._robots(host, url)
            if not rules.allows(url, config.user_agent):
                store.complete(url, UrlState.BLOCKED, (), ())
                stats.blocked += 1
                self._dirty = True
                return
        result = await self.ctx.fetcher.fetch(url)
        await self.ctx.warc.store(result)
        stats.pages += len(result.responses)
        stats.bytes += sum(len(r.body) for r in result.responses)
        outcome = result.outcome
        if not outcome.ok and outcome.error_kind not in REDIRECTED:
            stats.errors += 1
        own: list[Link] = []
        others: list[tuple[int, str, int]] = []
        for link, link_depth in self._links(result, depth, config):
            link_host = host_key(link)
            target = partition_of(link_host, self.ctx.job.partitions)
            if target == self.index:
                own.append((link, link_host, link_depth))
            else:
                others.append((target, link, link_depth))
        self.queues.add(store.complete(url, UrlState.DONE, own, others))
        self._dirty = True
        if others:
            self._outbox.set()

    @staticmethod
    def _links(result: FetchResult, depth: int,
               config: CrawlConfig) -> list[tuple[str, int]]:
        """Links to follow: the page's (one level deeper, below ``max_depth``), and the
        target of a redirect (not followed inline: its host may belong to another
        partition), at the same depth."""
        outcome = result.outcome
        found = [(link, depth + 1) for link in outcome.links] if depth < config.max_depth else []
        if outcome.error_kind in REDIRECTED and result.responses:
            last = result.responses[-1]
            location = next((v for k, v in last.headers if k.lower() == "location"), None)
            if location:
                try:
                    target = canonicalize(location, last.url)
                except InvalidUrlError:
                    target = None
                if target is not None and config.allows(target):
                    found.append((target, depth))
        return found

    async def _robots(self, host: str, url: str) -> RobotsRules:
        rules = self._rules.get(host)
        if rules is None:
            scheme = url.partition(":")[0]
            result = await self.ctx.fetcher.fetch(robots_url(host, scheme))
            status = result.outcome.status or 0
            body = ""
            if 200 <= status < 300 and result.responses:
                body = result.responses[-1].body.decode("utf-8", errors="replace")
            self._store().set_robots(host, status, body)
            rules = self._rules[host] = RobotsRules.from_answer(status, body)
            self.ctx.stats.robots += 1
            self._dirty = True
            log.info("partition.robots", partition=self.name, host=host, status=status)
        return rules

    # ------------------------------------------------------------ links in and out

    async def _read_inbox(self) -> None:
        shared, inbox = self.shared.store, self.shared.inbox_key(self.name)
        while True:
            names = await trio.to_thread.run_sync(list_inbox, shared, inbox)
            fresh = [name for name in names if name not in self._consumed]
            for name in fresh:
                try:
                    batch = await trio.to_thread.run_sync(read_inbox_file, shared, inbox, name)
                except records.CorruptRecord as exc:
                    kept = await trio.to_thread.run_sync(quarantine, shared, inbox, name)
                    self.ctx.stats.corrupt_inbox_files += 1
                    log.error("partition.inbox_corrupt", partition=self.name, file=name,
                              error=str(exc), kept_as=str(kept))
                    continue
                links = [(url, host_key(url), depth) for url, depth in batch.links]
                self.queues.add(self._store().consume(name, links))
                self._consumed.add(name)
                self._dirty = True
            if not fresh:
                await trio.sleep(INBOX_POLL_S)

    async def _ship(self) -> None:
        store = self._store()
        while True:
            rows = store.outbox(SHIP_BATCH)
            if not rows:
                self._outbox = trio.Event()
                await self._outbox.wait()
                continue
            by_target: dict[int, list[tuple[str, int]]] = {}
            for row in rows:
                by_target.setdefault(row.dst, []).append((row.url, row.depth))
            for target, links in sorted(by_target.items()):
                self._ship_seq += 1
                name = inbox_file_name(self.name, self.ownership.epoch, self._ship_seq)
                inbox = self.shared.inbox_key(self.ctx.job.names[target])
                self.ctx.session.ensure_trusted()  # a paused former owner writes nothing
                await trio.to_thread.run_sync(write_inbox_file, self.shared.store, inbox, name,
                                              InboxBatch(tuple(links)))
                self.ctx.stats.shipped_files += 1
            store.shipped([row.id for row in rows])
            self._dirty = True
            await trio.sleep(SHIP_INTERVAL_S)  # batching period, not synchronisation

    # ------------------------------------------------------------ checkpoints

    async def _checkpoints(self) -> None:
        interval = self.ctx.job.checkpoint_interval_s
        while True:
            if self._dirty:
                await self._checkpoint()
            await trio.sleep(interval)  # the checkpoint period, not synchronisation

    async def _checkpoint(self, *, released: bool = False) -> None:
        """Snapshot the store to local disk, upload it to the shared store, publish it
        (fenced; ``released``: as the last state of this owner), then delete what it made
        redundant: older checkpoints and the inbox files it has merged."""
        store = self._store()
        epoch = self.ownership.epoch
        self._ckpt_seq += 1
        name = f"ckpt-e{epoch:06d}-{self._ckpt_seq:06d}.sqlite"
        parts = self.shared.parts_key(self.name)
        tmp = self.ctx.local_dir / f".{self.name}-{name}.tmp"
        progress = store.progress()
        merged = set(self._consumed)
        self.ctx.session.ensure_trusted()
        try:
            store.checkpoint(tmp)  # synchronous: no step of this partition runs meanwhile
            self._dirty = False
            self.ctx.session.ensure_trusted()
            await trio.to_thread.run_sync(self.shared.store.put_file, f"{parts}/{name}", tmp)
        finally:
            tmp.unlink(missing_ok=True)
        await self.ownership.publish(name, progress, released=released)
        self.ctx.stats.checkpoints += 1
        self.ctx.on_checkpoint()
        inbox = self.shared.inbox_key(self.name)
        self.ctx.session.ensure_trusted()
        await trio.to_thread.run_sync(_delete_redundant, self.shared.store, parts, name, inbox,
                                      merged)
        if merged:
            store.forget_consumed(merged)
            self._consumed -= merged
            self._dirty = True  # publish once more: the master waits for emptied inboxes

    def _store(self) -> PartitionStore:
        assert self.store is not None
        return self.store


def _download(shared: BlobStore, key: str, target: Path) -> None:
    """The published checkpoint ``key`` to the local file ``target``; a missing one is a
    :class:`CorruptCheckpoint` (the record names a file the store does not have)."""
    try:
        shared.get_file(key, target)
    except BlobMissing:
        raise CorruptCheckpoint(f"checkpoint {shared.url}/{key} cannot be restored: it is "
                                "not in the shared store") from None


def _delete_redundant(shared: BlobStore, parts: str, current: str, inbox: str,
                      merged: set[str]) -> None:
    """Older checkpoints of this partition (never a newer one) and merged inbox files."""
    for info in shared.list(parts):
        name = info.key.rsplit("/", 1)[-1]
        if name.startswith("ckpt-") and name < current:
            shared.delete(info.key)
    for name in merged:
        shared.delete(f"{inbox}/{name}")
