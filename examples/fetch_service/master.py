"""The crawl master: plans the crawl level by level and hands batches to the fetchers.

``CrawlMaster`` is a :class:`framework.runtime.Master`; run two or more (``python -m
framework run examples.fetch_service.app:CrawlMaster --zk ...``): one leads, the others stand
by and take over when its session ends.  Everything it knows is read from ZooKeeper when its
term starts (see :mod:`examples.fetch_service.state`), never kept from an earlier term.

The crawl goes level by level, which is what makes it match the breadth-first ground truth
(:meth:`Site.reachable_urls`): with batches of several depths in flight at once, a URL could
first be found at a larger depth than its shortest one and its links would then be cut off
by ``max_depth`` too early.  For level ``d``:

1. plan: the level's URLs (each claimed in the seen-set at depth ``d``) in per-host batches,
   written as plan parts, then the level header (fenced writes);
2. queue each part's batches as tasks (id and idempotency key ``<job>-Lddd-NNNNN``) and mark
   the part sent;
3. wait until the queue is empty and no batch runs (at-least-once: a batch of a fetcher that
   died is delivered again);
4. read the batches' results: mark every URL a redirect chain went through as seen at depth
   ``d``; when ``d < max_depth``, claim the links found (create-if-absent at depth ``d + 1``,
   at most ``page_budget`` URLs in all) - the claimed ones are level ``d + 1``.

Every step can be repeated by a master that takes over half-way and gives the same result:
claims are create-if-absent and a URL already claimed *at depth d + 1* still belongs to level
``d + 1``; a plan whose header is missing is rewritten; a part not marked sent is queued
again, minus its batches that already run or ran (the rare leftover case - the master dying
between queueing a part and marking it - can give duplicate fetches, which the WARC summary
counts; never a lost batch).

The configuration: ``crawl/desired`` (changed with ``ctl set``) is watched, validated and
published to the fetchers through the ready-znode configuration; ``max_depth``,
``page_budget`` and ``batch_size`` apply from the next level on, the rest at the fetchers'
next request.

SUSPENDED / LOST: the runtime cancels ``lead`` as soon as leadership cannot be proven (the
session suspended, or lost), and every write of the plan, the markers, the progress and the
report is fenced by the election node, so a deposed master cannot change the crawl; its
seen-set claims are idempotent, so a late one changes nothing either.
"""

from __future__ import annotations

import time
from typing import Any

import attrs
import trio

from examples.fetch_service.concurrency import map_concurrently
from examples.fetch_service.config import CrawlConfig
from examples.fetch_service.links import InvalidUrlError, canonicalize
from examples.fetch_service.planning import (
    found_links,
    level_stats,
    make_batches,
    redirect_hops,
    total_stats,
)
from examples.fetch_service.state import (
    APP_NAME,
    Batch,
    CrawlPaths,
    Job,
    LevelPlan,
    SeenSet,
    dumps,
    level_name,
    level_of,
    loads,
    read_desired,
    read_job,
)
from framework import errors, single_body_error
from framework.logs import get_logger
from framework.runtime import Master, MasterContext, new_task
from framework.zk import Transaction, wait_exists, watch_data

__all__ = ["CrawlMaster"]

log = get_logger("examples.fetch_service.master")


class CrawlMaster(Master):
    """Leads the crawl of the application's job (see the module doc); returns when done."""

    app_name = APP_NAME

    async def lead(self, ctx: MasterContext) -> None:
        await _Crawl(ctx, self.name).run()


