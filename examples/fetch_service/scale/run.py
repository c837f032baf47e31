"""One command for a whole crawl of the large generated site, in separate processes.

``python -m examples.fetch_service.scale.run --pages 200000`` starts (unless
``$FRAMEWORK_ZK_HOSTS`` names an ensemble) an embedded ZooKeeper, the lazy site
(:mod:`examples.fetch_service.lazysite`), one master and ``--fetchers`` fetchers (each with its
own WARC and local directories, as if on its own machine), shows progress every few seconds
(pages, pages/s, ZooKeeper znodes and writes/s from ``mntr``), optionally kills a fetcher
with ``kill -9`` part-way (``--kill-at 0.5``) and starts a replacement, and at the end checks
every WARC directory against the site's ground truth: missing pages, unexpected ones (a
``/private/`` page means robots.txt was not obeyed), duplicates.

``--design levels`` runs the same crawl with the level-by-level design (seen-set, plans and
a politeness lock per request in ZooKeeper): the baseline of ``bench/crawl.py``.

Exit status: 0 when every expected page is stored and nothing else, 1 otherwise, 2 for a
user mistake.  :func:`run_crawl` is the same as a function (the bench and tests use it).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import trio

from examples.fetch_service import ctl
from examples.fetch_service.config import CrawlConfig
from examples.fetch_service.demo import Processes, _exit_code, _read_until_ready
from examples.fetch_service.lazysite import LazySite
from examples.fetch_service.scale import layout
from examples.fetch_service.state import APP_NAME as LEVELS_APP
from examples.fetch_service.state import CrawlPaths
from examples.fetch_service.warc import iter_stored
from framework import (
    ConfigurationError,
    FrameworkError,
    NoNodeError,
    ZooKeeperEnsemble,
    configure_logging,
)
from framework.primitives import Group
from framework.runtime import App
from framework.zk import Session, wait_exists
from framework.zkserver import four_letter

__all__ = ["RunOptions", "RunResult", "count_znodes", "mntr", "run_crawl"]

DESIGNS = {
    "partitioned": (layout.APP_NAME, "PartitionMaster", "PartitionFetcher"),
    "levels": (LEVELS_APP, "CrawlMaster", "FetchWorker"),
}


#: The ground truth is every page: the partitioned crawl is not breadth-first, so a page can
#: first be reached by a longer path than its shortest one; no depth limit may cut it.
NO_DEPTH_LIMIT = 1_000_000


@attrs.frozen(kw_only=True)
class RunOptions:
    design: str = "partitioned"
    pages: int = 10_000
    hosts: int = 32
    fetchers: int = 4
    partitions: int = 8
    politeness: float = 0.0
    checkpoint_interval: float = 1.0
    kill_at: float = 0.0  # kill -9 one fetcher at this fraction of the pages (0: never)
    session_timeout: float = 3.0
    timeout: float = 3600.0
    out: Path = Path("out/crawl")
    progress: Callable[[str], None] | None = None
    zk: str | None = None  # an existing ensemble (default: $FRAMEWORK_ZK_HOSTS or embedded)

    def check(self) -> None:
        if self.design not in DESIGNS:
            raise ConfigurationError(f"design must be one of {', '.join(DESIGNS)}, "
                                     f"got {self.design!r}")
        if self.pages < 2 or self.hosts < 1 or self.fetchers < 1 or self.partitions < 1:
            raise ConfigurationError("pages >= 2, hosts >= 1, fetchers >= 1, partitions >= 1")
        if not 0 <= self.kill_at < 1:
            raise ConfigurationError(f"kill_at must be in [0, 1), got {self.kill_at}")
        if self.politeness < 0:
            raise ConfigurationError(f"politeness must be >= 0, got {self.politeness}")


@attrs.frozen(kw_only=True)
class RunResult:
    design: str
    expected: int
    stored: int
    missing: int
    unexpected: int
    duplicates: int
    seconds: float
    znodes_before: int
    znodes_peak: int
    znodes_after: int
    app_znodes: int
    writes: int
    killed: str | None
    missing_sample: tuple[str, ...] = ()
    unexpected_sample: tuple[str, ...] = ()

    @property
    def pages_per_s(self) -> float:
        return self.stored / self.seconds if self.seconds else 0.0

    @property
    def writes_per_s(self) -> float:
        return self.writes / self.seconds if self.seconds else 0.0

    @property
    def ok(self) -> bool:
        return self.missing == 0 and self.unexpected == 0

    def to_dict(self) -> dict[str, Any]:
        return attrs.asdict(self) | {"pages_per_s": round(self.pages_per_s, 1),
                                     "writes_per_s": round(self.writes_per_s, 1), "ok": self.ok}


def mntr(hosts: str) -> dict[str, str]:
    """The first server's ``mntr`` answer as a dict."""
    host, _, port = hosts.split(",")[0].rpartition(":")
    text = four_letter(int(port), "mntr", host=host or "127.0.0.1")
    return dict(line.split("\t", 1) for line in text.splitlines() if "\t" in line)


