"""``PartitionMaster``: the master of the partitioned crawl (a runtime ``Master``).

While it leads it: publishes the wanted configuration to the fetchers (and follows
rewrites of ``crawl/desired``), creates the partition records, keeps the partitions assigned to live
fetchers (``MasterContext.run_shards``: sticky, balanced, moved off dead fetchers after the
safe-mode period), and detects the end of the crawl; then it writes the report.  It keeps no
crawl data: a standby that takes over resumes from the partition records.

The end (no URL pending anywhere, no link in flight) is detected without any per-URL
record, from the partition records and the inbox directories:

1. read every record (with a watch); unless all say ``idle`` (their checkpoint held nothing
   pending and an empty outbox), wait for a change;
2. list every inbox directory: a file there is a link batch in flight (or merged but not yet
   covered by a published checkpoint);
3. read the records again: the same versions mean no checkpoint was published meanwhile.

A link in flight is in an outbox (its sender is not idle), or an inbox file (seen in 2), or
merged into a receiver's frontier: that receiver then publishes a non-idle checkpoint before
it deletes the file, so either the file was seen in 2, or the version changed by 3, or that
checkpoint was already read in 1.
"""

from __future__ import annotations

import time
from typing import Any

import trio

from examples.fetch_service.config import CrawlConfig
from examples.fetch_service.scale.inbox import list_inbox
from examples.fetch_service.scale.layout import (
    APP_NAME,
    Job,
    PartitionRecord,
    ScalePaths,
    dumps,
    read_job,
)
from framework import errors, single_body_error
from framework.logs import get_logger
from framework.runtime import Master, MasterContext
from framework.zk import Session, Stat, wait_exists, watch_data

__all__ = ["PartitionMaster", "read_partitions"]

log = get_logger("examples.fetch_service.scale.master")


class PartitionMaster(Master):
    app_name = APP_NAME
    stable_for = 1.0

    async def lead(self, ctx: MasterContext) -> None:
        paths = ScalePaths(ctx.app)
        session = ctx.session
        if await session.exists(paths.report) is not None:
            return
        await wait_exists(session, paths.job)
        job = await read_job(session, paths)
        assert job is not None
        for name in job.names:
            if await session.exists(paths.partition(name)) is None:
                await ctx.term.commit(lambda t, n=name: t.create(
                    paths.partition(n), PartitionRecord().to_json()))
        with single_body_error():  # a lost term is raised as itself
            async with trio.open_nursery() as nursery:
                await nursery.start(_follow_desired, ctx, paths)
                nursery.start_soon(ctx.run_shards, {name: b"" for name in job.names})
                records = await _until_finished(session, paths, job)
                nursery.cancel_scope.cancel()
        report = _report(job, records, self.name)
        await ctx.term.commit(lambda t: t.create(paths.report, dumps(report)))
        log.info("crawl.finished", job=job.id, pages=report["done"], blocked=report["blocked"])


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


async def read_partitions(session: Session, paths: ScalePaths, job: Job,
                          changed: trio.Event | None = None,
                          ) -> dict[str, tuple[PartitionRecord, Stat]]:
    """Every partition's record and stat (``changed`` is set when one of them changes)."""
    found: dict[str, tuple[PartitionRecord, Stat]] = {}
    for name in job.names:
        watch = session.waker(changed) if changed is not None else None
        data, stat = await session.get(paths.partition(name), watch=watch)
        found[name] = (PartitionRecord.from_json(data), stat)
    return found


def _inboxes_empty(job: Job) -> bool:
    directory = job.directory()
    return not any(list_inbox(directory.inbox(name)) for name in job.names)


async def _until_finished(session: Session, paths: ScalePaths,
                          job: Job) -> dict[str, PartitionRecord]:
    while True:
        changed = trio.Event()
        try:
            first = await read_partitions(session, paths, job, changed)
            idle = all(record.idle for record, _ in first.values())
            if idle and await trio.to_thread.run_sync(_inboxes_empty, job):
                second = await read_partitions(session, paths, job)
                if all(first[n][1].version == second[n][1].version for n in job.names):
                    return {name: record for name, (record, _) in second.items()}
                continue
        except (errors.ConnectionLossError, errors.SessionExpiredError):
            await session.wait_connected()
            continue
        await changed.wait()


def _report(job: Job, records: dict[str, PartitionRecord], master: str) -> dict[str, Any]:
    def total(key: str) -> int:
        return sum(int((record.status or {}).get(key, 0)) for record in records.values())

    return {"job": job.id, "seeds": list(job.seeds), "partitions": job.partitions,
            "done": total("done"), "blocked": total("blocked"), "started": job.created,
            "finished": time.time(), "master": master,
            "epochs": {name: record.epoch for name, record in records.items()}}
