"""``python -m examples.fetch_service.ctl``: start a crawl, change its configuration live,
look at it, check its WARC output.

::

    ctl start --zk HOSTS --site-manifest out/site.json [--set max_depth=4 ...]
    ctl start --zk HOSTS --seed http://a.example/ --seed http://b.example/ \
              --set allowed_hosts=a.example,b.example
    ctl set   --zk HOSTS max_depth=3 user_agent="my-bot/2.0"     # applied live
    ctl show  --zk HOSTS [--json]          # job, configuration, progress, fetchers, report
    ctl wait  --zk HOSTS [--timeout 600]   # until the crawl is finished; prints the report
    ctl check --warc out/warc --site-manifest out/site.json [--max-depth 5]
    ctl reset --zk HOSTS [--force]         # forget the job (its seen-set, plans, results)

``--zk`` defaults to ``$FRAMEWORK_ZK_HOSTS``; ``--app`` to ``fetch-service``.  Every user
mistake ends in one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import trio

from examples.fetch_service.config import CrawlConfig
from examples.fetch_service.links import InvalidUrlError, canonicalize
from examples.fetch_service.site import Site
from examples.fetch_service.state import (
    APP_NAME,
    CrawlPaths,
    create_job,
    loads,
    read_desired,
    read_job,
    update_desired,
)
from examples.fetch_service.warc import StoreSummary, summarize
from framework import configure_logging, errors
from framework.cli import add_deadline_argument, one_shot, run_command, zk_hosts_from
from framework.primitives import Group
from framework.runtime import App
from framework.zk import Session, wait_exists

__all__ = ["main", "start_job", "set_config", "crawl_state", "check_warc"]


# ---------------------------------------------------------------- library functions


async def start_job(session: Session, app: App, seeds: Sequence[str], config: CrawlConfig,
                    *, warn: Any = None) -> str:
    """Create the crawl job (seeds + configuration); return its id.

    Seeds that are not crawlable URLs are kept (the crawl reports them as ``invalid_url``
    errors and goes on with the others) but announced through ``warn``; if no seed is
    crawlable, :class:`ConfigurationError` is raised and nothing is written.
    """
    good = 0
    for seed in seeds:
        try:
            canonicalize(seed)
            good += 1
        except InvalidUrlError as exc:
            if warn is not None:
                warn(f"seed {seed!r} cannot be crawled ({exc}); it will be reported as failed")
    if not good:
        raise errors.ConfigurationError("no crawlable seed URL given (need http:// or https://)")
    job = await create_job(session, CrawlPaths(app), seeds, config)
    return job.id


async def set_config(session: Session, app: App,
                     overrides: Sequence[str]) -> tuple[CrawlConfig, CrawlConfig]:
    """Apply ``NAME=VALUE`` overrides to the job's configuration; ``(before, after)``.

    The active master publishes the result to every fetcher (ready-znode protocol); with no
    master running it is published by the next one elected.
    """
    check_overrides(overrides)
    return await update_desired(session, CrawlPaths(app),
                                lambda config: config.with_overrides(overrides))


def check_overrides(overrides: Sequence[str]) -> None:
    """Raise :class:`ConfigurationError` for a missing, unknown or invalid ``NAME=VALUE``."""
    if not overrides:
        raise errors.ConfigurationError("nothing to set: give NAME=VALUE pairs")
    CrawlConfig().with_overrides(overrides)


async def crawl_state(session: Session, app: App) -> dict[str, Any]:
    """Everything ``ctl show`` prints, as one JSON-able document."""
    paths = CrawlPaths(app)
    job = await read_job(session, paths)
    desired = await read_desired(session, paths)
    doc: dict[str, Any] = {
        "app": app.name,
        "job": None if job is None else {"id": job.id, "seeds": list(job.seeds)},
        "config": None if desired is None else desired[0].to_dict(),
        "progress": await _get(session, paths.progress),
        "report": await _get(session, paths.report),
        "leader": None,
        "fetchers": {},
    }
    try:
        leader = loads((await session.get(app.rendezvous))[0])
        doc["leader"] = leader if isinstance(leader, dict) else None
    except errors.NoNodeError:
        pass
    if await session.exists(app.workers) is not None:
        for name, data in (await Group(session, app.workers).members()).items():
            status = loads(data) or {}
            doc["fetchers"][name] = {"state": status.get("state"),
                                     "host": status.get("host"),
                                     **(status.get("health") or {})}
    return doc


async def _get(session: Session, path: str) -> Any:
    try:
        return loads((await session.get(path))[0])
    except errors.NoNodeError:
        return None


async def wait_report(session: Session, app: App) -> dict[str, Any]:
    """Wait (on a watch) until the crawl's final report exists; return it."""
    paths = CrawlPaths(app)
    await session.ensure_path(paths.base)
    await wait_exists(session, paths.report)
    return loads((await session.get(paths.report))[0])


