"""One command for a whole crawl of the generated site, every piece in its own process.

``python -m examples.fetch_service.scale.run --pages 200000`` starts (unless
``$FRAMEWORK_ZK_HOSTS`` names an ensemble) an embedded ZooKeeper, the lazy site
(:mod:`examples.fetch_service.lazysite`), ``--masters`` masters (the first leads, the others
stand by) and ``--fetchers`` fetchers (each with its own WARC and local directories, as if on
its own machine), shows progress every 2 s (pages, pages/s, ZooKeeper znodes and writes/s
from ``mntr``), optionally kills the active master (``--kill-master-at``) and a fetcher
(``--kill-at``, a replacement is started) with ``kill -9`` part-way, and at the end checks
every WARC directory against the site's ground truth: missing pages, unexpected ones (a
``/private/`` page means robots.txt was not obeyed), responses that differ from what the site
serves, duplicates.

Exit status: 0 when every expected page is stored as served and nothing else, 1 otherwise, 2
for a user mistake.  :func:`run_crawl` is the same as a function (``make demo``, the bench and
the tests use it).  Children are started with :func:`framework.testing.spawn`: they die with
this process, and each writes ``<out>/logs/<name>.log``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import trio

from examples.fetch_service.config import CrawlConfig
from examples.fetch_service.lazysite import LazySite
from examples.fetch_service.scale import layout
from examples.fetch_service.scale.worker import FetcherStatus
from examples.fetch_service.warc import iter_stored
from framework import (
    ConfigurationError,
    FrameworkError,
    NoNodeError,
    ZooKeeperEnsemble,
    configure_logging,
    records,
)
from framework.logs import get_logger
from framework.primitives import Group, Rendezvous
from framework.runtime import App
from framework.testing import Child, spawn
from framework.zk import Session, wait_exists, watch_children
from framework.zkserver import four_letter

__all__ = ["RunOptions", "RunResult", "count_znodes", "mntr", "run_crawl"]

log = get_logger("examples.fetch_service.scale.run")

ROOT = Path(__file__).resolve().parents[3]

#: The ground truth is every page: the partitioned crawl is not breadth-first, so a page can
#: first be reached by a longer path than its shortest one; no depth limit may cut it.
NO_DEPTH_LIMIT = 1_000_000


@attrs.frozen(kw_only=True)
class RunOptions:
    """One crawl's set-up; :meth:`check` raises :class:`ConfigurationError` for a bad one."""

    pages: int = 10_000
    hosts: int = 32
    fetchers: int = 4
    masters: int = 1
    partitions: int = 8
    politeness: float = 0.0
    checkpoint_interval: float = 1.0
    kill_at: float = 0.0  # kill -9 fetcher-1 at this fraction of the pages (0: never)
    kill_master_at: float = 0.0  # kill -9 the active master at this fraction (0: never)
    session_timeout: float = 3.0
    timeout: float = 3600.0
    out: Path = Path("out/crawl")
    #: the job's shared store (a URL: file://, s3://bucket/prefix; default <out>/shared)
    shared: str | None = None
    progress: Callable[[str], None] | None = None
    zk: str | None = None  # an existing ensemble (default: $FRAMEWORK_ZK_HOSTS or embedded)

    def check(self) -> None:
        if self.pages < 2 or self.hosts < 1 or self.fetchers < 1 or self.partitions < 1:
            raise ConfigurationError("pages >= 2, hosts >= 1, fetchers >= 1, partitions >= 1")
        if self.masters < 1:
            raise ConfigurationError(f"masters must be >= 1, got {self.masters}")
        for name in ("kill_at", "kill_master_at"):
            if not 0 <= getattr(self, name) < 1:
                raise ConfigurationError(f"{name} must be in [0, 1), got {getattr(self, name)}")
        if self.kill_master_at and self.masters < 2:
            raise ConfigurationError("kill_master_at needs a standby: masters >= 2")
        if self.politeness < 0:
            raise ConfigurationError(f"politeness must be >= 0, got {self.politeness}")