def _zk_numbers(hosts: str) -> tuple[int, int]:
    """``(znode count, writes so far)`` of the server (``zk_cnt_updatelatency`` counts every
    write request it applied)."""
    values = mntr(hosts)
    return int(values.get("zk_znode_count", 0)), int(values.get("zk_cnt_updatelatency", 0))


async def count_znodes(session: Session, path: str) -> int:
    """Znodes at and below ``path`` (walks the tree; an ephemeral node that goes while it
    is walked - a process leaving - is not counted)."""
    try:
        children = await session.children(path)
    except NoNodeError:
        return 0
    total = 1
    for child in children:
        total += await count_znodes(session, f"{path.rstrip('/')}/{child}")
    return total


@asynccontextmanager
async def _zookeeper(given: str | None) -> AsyncIterator[str]:
    hosts = given or os.environ.get("FRAMEWORK_ZK_HOSTS")
    if hosts:
        yield hosts
        return
    server = ZooKeeperEnsemble(1)
    server.start()
    try:
        yield server.connect_string
    finally:
        server.stop()


class _Crawl:
    def __init__(self, options: RunOptions, zk: str) -> None:
        self.options = options
        self.zk = zk
        self.chroot = f"/crawl-{uuid.uuid4().hex[:8]}"
        self.out = options.out.resolve()
        self.procs = Processes(self.out / "logs")
        self.app_name, self.master_class, self.fetcher_class = DESIGNS[options.design]
        self.app = App(self.app_name)
        self.killed: str | None = None
        self.next_fetcher = 1
        self.peak = 0
        self.pages: dict[str, int] = {}
        self.live = 0

    def say(self, text: str) -> None:
        if self.options.progress is not None:
            self.options.progress(text)

    def spawn(self, role: str, name: str) -> None:
        env = {"FETCH_WARC_DIR": str(self.out / "warc" / name),
               "FETCH_LOCAL_DIR": str(self.out / "local" / name),
               "FRAMEWORK_LOG_LEVEL": "warning"}
        self.procs.spawn(name, [
            "-m", "framework", "run", f"examples.fetch_service.app:{role}", "--zk", self.zk,
            "--chroot", self.chroot, "--name", name,
            "--session-timeout", str(self.options.session_timeout)], env=env)

    def spawn_fetcher(self) -> str:
        name = f"fetcher-{self.next_fetcher}"
        self.next_fetcher += 1
        self.spawn(self.fetcher_class, name)
        return name

    async def start_site(self) -> LazySite:
        options = self.options
        manifest = self.out / "site.json"
        proc = self.procs.spawn("site", [
            "-m", "examples.fetch_service.lazysite", "--pages", str(options.pages),
            "--hosts", str(options.hosts), "--manifest", str(manifest)],
            stdout=subprocess.PIPE)
        assert proc.stdout is not None
        ready = False
        with trio.move_on_after(30):
            ready = await trio.to_thread.run_sync(_read_until_ready, proc.stdout,
                                                  abandon_on_cancel=True)
        if not ready:
            raise FrameworkError("the site did not start:\n" + self.procs.log_tail("site"))
        return LazySite.from_manifest(manifest)

    async def start_job(self, session: Session, site: LazySite) -> None:
        options = self.options
        config = CrawlConfig(politeness_delay_s=options.politeness,
                             max_depth=NO_DEPTH_LIMIT, page_budget=10 * options.pages,
                             request_timeout_s=10.0, batch_size=10, fetch_concurrency=8,
                             allowed_hosts=site.hosts, warc_max_bytes=20_000_000)
        if options.design == "partitioned":
            await layout.start_job(session, self.app, site.seeds, config,
                                   shared=self.out / "shared", partitions=options.partitions,
                                   checkpoint_interval_s=options.checkpoint_interval)
        else:
            await ctl.start_job(session, self.app, site.seeds, config)

    def report_path(self) -> str:
        if self.options.design == "partitioned":
            return layout.ScalePaths(self.app).report
        return CrawlPaths(self.app).report

    async def show_progress(self, session: Session, expected: int, started: float,
                            writes_before: int) -> None:
        """A progress line every 2 s, and the peak znode count."""
        last_pages, last_at = 0, started
        while True:
            await trio.sleep(2.0)  # the progress period, not synchronisation
            znodes, writes = await trio.to_thread.run_sync(_zk_numbers, self.zk)
            self.peak = max(self.peak, znodes)
            now = time.monotonic()
            pages = sum(self.pages.values())
            rate = (pages - last_pages) / (now - last_at) if now > last_at else 0.0
            last_pages, last_at = pages, now
            self.say(f"{now - started:6.0f}s  pages {pages:>7}/{expected} ({rate:6.0f}/s)  "
                     f"znodes {znodes}  writes/s {(writes - writes_before) / (now - started):.1f}"
                     f"  fetchers {self.live}")

    async def follow_fetchers(self, session: Session, expected: int) -> None:
        """Pages per fetcher from their status nodes (a watch); the kill -9 when due."""
        options = self.options
        async for members in Group(session, self.app.workers).watch():
            self.live = len(members)
            for name, data in members.items():
                try:
                    self.pages[name] = int(json.loads(data).get("health", {}).get("pages", 0))
                except (ValueError, AttributeError):
                    continue
            pages = sum(self.pages.values())  # a killed fetcher's pages still count
            if options.kill_at and self.killed is None and pages >= options.kill_at * expected:
                victim = "fetcher-1"
                proc = self.procs.procs[victim]
                proc.kill()
                await trio.to_thread.run_sync(proc.wait)
                self.killed = victim
                replacement = self.spawn_fetcher()
                self.say(f"kill -9 {victim} (pid {proc.pid}) at {pages} pages; "
                         f"{replacement} started in its place")

    async def stop(self) -> None:
        for name, proc in self.procs.procs.items():
            if name != "site" and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for name, proc in self.procs.procs.items():
            if name != "site":
                await _exit_code(proc, 30.0)
        site = self.procs.procs["site"]
        site.send_signal(signal.SIGTERM)
        await _exit_code(site, 10.0)