async def reset_job(session: Session, app: App, *, force: bool = False) -> bool:
    """Delete the crawl's state and the runtime's task records; False if nothing was there.

    Refuses (``ConfigurationError``) while a master or a fetcher of the application runs
    (they use those nodes), and while a crawl is unfinished, unless ``force``.
    """
    paths = CrawlPaths(app)
    if await session.exists(paths.base) is None:
        return False
    running = [await _count_children(session, path) for path in (app.masters, app.workers)]
    if any(running):
        raise errors.ConfigurationError(
            f"{running[0]} master(s) and {running[1]} fetcher(s) of {app.name!r} are running; "
            "stop them first (Ctrl-C or SIGTERM)"
        )
    if not force and await session.exists(paths.job) is not None and (
        await session.exists(paths.report) is None
    ):
        raise errors.ConfigurationError(
            f"the crawl of {app.name!r} is not finished; use --force to reset it anyway"
        )
    for path in (paths.base, app.tasks, app.results, app.running, app.dead, app.failures,
                 app.config, app.done):
        await session.delete_tree(path)
    return True


async def _count_children(session: Session, path: str) -> int:
    try:
        return len(await session.children(path))
    except errors.NoNodeError:
        return 0


def check_warc(warc_dirs: Sequence[str | os.PathLike[str]], site: Site,
               max_depth: int) -> list[tuple[str, StoreSummary]]:
    """Summaries of each WARC directory against the site's ground truth at ``max_depth``.

    With several directories (one per fetcher machine), the last entry is the union.
    """
    expected = site.reachable_urls(max_depth)
    out = [(str(d), summarize(d, expected)) for d in warc_dirs]
    if len(out) > 1:
        counts: dict[str, int] = {}
        for _, summary in out:
            for url, count in summary.counts.items():
                counts[url] = counts.get(url, 0) + count
        stored = set(counts)
        out.append(("all", StoreSummary(
            counts=counts, records=sum(counts.values()),
            duplicates=sum(c - 1 for c in counts.values()),
            files=sum(s.files for _, s in out),
            missing=frozenset(expected - stored), unexpected=frozenset(stored - expected),
            damaged=tuple(d for _, s in out for d in s.damaged))))
    return out


# ---------------------------------------------------------------- the command line


def _with_session(args: argparse.Namespace, work: Any, *, deadline: float | None = None) -> Any:
    """Run ``work(session, app)`` within the command's overall deadline (never hangs)."""
    app = App(args.app)
    return one_shot(zk_hosts_from(args.zk), lambda session: work(session, app),
                    chroot=args.chroot, connect_timeout=args.connect_timeout,
                    deadline=deadline or args.timeout)


def _cmd_start(args: argparse.Namespace) -> int:
    seeds = list(args.seed or [])
    config = CrawlConfig()
    if args.site_manifest:
        site = Site.from_manifest(_manifest(args.site_manifest))
        seeds = seeds or list(site.seeds)
        config = config.evolve(allowed_hosts=site.hosts)
    config = config.with_overrides(args.set or [])
    if not seeds:
        raise errors.ConfigurationError("give seed URLs with --seed URL or --site-manifest FILE")

    def warn(message: str) -> None:
        print(f"warning: {message}", file=sys.stderr)

    job_id = _with_session(args, lambda s, app: start_job(s, app, seeds, config, warn=warn))
    print(f"crawl job {job_id} started: {len(seeds)} seed(s), max_depth={config.max_depth}, "
          f"page_budget={config.page_budget}")
    print(f"  allowed hosts: {', '.join(config.allowed_hosts) or 'any'}")
    print("  it runs once a master (framework run examples.fetch_service.app:CrawlMaster) "
          "and fetchers (...:FetchWorker) are up")
    return 0


def _cmd_set(args: argparse.Namespace) -> int:
    check_overrides(args.pairs)  # a bad name or value is reported before connecting
    before, after = _with_session(args, lambda s, app: set_config(s, app, args.pairs))
    old, new = before.to_dict(), after.to_dict()
    changed = [k for k in new if old[k] != new[k]]
    for key in changed:
        print(f"{key}: {old[key]!r} -> {new[key]!r}")
    if not changed:
        print("no change")
    return 0


def _cmd_show(args: argparse.Namespace) -> int:
    state = _with_session(args, crawl_state)
    if args.json:
        print(json.dumps(state, indent=2))
        return 0
    if state["job"] is None:
        print(f"application {state['app']!r} has no crawl job")
        return 1
    print(f"job {state['job']['id']}: {len(state['job']['seeds'])} seed(s)")
    leader = state["leader"] or {}
    print(f"master: {leader.get('name', '(none elected)')}")
    progress = state["progress"] or {}
    if progress:
        print(f"state: {progress['state']}, level {progress['level']} "
              f"({progress['level_urls']} URLs in {progress['level_batches']} batches), "
              f"{progress['enqueued']} URLs enqueued so far")
    config = state["config"] or {}
    print("config: " + ", ".join(f"{k}={config[k]!r}" for k in
                                 ("max_depth", "page_budget", "politeness_delay_s",
                                  "batch_size", "user_agent") if k in config))
    for name, fetcher in sorted(state["fetchers"].items()):
        print(f"  fetcher {name}: {fetcher.get('state')}, {fetcher.get('pages', 0)} pages, "
              f"{fetcher.get('errors', 0)} errors, agent {fetcher.get('user_agent')!r}")
    if state["report"]:
        _print_report(state["report"])
    return 0