@attrs.frozen(kw_only=True)
class RunResult:
    """What one crawl did, checked against the site's ground truth."""

    expected: int
    stored: int
    missing: int
    unexpected: int
    differing: int  # stored responses whose payload is not what the site serves
    duplicates: int
    seconds: float
    znodes_before: int
    znodes_peak: int
    znodes_after: int
    app_znodes: int
    writes: int
    killed: str | None
    replacement: str | None = None
    killed_master: str | None = None
    report_master: str | None = None
    failover_s: float | None = None
    missing_sample: tuple[str, ...] = ()
    unexpected_sample: tuple[str, ...] = ()
    quarantined: tuple[str, ...] = ()  # inbox files set aside as unreadable (the report's)

    @property
    def pages_per_s(self) -> float:
        return self.stored / self.seconds if self.seconds else 0.0

    @property
    def writes_per_s(self) -> float:
        return self.writes / self.seconds if self.seconds else 0.0

    @property
    def ok(self) -> bool:
        return self.missing == 0 and self.unexpected == 0 and self.differing == 0

    def to_dict(self) -> dict[str, Any]:
        """The result as plain values (``result.json``), with its rates and ``ok``."""
        return records.unstructure(self) | {"pages_per_s": round(self.pages_per_s, 1),
                                            "writes_per_s": round(self.writes_per_s, 1),
                                            "ok": self.ok}


@attrs.frozen
class LeaderName:
    """What the run reads of the rendezvous record (the runtime's master identity)."""

    name: str = ""


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
async def _zookeeper(given: str | None, chroot: str) -> AsyncIterator[str]:
    """The connect string: an embedded server for the block, or the given ensemble, whose
    ``chroot`` is deleted at the end (by then every process of the crawl is gone)."""
    hosts = given or os.environ.get("FRAMEWORK_ZK_HOSTS")
    if hosts:
        try:
            yield hosts
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(15):
                async with Session(hosts) as session:
                    await session.delete_tree(chroot)
        return
    server = ZooKeeperEnsemble(1)
    server.start()  # on trio's thread: the server dies with the thread that started it
    try:
        yield server.connect_string
    finally:
        server.stop()