def _stored(warc_root: Path) -> Counter[str]:
    counts: Counter[str] = Counter()
    if warc_root.is_dir():
        for directory in sorted(warc_root.iterdir()):
            counts.update(url for url, _digest in iter_stored(directory))
    return counts


async def run_crawl(options: RunOptions) -> RunResult:
    """Run one whole crawl (see the module doc) and check its output."""
    options.check()
    out = options.out.resolve()
    for sub in ("warc", "logs", "local", "shared"):
        shutil.rmtree(out / sub, ignore_errors=True)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    async with _zookeeper(options.zk) as zk:
        crawl = _Crawl(options, zk)
        try:
            site = await crawl.start_site()
            expected = site.expected_urls(obey_robots=options.design == "partitioned")
            znodes_before, writes_before = await trio.to_thread.run_sync(_zk_numbers, zk)
            crawl.peak = znodes_before
            async with Session(zk, chroot=crawl.chroot, session_timeout=10.0) as session:
                started = time.monotonic()
                await crawl.start_job(session, site)
                crawl.spawn(crawl.master_class, "master-1")
                for _ in range(options.fetchers):
                    crawl.spawn_fetcher()
                crawl.say(f"{options.design}: {len(expected)} expected pages on "
                          f"{options.hosts} hosts, {options.fetchers} fetchers"
                          + (f", {options.partitions} partitions" if options.design ==
                             "partitioned" else ""))
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(crawl.show_progress, session, len(expected), started,
                                       writes_before)
                    nursery.start_soon(crawl.follow_fetchers, session, len(expected))
                    with trio.move_on_after(options.timeout) as waited:
                        await session.ensure_path(crawl.report_path().rpartition("/")[0])
                        await wait_exists(session, crawl.report_path())
                    nursery.cancel_scope.cancel()
                if waited.cancelled_caught:
                    raise FrameworkError(f"the crawl did not finish within {options.timeout:g}s;"
                                         f" see {out / 'logs'}")
                seconds = time.monotonic() - started
                znodes_after, writes_after = await trio.to_thread.run_sync(_zk_numbers, zk)
                app_znodes = await count_znodes(session, "/")
            await crawl.stop()
        finally:
            crawl.procs.stop_all()
    stored = await trio.to_thread.run_sync(_stored, out / "warc")
    missing = sorted(expected - set(stored))
    unexpected = sorted(set(stored) - expected)
    result = RunResult(
        design=options.design, expected=len(expected), stored=len(set(stored) & expected),
        missing=len(missing), unexpected=len(unexpected),
        duplicates=sum(stored.values()) - len(stored), seconds=round(seconds, 2),
        znodes_before=znodes_before, znodes_peak=max(crawl.peak, znodes_after),
        znodes_after=znodes_after, app_znodes=app_znodes, writes=writes_after - writes_before,
        killed=crawl.killed, missing_sample=tuple(missing[:5]),
        unexpected_sample=tuple(unexpected[:5]))
    (out / "result.json").write_text(json.dumps(result.to_dict(), indent=2) + "\n")
    return result


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m examples.fetch_service.scale.run",
                                description="Crawl the large generated site end to end.")
    p.add_argument("--design", choices=sorted(DESIGNS), default="partitioned")
    p.add_argument("--pages", type=int, default=200_000)
    p.add_argument("--hosts", type=int, default=32)
    p.add_argument("--fetchers", type=int, default=4)
    p.add_argument("--partitions", type=int, default=8)
    p.add_argument("--politeness", type=float, default=0.0, help="seconds between two "
                   "requests to one host (default 0)")
    p.add_argument("--checkpoint-interval", type=float, default=1.0)
    p.add_argument("--kill-at", type=float, default=0.0,
                   help="kill -9 fetcher-1 at this fraction of the pages (default: never)")
    p.add_argument("--session-timeout", type=float, default=3.0)
    p.add_argument("--timeout", type=float, default=3600.0)
    p.add_argument("--out", type=Path, default=Path("out/crawl"))
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging(level=os.environ.get("FRAMEWORK_DEMO_LOG_LEVEL", "error"))
    options = RunOptions(
        design=args.design, pages=args.pages, hosts=args.hosts, fetchers=args.fetchers,
        partitions=args.partitions, politeness=args.politeness,
        checkpoint_interval=args.checkpoint_interval, kill_at=args.kill_at,
        session_timeout=args.session_timeout, timeout=args.timeout, out=args.out,
        progress=lambda text: print(text, file=sys.stderr, flush=True))
    try:
        options.check()
        result = trio.run(run_crawl, options)
    except ConfigurationError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except FrameworkError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        doc = result.to_dict()
        print(f"{result.design}: {result.stored}/{result.expected} pages in {result.seconds:.1f}s "
              f"({doc['pages_per_s']} pages/s); missing {result.missing}, unexpected "
              f"{result.unexpected}, duplicates {result.duplicates}"
              + (f" (after kill -9 of {result.killed})" if result.killed else ""))
        print(f"ZooKeeper: znodes {result.znodes_before} before, {result.znodes_peak} at peak, "
              f"{result.app_znodes} under the crawl's chroot at the end; "
              f"{result.writes} writes ({doc['writes_per_s']}/s)")
        for url in result.missing_sample:
            print(f"  missing: {url}")
        for url in result.unexpected_sample:
            print(f"  unexpected: {url}")
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
