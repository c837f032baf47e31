"""``PartitionMaster``: the master of the partitioned crawl (a runtime ``Master``).

While it leads it: publishes the wanted configuration to the fetchers (and follows
rewrites of ``crawl/desired``; a rewrite that is not a valid :class:`CrawlConfig` is logged
as ``crawl.bad_config`` and the previous one kept), creates the partition records, keeps the
partitions assigned to live fetchers (``MasterContext.run_shards``: sticky, balanced, moved
off dead fetchers after the safe-mode period), and detects the end of the crawl; then it
writes the :class:`~.layout.CrawlReport` (fenced by its term) and ``lead`` returns.  It
keeps no crawl data: a standby that takes over resumes from the partition records.

Connection states are the runtime's (see :class:`framework.runtime.Master`): on SUSPENDED
past the trust deadline or on LOST the body of ``lead`` is cancelled and the master stands
by again; the end detection itself waits out a ``ConnectionLossError``.  A partition record
or job record that does not decode is logged (``crawl.partition_record_corrupt``,
``crawl.job_corrupt``) and waited out: the crawl does not end while a record is unreadable.

Guarantee: the crawl is declared finished only when no URL is pending in any partition's
published state and no link is in flight, decided without any per-URL record:

1. read every partition record (with a watch); unless all are idle, wait for a change;
2. list every inbox directory: a file there is a link batch in flight;
3. read the records again: the same versions mean no checkpoint was published meanwhile.

(Why that suffices: ``docs/architecture.md``, "Fetch Service at scale".)
"""

from __future__ import annotations

import time
from typing import Any, NamedTuple

import trio

from examples.fetch_service.config import CrawlConfig
from examples.fetch_service.scale.inbox import list_inbox, list_quarantined
from examples.fetch_service.scale.layout import (
    APP_NAME,
    CrawlReport,
    Job,
    PartitionRecord,
    ScalePaths,
    wait_job,
)
from framework import errors, records, single_body_error
from framework.logs import get_logger
from framework.runtime import Master, MasterContext
from framework.zk import Session, watch_data

__all__ = ["PartitionMaster", "read_partitions"]

log = get_logger("examples.fetch_service.scale.master")

#: Seconds between two listings of the inboxes while the shared store cannot be listed.
STORE_RETRY_S = 1.0


class PartitionMaster(Master):
    app_name = APP_NAME
    stable_for = 1.0

    async def lead(self, ctx: MasterContext) -> None:
        paths = ScalePaths(ctx.app)
        session = ctx.session
        if await session.exists(paths.report) is not None:
            return
        job = await wait_job(session, paths)
        for name in job.names:
            if await session.exists(paths.partition(name)) is None:
                await ctx.term.commit(lambda t, n=name: t.create(
                    paths.partition(n), records.encode(PartitionRecord())))
        with single_body_error():  # a lost term is raised as itself
            async with trio.open_nursery() as nursery:
                await nursery.start(_follow_desired, ctx, paths)
                nursery.start_soon(ctx.run_shards, {name: b"" for name in job.names})
                final = await _until_finished(session, paths, job)
                nursery.cancel_scope.cancel()
        quarantined = await trio.to_thread.run_sync(_quarantined, job)
        report = _report(job, final, self.name, quarantined)
        await ctx.term.commit(lambda t: t.create(paths.report, records.encode(report)))
        log.info("crawl.finished", job=job.id, pages=report.done, blocked=report.blocked,
                 quarantined=len(quarantined))


async def _follow_desired(ctx: MasterContext, paths: ScalePaths,
                          task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    published: CrawlConfig | None = None
    async for snap in watch_data(ctx.session, paths.desired):
        if snap.data is None:
            continue
        try:
            config = CrawlConfig.from_json(snap.data)
        except errors.ConfigurationError as exc:
            log.error("crawl.bad_config", error=str(exc), kept="the previous one")
            continue
        if config != published:
            await ctx.publish_config(config.to_dict())
            published = config
            log.info("crawl.config_published", politeness_delay_s=config.politeness_delay_s)
        task_status.started()
        task_status = trio.TASK_STATUS_IGNORED


class Read(NamedTuple):
    """A partition record as read, with the version it was read at."""

    record: PartitionRecord
    version: int


async def read_partitions(session: Session, paths: ScalePaths, job: Job,
                          changed: trio.Event | None = None) -> dict[str, Read]:
    """Every partition's record and version (``changed`` is set when one of them changes);
    :class:`~framework.records.CorruptRecord` naming the first one that does not decode (its
    watch is set too)."""
    found: dict[str, Read] = {}
    for name in job.names:
        watch = session.waker(changed) if changed is not None else None
        path = paths.partition(name)
        data, stat = await session.get(path, watch=watch)
        try:
            found[name] = Read(records.decode(data, PartitionRecord), stat.version)
        except records.CorruptRecord as exc:
            raise records.CorruptRecord(f"{path}: {exc}") from None
    return found


def _inboxes_empty(job: Job) -> bool:
    directory = job.directory()
    return not any(list_inbox(directory.store, directory.inbox_key(name))
                   for name in job.names)


async def _inboxes_seen_empty(job: Job) -> bool:
    """Whether every inbox is empty; while the shared store cannot be listed (an
    ``OSError``: unreachable, say) it is asked again every :data:`STORE_RETRY_S` seconds
    (logged as ``crawl.store_unavailable``): the crawl does not end unseen, nor does the
    master's term."""
    while True:
        try:
            return await trio.to_thread.run_sync(_inboxes_empty, job)
        except OSError as exc:
            log.warning("crawl.store_unavailable", store=job.shared, error=str(exc),
                        action=f"listing the inboxes again in {STORE_RETRY_S:g} s")
        await trio.sleep(STORE_RETRY_S)  # a retry's pace, not a synchronisation


async def _until_finished(session: Session, paths: ScalePaths,
                          job: Job) -> dict[str, PartitionRecord]:
    while True:
        changed = trio.Event()
        try:
            first = await read_partitions(session, paths, job, changed)
            idle = all(read.record.idle for read in first.values())
            if idle and await _inboxes_seen_empty(job):
                second = await read_partitions(session, paths, job)
                if all(first[n].version == second[n].version for n in job.names):
                    return {name: read.record for name, read in second.items()}
                continue
        except (errors.ConnectionLossError, errors.SessionExpiredError):
            await session.wait_connected()
            continue
        except records.CorruptRecord as exc:
            log.error("crawl.partition_record_corrupt", error=str(exc),
                      action="the crawl does not end until the record is rewritten")
        await changed.wait()


def _quarantined(job: Job) -> tuple[str, ...]:
    """``pNNN/<file>`` of every inbox file set aside as unreadable."""
    directory = job.directory()
    return tuple(f"{name}/{file}" for name in job.names
                 for file in list_quarantined(directory.store, directory.inbox_key(name)))


def _report(job: Job, final: dict[str, PartitionRecord], master: str,
            quarantined: tuple[str, ...]) -> CrawlReport:
    return CrawlReport(
        job=job.id, seeds=job.seeds, partitions=job.partitions,
        done=sum(record.progress.done for record in final.values()),
        blocked=sum(record.progress.blocked for record in final.values()),
        started=job.created, finished=time.time(), master=master,
        epochs={name: record.epoch for name, record in final.items()},
        quarantined=quarantined)