class _Crawl:
    """The processes of one crawl and what is seen of them while it runs."""

    def __init__(self, options: RunOptions, zk: str, chroot: str, stack: AsyncExitStack) -> None:
        self.options = options
        self.zk = zk
        self.stack = stack
        self.chroot = chroot
        self.out = options.out.resolve()
        self.app = App(layout.APP_NAME)
        self.children: dict[str, Child] = {}
        self.killed: str | None = None
        self.replacement: str | None = None
        self.killed_master: str | None = None
        self.killed_master_at: float | None = None
        self.failover_s: float | None = None
        self.leader: str | None = None
        self.leading = trio.Event()
        self.next_fetcher = 1
        self.peak = 0
        self.pages: dict[str, int] = {}
        self.live = 0
        self.expected = 0

    def say(self, text: str) -> None:
        if self.options.progress is not None:
            self.options.progress(text)

    async def start(self, name: str, argv: list[str], *, pipe_stdout: bool = False,
                    env: dict[str, str] | None = None) -> Child:
        child = await self.stack.enter_async_context(spawn(
            [sys.executable, *argv], name=name, log_dir=self.out / "logs",
            pipe_stdout=pipe_stdout, cwd=ROOT,
            env={"PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT),
                                                            os.environ.get("PYTHONPATH")])),
                 **(env or {})}))
        self.children[name] = child
        return child

    async def start_role(self, role: str, name: str) -> Child:
        env = {"FETCH_WARC_DIR": str(self.out / "warc" / name),
               "FETCH_LOCAL_DIR": str(self.out / "local" / name),
               "FRAMEWORK_LOG_LEVEL": "warning"}
        return await self.start(name, [
            "-m", "framework", "run", f"examples.fetch_service.app:{role}", "--zk", self.zk,
            "--chroot", self.chroot, "--name", name,
            "--session-timeout", str(self.options.session_timeout)], env=env)

    async def start_fetcher(self) -> str:
        name = f"fetcher-{self.next_fetcher}"
        self.next_fetcher += 1
        await self.start_role("PartitionFetcher", name)
        return name

    async def start_site(self) -> LazySite:
        options = self.options
        manifest = self.out / "site.json"
        child = await self.start("site", [
            "-m", "examples.fetch_service.lazysite", "--pages", str(options.pages),
            "--hosts", str(options.hosts), "--manifest", str(manifest)], pipe_stdout=True)
        assert child.lines is not None
        try:
            with trio.fail_after(30):
                await child.lines.until(lambda line: line == "READY")
        except (EOFError, trio.TooSlowError):
            raise FrameworkError("the site did not start:\n" + child.log()[-2000:]) from None
        return LazySite.from_manifest(manifest)

    async def start_job(self, session: Session, site: LazySite) -> None:
        options = self.options
        config = CrawlConfig(politeness_delay_s=options.politeness,
                             max_depth=NO_DEPTH_LIMIT, request_timeout_s=10.0,
                             fetch_concurrency=8,
                             allowed_hosts=site.hosts, warc_max_bytes=20_000_000)
        await layout.start_job(session, self.app, site.seeds, config,
                               shared=options.shared or self.out / "shared",
                               partitions=options.partitions,
                               checkpoint_interval_s=options.checkpoint_interval)

    async def start_masters(self, session: Session) -> None:
        """master-1, and once it leads the standbys (so master-1 is the first leader)."""
        await self.start_role("PartitionMaster", "master-1")
        with trio.move_on_after(60):
            await self.leading.wait()
        if not self.leading.is_set():
            raise FrameworkError("master-1 was not elected within 60s:\n"
                                 + self.children["master-1"].log()[-2000:])
        for n in range(2, self.options.masters + 1):
            await self.start_role("PartitionMaster", f"master-{n}")
        if self.options.masters > 1:
            await session.ensure_path(self.app.masters)
            with trio.fail_after(60):
                async for snap in watch_children(session, self.app.masters):
                    if len(snap.children) >= self.options.masters:  # all in line
                        break

    async def follow_leader(self, session: Session) -> None:
        """Who leads (the runtime's rendezvous node), and the failover after the kill."""
        async for data in Rendezvous(session, self.app.rendezvous).watch():
            name = _leader_name(data)
            if name == self.leader:
                continue
            self.leader = name
            if name is None:
                continue
            self.leading.set()
            if self.killed_master_at is not None and self.failover_s is None:
                self.failover_s = time.monotonic() - self.killed_master_at
                self.say(f"failover: {name} leads {self.failover_s:.1f}s after the kill "
                         f"(session timeout {self.options.session_timeout:g}s); it resumes "
                         "from the partition records")
            else:
                self.say(f"{name} is the active master")

    async def show_progress(self, started: float, writes_before: int) -> None:
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
            self.say(f"{now - started:6.0f}s  pages {pages:>7}/{self.expected} "
                     f"({rate:6.0f}/s)  znodes {znodes}  writes/s "
                     f"{(writes - writes_before) / (now - started):.1f}  fetchers {self.live}"
                     f"  master {self.leader or '-'}")

    async def follow_fetchers(self, session: Session) -> None:
        """Pages per fetcher from their status nodes (a watch); the kills when due."""
        await session.ensure_path(self.app.workers)
        async for members in Group(session, self.app.workers).watch():
            self.live = len(members)
            for name, data in members.items():
                try:
                    self.pages[name] = records.decode(data, FetcherStatus).health.pages
                except records.CorruptRecord:
                    continue  # not a fetcher's status (yet): its pages count when it is
            await self.maybe_kill(sum(self.pages.values()))  # a killed fetcher's pages count

    async def maybe_kill(self, pages: int) -> None:
        options = self.options
        due = options.kill_master_at * self.expected
        if options.kill_master_at and self.killed_master is None and pages >= due \
                and self.leader is not None:
            victim = self.children[self.leader]
            victim.kill()
            await victim.wait()
            self.killed_master, self.killed_master_at = victim.name, time.monotonic()
            log.info("crawl.master_killed", master=victim.name, pages=pages)
            self.say(f"kill -9 {victim.name} (pid {victim.pid}), the active master, at "
                     f"{pages} pages; a standby leads once its session expires")
        if options.kill_at and self.killed is None and pages >= options.kill_at * self.expected:
            victim = self.children["fetcher-1"]
            victim.kill()
            await victim.wait()
            self.killed = victim.name
            self.replacement = await self.start_fetcher()
            log.info("crawl.fetcher_killed", fetcher=victim.name, pages=pages)
            self.say(f"kill -9 {victim.name} (pid {victim.pid}) at {pages} pages; "
                     f"{self.replacement} started in its place")

    async def stop(self) -> None:
        """SIGTERM the fetchers (they publish a last checkpoint and leave); the masters end
        by themselves once the report is written; then the site.  Whatever is still running
        after 30 s is killed when the stack closes."""
        with trio.move_on_after(30):
            for name, child in self.children.items():
                if name != "site":
                    child.terminate()
            for name, child in self.children.items():
                if name != "site":
                    await child.wait()
        site = self.children["site"]
        site.terminate()
        with trio.move_on_after(10):
            await site.wait()