def _cmd_wait(args: argparse.Namespace) -> int:
    async def wait(session: Session, app: App) -> Any:
        with trio.fail_after(args.timeout):
            return await wait_report(session, app)

    try:
        report = _with_session(args, wait, deadline=args.timeout + args.connect_timeout)
    except trio.TooSlowError:
        print(f"ctl: the crawl did not finish within {args.timeout:g}s", file=sys.stderr)
        return 1
    _print_report(report)
    return 0


def _cmd_check(args: argparse.Namespace) -> int:
    site = Site.from_manifest(_manifest(args.site_manifest))
    for directory in args.warc:
        if not Path(directory).is_dir():
            raise errors.ConfigurationError(f"no WARC directory at {directory}")
    results = check_warc(args.warc, site, args.max_depth)
    for name, summary in results:
        print(f"{name}: {summary.records} records of {len(summary.counts)} URLs in "
              f"{summary.files} files; duplicates {summary.duplicates}; "
              f"missing {len(summary.missing)}; unexpected {len(summary.unexpected)}"
              + (f"; damaged files {len(summary.damaged)}" if summary.damaged else ""))
    verdict = results[-1][1]
    for url in sorted(verdict.missing)[:20]:
        print(f"  missing: {url}")
    return 0 if verdict.complete else 1


def _cmd_reset(args: argparse.Namespace) -> int:
    done = _with_session(args, lambda s, app: reset_job(s, app, force=args.force))
    print("crawl state deleted" if done else "nothing to reset")
    return 0


def _print_report(report: dict[str, Any]) -> None:
    totals = report["totals"]
    took = report["finished"] - report["started"] if report.get("started") else None
    print(f"finished: {totals['urls']} URLs over {totals['levels']} levels, "
          f"{totals['responses']} responses, {totals['bytes']:,} bytes"
          + (f", in {took:.1f}s" if took is not None else ""))
    if totals["errors"]:
        print("errors: " + ", ".join(f"{k} {v}" for k, v in totals["errors"].items()))
        for sample in totals["samples"][:10]:
            print(f"  {sample['kind']}: {sample['url']}: {sample['error']}")
    if report.get("budget_cut"):
        print(f"page budget: {report['budget_cut']} URLs were not enqueued")


def _manifest(path: str) -> Path:
    manifest = Path(path)
    if not manifest.is_file():
        raise errors.ConfigurationError(f"no site manifest at {path} (the site writes it "
                                        "with --manifest)")
    return manifest


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m examples.fetch_service.ctl",
                                     description="Control the Fetch Service crawler.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    def command(name: str, func: Any, text: str, *, zk: bool = True) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=text, description=text)
        p.set_defaults(func=func)
        if zk:
            p.add_argument("--zk", help="ZooKeeper connect string (default: "
                           "$FRAMEWORK_ZK_HOSTS)")
            p.add_argument("--app", default=APP_NAME, help=f"application (default {APP_NAME})")
            p.add_argument("--chroot", help="ZooKeeper chroot")
            p.add_argument("--connect-timeout", type=float, default=10.0, help="seconds")
            if name != "wait":
                add_deadline_argument(p)
        return p

    p = command("start", _cmd_start, "create the crawl job")
    p.add_argument("--seed", action="append", metavar="URL", help="a seed URL (repeatable)")
    p.add_argument("--site-manifest", metavar="FILE",
                   help="the demo site's manifest: its seeds and hosts (allowed_hosts)")
    p.add_argument("--set", action="append", metavar="NAME=VALUE",
                   help="a configuration setting (repeatable), e.g. max_depth=3")
    p = command("set", _cmd_set, "change the configuration of the running crawl")
    p.add_argument("pairs", nargs="+", metavar="NAME=VALUE")
    p = command("show", _cmd_show, "show the job, its configuration, progress and fetchers")
    p.add_argument("--json", action="store_true")
    p = command("wait", _cmd_wait, "wait until the crawl is finished, print the report")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds (default 3600)")
    p = command("check", _cmd_check, "compare WARC output with the demo site's ground truth",
                zk=False)
    p.add_argument("--warc", action="append", required=True, metavar="DIR",
                   help="a WARC directory (repeat for several fetcher machines)")
    p.add_argument("--site-manifest", required=True, metavar="FILE")
    p.add_argument("--max-depth", type=int, default=CrawlConfig().max_depth)
    p = command("reset", _cmd_reset, "delete the crawl's state (a finished crawl, or --force)")
    p.add_argument("--force", action="store_true")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return run_command("ctl", args.func, args)


if __name__ == "__main__":
    configure_logging(level=os.environ.get("FRAMEWORK_LOG_LEVEL", "warning"))
    sys.exit(main())