class _Crawl:
    """One term's work.  Holds nothing that is not also in ZooKeeper."""

    def __init__(self, ctx: MasterContext, master: str) -> None:
        self.ctx = ctx
        self.session = ctx.session
        self.paths = CrawlPaths(ctx.app)
        self.seen = SeenSet(ctx.session, self.paths)
        self.master = master
        self.config = CrawlConfig()

    async def run(self) -> None:
        session, paths = self.session, self.paths
        await session.ensure_path(paths.base)
        if await session.exists(paths.report) is not None:
            log.info("crawl.already_finished", app=paths.app.name)
            return
        if await session.exists(paths.job) is None:
            log.info("crawl.waiting_for_job", app=paths.app.name,
                     hint="python -m examples.fetch_service.ctl start ...")
        await wait_exists(session, paths.job)
        job = await read_job(session, paths)
        assert job is not None
        desired = await read_desired(session, paths)
        await self._publish(desired[0] if desired is not None else CrawlConfig())
        with single_body_error():
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._follow_desired)
                await self._crawl(job)
                nursery.cancel_scope.cancel()

    # ------------------------------------------------------------ configuration

    async def _publish(self, config: CrawlConfig) -> None:
        version = await self.ctx.publish_config(config.to_dict())
        self.config = config
        log.info("crawl.config_published", version=version, max_depth=config.max_depth,
                 politeness_delay_s=config.politeness_delay_s, user_agent=config.user_agent)

    async def _follow_desired(self) -> None:
        async for snap in watch_data(self.session, self.paths.desired):
            if snap.data is None:
                continue
            try:
                config = CrawlConfig.from_json(snap.data)
            except errors.ConfigurationError as exc:
                log.error("crawl.bad_config", error=str(exc), kept="the previous one")
                continue
            if config != self.config:
                await self._publish(config)

    # ------------------------------------------------------------ the level loop

    async def _crawl(self, job: Job) -> None:
        plan = await self._resume(job)
        while True:
            await self._send(job, plan)
            await self._progress(job, plan, "fetching")
            await self.ctx.wait_idle()
            results, failures = await self._collect(plan)
            plan = attrs.evolve(plan, stats=level_stats(plan, results, failures))
            await self._commit(lambda t, p=plan: t.set(self.paths.level(p.level),
                                                       dumps(p.header())))
            log.info("crawl.level_done", level=plan.level, urls=plan.urls,
                     errors=plan.stats["errors"] if plan.stats else {},
                     failed_batches=len(failures))
            frontier, cut = await self._next_frontier(plan, results)
            if not frontier:
                await self._finish(job, plan, cut)
                return
            plan = await self._make_plan(job, plan.level + 1, frontier, cut)

    async def _resume(self, job: Job) -> LevelPlan:
        await self.session.ensure_path(self.paths.levels)
        names = await self.session.children(self.paths.levels)
        levels = sorted(n for n in (level_of(name) for name in names) if n is not None)
        if levels:
            plan = await self._load_plan(levels[-1])
            log.info("crawl.resumed", job=job.id, level=plan.level, batches=len(plan.batches))
            return plan
        valid: list[str] = []
        invalid: list[dict[str, str]] = []
        for seed in job.seeds:
            try:
                valid.append(canonicalize(seed))
            except InvalidUrlError as exc:
                log.warning("crawl.bad_seed", seed=seed, error=str(exc))
                invalid.append({"url": seed, "error": str(exc)})
        claimed = await self.seen.claim_many(valid, 0, "seed")
        frontier = [url for url in dict.fromkeys(valid) if claimed[url].depth == 0]
        log.info("crawl.started", job=job.id, seeds=len(frontier), bad_seeds=len(invalid))
        return await self._make_plan(job, 0, frontier, 0, invalid)

    async def _make_plan(self, job: Job, level: int, frontier: list[str], cut: int,
                         invalid: list[dict[str, str]] | None = None) -> LevelPlan:
        paths = self.paths
        batches = make_batches(frontier, self.config.batch_size,
                               id_prefix=f"{job.id}-{level_name(level)}")
        plan = LevelPlan(level, batches, cut, tuple(invalid or ()))
        await self.session.ensure_path(paths.plans)
        stale = [name for name in await self.session.children(paths.plans)
                 if name.startswith(f"{level_name(level)}-")]
        if stale:  # an earlier term died while writing this plan: it was never used
            await self._commit(lambda t: [t.delete(f"{paths.plans}/{n}") for n in stale])
        for number, part in enumerate(plan.parts()):
            blob = dumps([batch.to_dict() for batch in part])
            await self._commit(lambda t, n=number, b=blob: t.create(paths.part(level, n), b))
        await self._commit(lambda t: t.create(paths.level(level), dumps(plan.header())))
        log.info("crawl.level_planned", level=level, urls=plan.urls, batches=len(batches),
                 cut=cut)
        return plan

    async def _load_plan(self, level: int) -> LevelPlan:
        header = loads((await self.session.get(self.paths.level(level)))[0])
        batches: list[Batch] = []
        for number in range(header["parts"]):
            part = loads((await self.session.get(self.paths.part(level, number)))[0])
            batches.extend(Batch.from_dict(doc) for doc in part)
        return LevelPlan(level, tuple(batches), header.get("cut", 0),
                         tuple(header.get("invalid", ())), header.get("stats"))

    async def _send(self, job: Job, plan: LevelPlan) -> None:
        for number, part in enumerate(plan.parts()):
            marker = self.paths.sent(plan.level, number)
            if await self.session.exists(marker) is not None:
                continue
            batches = await self._not_started(part)
            tasks = [new_task(b.payload(job.id, plan.level), task_id=b.id, idempotency_key=b.id)
                     for b in batches]
            if tasks:
                await self.ctx.queue.put_many([task.encode() for task in tasks])
            await self._commit(lambda t, m=marker: t.create(m))
            log.info("crawl.batches_queued", level=plan.level, part=number, batches=len(tasks))

    async def _not_started(self, part: tuple[Batch, ...]) -> list[Batch]:
        """The batches of ``part`` that neither run nor have a result.

        Only an earlier term that died between queueing the part and marking it sent leaves
        any of the part's batches started; the ones it left waiting in the queue are queued
        again (which of them are there cannot be told cheaply): the idempotency key makes
        the second copy a no-op once the first is done, so only two fetchers taking both
        copies at once fetch a batch twice (duplicates that the WARC summary counts).
        """

        async def started(batch: Batch) -> bool:
            return await self.ctx.is_running(batch.id) or (
                await self.ctx.result(batch.id) is not None
            )

        found = await map_concurrently(part, started)
        return [batch for batch in part if not found[batch]]

    async def _collect(self, plan: LevelPlan) -> tuple[dict[str, Any], dict[str, str]]:
        records = await map_concurrently([b.id for b in plan.batches], self.ctx.result)
        results: dict[str, Any] = {}
        failures: dict[str, str] = {}
        for batch_id, record in records.items():
            if record is not None and record.ok:
                results[batch_id] = record.result
            elif record is not None:
                failures[batch_id] = f"batch failed {record.attempts} times: {record.error}"
            else:
                failures[batch_id] = "batch lost: its fetchers died on every delivery"
        return results, failures

    async def _next_frontier(self, plan: LevelPlan,
                             results: dict[str, Any]) -> tuple[list[str], int]:
        """The URLs of level ``plan.level + 1`` (claimed), and how many the budget cut."""
        config, level = self.config, plan.level
        hops = sorted(redirect_hops(results))
        if hops:
            await self.seen.claim_many(hops, level, "hop")
        if level >= config.max_depth:
            return [], 0
        hop_set = set(hops)
        candidates = sorted(u for u in found_links(results)
                            if u not in hop_set and config.allows(u))
        known = await self.seen.get_many(candidates)

        def is_new(url: str) -> bool:
            seen = known[url]
            return seen is None or (seen.depth == level + 1 and seen.kind == "link")

        new = [url for url in candidates if is_new(url)]
        budget = max(config.page_budget - await self._enqueued(level), 0)
        take = new[:budget]
        claimed = await self.seen.claim_many(take, level + 1, "link")
        frontier = [url for url in take
                    if claimed[url].depth == level + 1 and claimed[url].kind == "link"]
        return frontier, len(new) - len(take)

    async def _headers(self, last: int) -> list[dict[str, Any]]:
        async def header(level: int) -> dict[str, Any]:
            return loads((await self.session.get(self.paths.level(level)))[0])

        found = await map_concurrently(range(last + 1), header)
        return [found[level] for level in range(last + 1)]

    async def _enqueued(self, last: int) -> int:
        return sum(h["urls"] for h in await self._headers(last))

    # ------------------------------------------------------------ progress and the end

    async def _progress(self, job: Job, plan: LevelPlan, state: str,
                        extra: dict[str, Any] | None = None) -> None:
        doc = {"job": job.id, "state": state, "level": plan.level, "level_urls": plan.urls,
               "level_batches": len(plan.batches), "enqueued": await self._enqueued(plan.level),
               "master": self.master, "max_depth": self.config.max_depth, "at": time.time()}
        doc |= extra or {}
        exists = await self.session.exists(self.paths.progress) is not None
        await self._commit(lambda t: t.set(self.paths.progress, dumps(doc)) if exists
                           else t.create(self.paths.progress, dumps(doc)))

    async def _finish(self, job: Job, plan: LevelPlan, cut: int) -> None:
        headers = await self._headers(plan.level)
        stats = [h["stats"] for h in headers if h.get("stats")]
        totals = total_stats(stats)
        report = {
            "job": job.id,
            "seeds": list(job.seeds),
            "finished": time.time(),
            "started": job.created,
            "master": self.master,
            "max_depth": self.config.max_depth,
            "page_budget": self.config.page_budget,
            "budget_cut": totals["cut"] + cut,
            "totals": totals,
            "levels": [{k: s[k] for k in ("level", "urls", "ok", "responses", "errors")}
                       for s in stats],
        }
        await self._progress(job, plan, "finished", {"budget_cut": report["budget_cut"]})
        await self._commit(lambda t: t.create(self.paths.report, dumps(report)))
        log.info("crawl.finished", job=job.id, levels=len(stats), urls=totals["urls"],
                 responses=totals["responses"], errors=totals["errors"])

    async def _commit(self, build: Any) -> None:
        def apply(txn: Transaction) -> None:
            build(txn)

        await self.ctx.term.commit(apply)