def _leader_name(data: bytes | None) -> str | None:
    """The leader's name in a rendezvous record (``None``: no leader, or not readable)."""
    if not data:
        return None
    try:
        return records.decode(data, LeaderName).name or None
    except records.CorruptRecord as exc:
        log.warning("crawl.rendezvous_corrupt", error=str(exc))
        return None


def _stored(warc_root: Path) -> Counter[tuple[str, str]]:
    """``(url, payload digest)`` of every stored response, with its count."""
    counts: Counter[tuple[str, str]] = Counter()
    if warc_root.is_dir():
        for directory in sorted(warc_root.iterdir()):
            counts.update(iter_stored(directory))
    return counts


async def run_crawl(options: RunOptions) -> RunResult:
    """Run one whole crawl (see the module doc) and check its output against the site.

    Returns the :class:`RunResult` whether or not the checks pass (see :attr:`RunResult.ok`
    and :func:`checks`).  Raises :class:`ConfigurationError` for bad ``options``, and
    :class:`FrameworkError` with the reason (and the tail of the process's log) when the
    site does not start, master-1 is not elected, or the crawl does not finish within
    ``options.timeout``.  Its own ZooKeeper session writes the job and then only watches
    (nothing of the crawl depends on it): SUSPENDED or LOST delays what it sees (progress,
    the kills, the report), its watches are set again once connected, and a plain request
    in flight then may raise :class:`~framework.errors.ConnectionLossError` or
    :class:`~framework.errors.SessionExpiredError`.  Every process it started is gone when
    it returns or raises.
    """
    options.check()
    out = options.out.resolve()
    for sub in ("warc", "logs", "local", "shared"):
        shutil.rmtree(out / sub, ignore_errors=True)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    chroot = f"/crawl-{uuid.uuid4().hex[:8]}"
    async with _zookeeper(options.zk, chroot) as zk, AsyncExitStack() as stack:
        crawl = _Crawl(options, zk, chroot, stack)
        site = await crawl.start_site()
        expected = site.expected_urls()
        crawl.expected = len(expected)
        znodes_before, writes_before = await trio.to_thread.run_sync(_zk_numbers, zk)
        crawl.peak = znodes_before
        async with Session(zk, chroot=crawl.chroot, session_timeout=10.0) as session:
            started = time.monotonic()
            await crawl.start_job(session, site)
            report_path = layout.ScalePaths(crawl.app).report
            crawl.say(f"{len(expected)} expected pages on {options.hosts} hosts; "
                      f"{options.masters} master(s), {options.fetchers} fetchers, "
                      f"{options.partitions} partitions")
            async with trio.open_nursery() as nursery:
                nursery.start_soon(crawl.follow_leader, session)
                await crawl.start_masters(session)
                for _ in range(options.fetchers):
                    await crawl.start_fetcher()
                nursery.start_soon(crawl.show_progress, started, writes_before)
                nursery.start_soon(crawl.follow_fetchers, session)
                with trio.move_on_after(options.timeout) as waited:
                    await session.ensure_path(report_path.rpartition("/")[0])
                    await wait_exists(session, report_path)
                nursery.cancel_scope.cancel()
            if waited.cancelled_caught:
                raise FrameworkError(f"the crawl did not finish within {options.timeout:g}s;"
                                     f" see {out / 'logs'}")
            seconds = time.monotonic() - started
            report = records.decode((await session.get(report_path))[0], layout.CrawlReport)
            znodes_after, writes_after = await trio.to_thread.run_sync(_zk_numbers, zk)
            app_znodes = await count_znodes(session, "/")
        await crawl.stop()
    stored = await trio.to_thread.run_sync(_stored, out / "warc")
    urls = Counter(url for url, _digest in stored.elements())
    missing = sorted(expected - set(urls))
    unexpected = sorted(set(urls) - expected)
    differing = sum(1 for (url, digest) in stored
                    if url in expected and digest != site.digest_of(url))
    result = RunResult(
        expected=len(expected), stored=len(set(urls) & expected), missing=len(missing),
        unexpected=len(unexpected), differing=differing,
        duplicates=sum(urls.values()) - len(urls), seconds=round(seconds, 2),
        znodes_before=znodes_before, znodes_peak=max(crawl.peak, znodes_after),
        znodes_after=znodes_after, app_znodes=app_znodes, writes=writes_after - writes_before,
        killed=crawl.killed, replacement=crawl.replacement, killed_master=crawl.killed_master,
        report_master=report.master,
        failover_s=None if crawl.failover_s is None else round(crawl.failover_s, 2),
        missing_sample=tuple(missing[:5]), unexpected_sample=tuple(unexpected[:5]),
        quarantined=report.quarantined)
    (out / "result.json").write_text(json.dumps(result.to_dict(), indent=2) + "\n")
    return result


def build_parser(prog: str = "python -m examples.fetch_service.scale.run",
                 **defaults: Any) -> argparse.ArgumentParser:
    """The command line (``defaults`` overrides the defaults: ``make demo`` uses this)."""
    p = argparse.ArgumentParser(prog=prog,
                                description="Crawl the generated site end to end, each piece "
                                "its own process, and check the output against the site.")
    p.add_argument("--pages", type=int, default=200_000)
    p.add_argument("--hosts", type=int, default=32)
    p.add_argument("--fetchers", type=int, default=4)
    p.add_argument("--masters", type=int, default=1, help="masters (the others stand by)")
    p.add_argument("--partitions", type=int, default=8)
    p.add_argument("--politeness", type=float, default=0.0, help="seconds between two "
                   "requests to one host (default 0)")
    p.add_argument("--checkpoint-interval", type=float, default=1.0)
    p.add_argument("--kill-at", type=float, default=0.0,
                   help="kill -9 fetcher-1 at this fraction of the pages (default: never)")
    p.add_argument("--kill-master-at", type=float, default=0.0,
                   help="kill -9 the active master at this fraction (default: never)")
    p.add_argument("--session-timeout", type=float, default=3.0)
    p.add_argument("--timeout", type=float, default=3600.0)
    p.add_argument("--out", type=Path, default=Path("out/crawl"))
    p.add_argument("--shared", default=None, metavar="URL",
                   help="the job's shared store: a path or file:// URL every host mounts, or "
                        "s3://bucket/prefix (default: <out>/shared)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(**defaults)
    return p


def checks(result: RunResult, options: RunOptions) -> list[tuple[bool, str]]:
    """The end-of-crawl checks as ``(passed, line)``."""
    lines = [
        (result.missing == 0, f"every expected URL stored: {result.stored}/{result.expected} "
                              f"(every page, and every /gone/ link as its 404)"),
        (result.unexpected == 0, f"nothing else stored: {result.unexpected} unexpected "
                                 "(no /private/ page: robots.txt obeyed)"),
        (result.differing == 0, f"every stored response is what the site serves: "
                                f"{result.differing} payload digest(s) differ"),
    ]
    if result.killed_master:
        lines.append((result.report_master not in (None, result.killed_master),
                      f"master failover: {result.killed_master} killed -9, "
                      f"{result.report_master} led after {result.failover_s}s and wrote the "
                      f"report (session timeout {options.session_timeout:g}s)"))
    if result.killed:
        lines.append((True, f"fetcher failover: {result.killed} killed -9, its partitions "
                            f"taken over from their last checkpoints ({result.replacement} "
                            f"started in its place); {result.duplicates} duplicate WARC "
                            "record(s) from pages redone"))
    elif result.duplicates:
        lines.append((True, f"{result.duplicates} duplicate WARC record(s)"))
    if result.quarantined:
        lines.append((True, f"{len(result.quarantined)} unreadable inbox file(s) set aside "
                            f"(their links count only if found elsewhere): "
                            f"{', '.join(result.quarantined)}"))
    lines.append((result.app_znodes < 100,
                  f"ZooKeeper as control plane only: {result.app_znodes} znodes under the "
                  f"crawl's chroot, {result.writes} writes ({result.writes_per_s:.1f}/s) for "
                  f"{result.stored} pages"))
    return lines


def run_main(parser: argparse.ArgumentParser, argv: list[str] | None = None) -> int:
    """Parse, crawl, print the checks; the exit status."""
    args = parser.parse_args(argv)
    configure_logging(level=os.environ.get("FRAMEWORK_DEMO_LOG_LEVEL", "error"))
    options = RunOptions(
        pages=args.pages, hosts=args.hosts, fetchers=args.fetchers, masters=args.masters,
        partitions=args.partitions, politeness=args.politeness,
        checkpoint_interval=args.checkpoint_interval, kill_at=args.kill_at,
        kill_master_at=args.kill_master_at, session_timeout=args.session_timeout,
        timeout=args.timeout, out=args.out, shared=args.shared,
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
    except BaseException as exc:
        if not _interrupted(exc):
            raise
        print("interrupted: every process the crawl started was stopped", file=sys.stderr)
        return 130
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
        return 0 if result.ok else 1
    print(f"{result.stored}/{result.expected} pages in {result.seconds:.1f}s "
          f"({result.pages_per_s:.1f} pages/s); checks against the site's ground "
          f"truth ({options.out / 'site.json'}):")
    for passed, line in checks(result, options):
        print(f"  [{'ok' if passed else 'FAILED'}] {line}")
    for url in result.missing_sample:
        print(f"  missing: {url}")
    for url in result.unexpected_sample:
        print(f"  unexpected: {url}")
    everything = result.ok and all(passed for passed, _ in checks(result, options))
    print("OK: every page the site has was fetched and stored as served" if everything
          else "FAILED")
    return 0 if everything else 1


def _interrupted(exc: BaseException) -> bool:
    """Ctrl-C, possibly inside exception groups (trio's nurseries wrap it)."""
    if isinstance(exc, BaseExceptionGroup):
        return all(_interrupted(inner) for inner in exc.exceptions)
    return isinstance(exc, KeyboardInterrupt)


def main(argv: list[str] | None = None) -> int:
    return run_main(build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
