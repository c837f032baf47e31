"""``make demo``: the Fetch Service end to end, with a master failover half-way.

What it does, every piece a separate process except ZooKeeper and the dashboard:

1. starts an embedded ZooKeeper (or uses ``$FRAMEWORK_ZK_HOSTS``, in a fresh chroot that is
   deleted at the end);
2. serves the demo web site on 127.0.0.1 (``python -m examples.fetch_service.site``);
3. creates the crawl job (the site's seeds, ``allowed_hosts`` = its hosts);
4. starts two masters and four fetchers with ``python -m framework run ...``;
5. shows progress live (pages stored against the ground truth, per-fetcher rates, the
   current master, the level being crawled) - plain lines when there is no terminal;
6. kills the active master with ``kill -9`` once half of the pages are stored, and shows the
   standby taking over (after the dead master's session expires);
7. stops everything and checks the WARC output against the site's ground truth: every
   reachable page stored, nothing else; duplicates (from at-least-once redelivery) are
   counted.  Exit status 0 when every page is there, 1 if one is missing (or something else
   is stored) or the crawl did not finish in time, 2 for a user mistake, 130 when
   interrupted (Ctrl-C or SIGTERM stop every process the demo started).

Output in ``./out/``: ``warc/`` (the fetchers' WARC files), ``logs/`` (each process's log),
``site.json`` (the site's manifest) and ``summary.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import IO, Any

import attrs
import trio
from rich.console import Console
from rich.live import Live
from rich.table import Table

from examples.fetch_service.config import CrawlConfig
from examples.fetch_service.ctl import start_job, wait_report
from examples.fetch_service.dashboard import CrawlView
from examples.fetch_service.site import Site, SiteSpec
from examples.fetch_service.state import APP_NAME, CrawlPaths, loads
from examples.fetch_service.warc import StoreSummary, summarize
from framework import (
    ConfigurationError,
    FrameworkError,
    ZooKeeperEnsemble,
    configure_logging,
    single_body_error,
)
from framework.primitives import Group, Rendezvous
from framework.runtime import App
from framework.zk import Session, watch_data

ROOT = Path(__file__).resolve().parents[2]


class DemoFailed(Exception):
    """The demo cannot go on; the message says why (and where the logs are)."""


@attrs.define
class Timeline:
    """When things happened (``time.monotonic()``)."""

    killed: str | None = None
    killed_at: float | None = None
    took_over: str | None = None
    failover_s: float | None = None


# ---------------------------------------------------------------- processes


def _die_with_parent() -> None:  # runs in the child between fork and exec
    with contextlib.suppress(Exception):
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class Processes:
    """The demo's child processes, each logging to ``logs/<name>.log``.

    Each child is killed by the kernel if the demo dies (``PR_SET_PDEATHSIG``), and
    :meth:`stop_all` kills what is left when the demo ends in any other way.
    """

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.procs: dict[str, subprocess.Popen[Any]] = {}

    def spawn(self, name: str, argv: Sequence[str], *, env: dict[str, str] | None = None,
              stdout: int | None = None) -> subprocess.Popen[Any]:
        log = open(self.logs / f"{name}.log", "wb")  # noqa: SIM115 - owned by the child
        environment = os.environ | {
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT),
                                                        os.environ.get("PYTHONPATH")])),
            "FRAMEWORK_LOG_LEVEL": "info",
            **(env or {}),
        }
        proc = subprocess.Popen(
            [sys.executable, *argv], env=environment, cwd=ROOT,
            stdout=stdout if stdout is not None else log, stderr=log,
            preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
        )
        log.close()
        self.procs[name] = proc
        return proc

    def log_tail(self, name: str, lines: int = 5) -> str:
        try:
            text = (self.logs / f"{name}.log").read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
            proc.wait()


async def _exit_code(proc: subprocess.Popen[Any], timeout: float) -> int:
    """Wait for ``proc`` to end; kill it if it takes longer than ``timeout``."""
    with trio.move_on_after(timeout):
        return await trio.to_thread.run_sync(proc.wait, abandon_on_cancel=True)
    proc.kill()
    return await trio.to_thread.run_sync(proc.wait)


def _read_until_ready(stream: IO[bytes]) -> bool:
    return any(raw.strip() == b"READY" for raw in stream)


@contextlib.asynccontextmanager
async def _zookeeper(console: Console) -> AsyncIterator[tuple[str, str]]:
    """``(connect string, chroot)``: ``$FRAMEWORK_ZK_HOSTS`` or an embedded server."""
    chroot = f"/fetch-demo-{uuid.uuid4().hex[:8]}"
    hosts = os.environ.get("FRAMEWORK_ZK_HOSTS")
    if hosts:
        async with Session(hosts, connect_timeout=10.0) as session:  # fail early if down
            console.print(f"ZooKeeper: using {hosts} (chroot {chroot}, deleted at the end)",
                          highlight=False)
            try:
                yield hosts, chroot
            finally:
                with trio.CancelScope(shield=True), trio.move_on_after(15):
                    with contextlib.suppress(FrameworkError):
                        await session.delete_tree(chroot)
        return
    started = time.monotonic()
    server = ZooKeeperEnsemble(1)
    try:
        # On this thread, not a worker thread: the server dies with the thread that started
        # it (PR_SET_PDEATHSIG), and trio's idle worker threads exit after a few seconds.
        server.start()
        console.print(f"ZooKeeper: embedded standalone server at {server.connect_string} "
                      f"(up in {time.monotonic() - started:.1f}s)", highlight=False)
        yield server.connect_string, chroot
    finally:
        server.stop()


def demo_config(args: argparse.Namespace, hosts: Sequence[str]) -> CrawlConfig:
    return CrawlConfig(politeness_delay_s=args.politeness, max_depth=args.max_depth,
                       batch_size=args.batch_size, request_timeout_s=5.0,
                       allowed_hosts=tuple(hosts))


# ---------------------------------------------------------------- the crawl, watched


class Demo:
    def __init__(self, args: argparse.Namespace, console: Console, out: Path) -> None:
        self.args = args
        self.console = console
        self.out = out
        self.procs = Processes(out / "logs")
        self.app = App(APP_NAME)
        self.timeline = Timeline()
        self.view = CrawlView(expected=0)
        self.half_way = trio.Event()
        self.first_leader = trio.Event()

    def say(self, text: str) -> None:
        self.console.print(self.view.event(text), highlight=False)

    async def start_site(self) -> Site:
        args = self.args
        manifest = self.out / "site.json"
        proc = self.procs.spawn(
            "site",
            ["-m", "examples.fetch_service.site", "--pages", str(args.pages), "--hosts",
             str(args.hosts), "--slow-delay", str(args.slow_delay), "--manifest", str(manifest)],
            stdout=subprocess.PIPE,
        )
        assert proc.stdout is not None
        ready = False
        with trio.move_on_after(30):
            ready = await trio.to_thread.run_sync(_read_until_ready, proc.stdout,
                                                  abandon_on_cancel=True)
        if not ready:
            raise DemoFailed("the demo site did not start:\n" + self.procs.log_tail("site"))
        return Site.from_manifest(manifest)

    def fw(self, name: str, component: str, zk: str, chroot: str,
           env: dict[str, str] | None = None) -> None:
        self.procs.spawn(name, [
            "-m", "framework", "run", f"examples.fetch_service.app:{component}", "--zk", zk,
            "--chroot", chroot, "--name", name,
            "--session-timeout", str(self.args.session_timeout),
        ], env=env)

    async def crawl(self, zk: str, chroot: str, site: Site) -> dict[str, Any]:
        args = self.args
        config = demo_config(args, site.hosts)
        expected = site.reachable_urls(args.max_depth)
        self.view = view = CrawlView(expected=len(expected))
        async with Session(zk, chroot=chroot, session_timeout=10.0) as session:
            job = await start_job(session, self.app, site.seeds, config)
            self.say(f"crawl job {job}: {len(site.seeds)} seeds on {len(site.hosts)} hosts, "
                     f"max_depth {args.max_depth}, politeness {args.politeness:g}s per host; "
                     f"ground truth: {len(expected)} reachable pages")
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._follow_leader, session)
                nursery.start_soon(self._follow_fetchers, session)
                nursery.start_soon(self._follow_progress, session)
                nursery.start_soon(self._display)
                self.fw("master-1", "CrawlMaster", zk, chroot)
                with trio.move_on_after(60):
                    await self.first_leader.wait()
                if not self.first_leader.is_set():
                    raise DemoFailed("master-1 was not elected within 60s:\n"
                                     + self.procs.log_tail("master-1"))
                self.fw("master-2", "CrawlMaster", zk, chroot)
                env = {"FETCH_WARC_DIR": str(self.out / "warc")}
                for i in range(args.fetchers):
                    self.fw(f"fetcher-{i + 1}", "FetchWorker", zk, chroot, env)
                self.say(f"started 2 masters (master-1 leads, master-2 stands by) and "
                         f"{args.fetchers} fetchers")
                if args.kill_at > 0:
                    nursery.start_soon(self._kill_master)
                report: dict[str, Any] | None = None
                with trio.move_on_after(args.timeout):
                    report = await wait_report(session, self.app)
                view.finished = True
                nursery.cancel_scope.cancel()
            if report is None:
                raise DemoFailed(f"the crawl did not finish within {args.timeout:g}s; "
                                 f"see {self.out / 'logs'}")
            self.say(f"crawl finished (report written by {report.get('master')})")
            await self._stop()
        return report

    async def _follow_leader(self, session: Session) -> None:
        view, timeline = self.view, self.timeline
        async for data in Rendezvous(session, self.app.rendezvous).watch():
            doc = loads(data) if data else None
            name = doc.get("name") if isinstance(doc, dict) else None
            if name == view.leader:
                continue
            previous, view.leader = view.leader, name
            view.leader_pid = doc.get("pid") if isinstance(doc, dict) else None
            if name is None:
                if timeline.killed == previous:
                    self.say(f"{previous}'s session expired: its rendezvous node is gone, "
                             "the standby is being elected")
                continue
            self.first_leader.set()
            self.say(f"{name} is the active master (pid {view.leader_pid})")
            if timeline.killed_at is not None and timeline.took_over is None:
                timeline.took_over = name
                timeline.failover_s = time.monotonic() - timeline.killed_at
                self.say(f"failover: {name} took over {timeline.failover_s:.1f}s after "
                         f"the kill (session timeout {self.args.session_timeout:g}s) and "
                         "resumes the crawl from ZooKeeper")

    async def _follow_fetchers(self, session: Session) -> None:
        view = self.view
        await session.ensure_path(self.app.workers)
        async for members in Group(session, self.app.workers).watch():
            view.update_fetchers({name: loads(data) or {} for name, data in members.items()})
            if view.pages >= self.args.kill_at * view.expected:
                self.half_way.set()

    async def _follow_progress(self, session: Session) -> None:
        view = self.view
        last_level = None
        async for snap in watch_data(session, CrawlPaths(self.app).progress):
            if snap.data:
                view.progress = loads(snap.data)
                level = view.progress.get("level")
                if level != last_level and view.progress.get("state") == "fetching":
                    last_level = level
                    self.say(f"level {level}: {view.progress.get('level_urls')} URLs in "
                             f"{view.progress.get('level_batches')} per-host batches")

    async def _kill_master(self) -> None:
        view = self.view
        await self.half_way.wait()
        name = view.leader
        proc = self.procs.procs.get(name or "")
        if proc is None or proc.poll() is not None:
            return
        proc.kill()  # SIGKILL: no clean-up, its session must expire
        self.timeline.killed, self.timeline.killed_at = name, time.monotonic()
        await trio.to_thread.run_sync(proc.wait)
        self.say(f"kill -9 {name} (pid {proc.pid}), the active master, at "
                 f"{view.pages}/{view.expected} pages; the standby takes over when its "
                 f"session expires ({self.args.session_timeout:g}s)")

    async def _display(self) -> None:
        view = self.view
        if self.console.is_terminal:
            with Live(view.render(), console=self.console, refresh_per_second=8) as live:
                while not view.finished:
                    live.update(view.render())
                    await trio.sleep(0.2)  # screen refresh rate, not synchronisation
        else:
            while not view.finished:
                await trio.sleep(2.0)  # a plain progress line every 2 s
                self.console.print(view.plain(), highlight=False)

    async def _stop(self) -> None:
        procs = self.procs.procs
        for name, proc in procs.items():
            if name.startswith("fetcher-") and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)  # graceful: drain, leave the group
        codes = {}
        for name, proc in procs.items():
            if name.startswith(("fetcher-", "master-")):
                codes[name] = await _exit_code(proc, 30.0)
        self.say("stopped: " + ", ".join(
            f"{n} {'killed' if c == -signal.SIGKILL else f'exit {c}'}"
            for n, c in sorted(codes.items())))
        site = procs["site"]
        site.send_signal(signal.SIGTERM)
        await _exit_code(site, 10.0)


# ---------------------------------------------------------------- the summary


def summary_doc(summary: StoreSummary, expected: int, report: dict[str, Any],
                timeline: Timeline, total_s: float) -> dict[str, Any]:
    totals = report.get("totals", {})
    return {
        "reachable_pages": expected,
        "stored_urls": len(summary.counts),
        "warc_records": summary.records,
        "warc_files": summary.files,
        "duplicates": summary.duplicates,
        "duplicated_urls": summary.duplicated_urls,
        "missing": sorted(summary.missing),
        "unexpected": sorted(summary.unexpected),
        "damaged_files": [f"{path}: {why}" for path, why in summary.damaged],
        "crawl_errors": totals.get("errors", {}),
        "killed_master": timeline.killed,
        "new_master": timeline.took_over,
        "failover_s": None if timeline.failover_s is None else round(timeline.failover_s, 2),
        "total_s": round(total_s, 1),
        "ok": summary.complete,
    }


def print_summary(console: Console, doc: dict[str, Any], session_timeout: float) -> None:
    table = Table(title="Fetch Service demo: summary", show_header=False, box=None,
                  padding=(0, 2))
    table.add_column(style="bold")
    table.add_column()
    table.add_row("reachable pages (ground truth)", str(doc["reachable_pages"]))
    table.add_row("stored in WARC (distinct URLs)", str(doc["stored_urls"]))
    table.add_row("WARC records / files", f"{doc['warc_records']} / {doc['warc_files']}")
    dup = doc["duplicates"]
    table.add_row("duplicates (redelivery)", str(dup) + (
        "  " + ", ".join(f"{u} x{c}" for u, c in list(doc["duplicated_urls"].items())[:3])
        if dup else ""))
    table.add_row("missing", str(len(doc["missing"])))
    table.add_row("unexpected", str(len(doc["unexpected"])))
    if doc["damaged_files"]:
        table.add_row("damaged WARC tails", str(len(doc["damaged_files"])))
    errors = ", ".join(f"{k} {v}" for k, v in doc["crawl_errors"].items()) or "none"
    table.add_row("crawl errors (site's 404/500/loop)", errors)
    if doc["killed_master"]:
        failover = (f"{doc['failover_s']:.1f}s" if doc["failover_s"] is not None else "?")
        table.add_row("master failover", f"{doc['killed_master']} killed -9, "
                      f"{doc['new_master']} took over after {failover} "
                      f"(session timeout {session_timeout:g}s)")
    table.add_row("total time", f"{doc['total_s']:.1f}s")
    console.print(table)
    for url in doc["missing"][:10]:
        console.print(f"  missing: {url}", highlight=False)
    for url in doc["unexpected"][:10]:
        console.print(f"  unexpected: {url}", highlight=False)
    if doc["ok"] and not dup:
        console.print(f"[bold green]OK[/]: every reachable page was fetched and stored exactly "
                      f"once ({doc['stored_urls']} pages, no duplicate record).")
    elif doc["ok"]:
        console.print(f"[bold green]OK[/]: every reachable page was fetched and stored "
                      f"({doc['stored_urls']} pages), with {dup} duplicate record(s) from "
                      "at-least-once redelivery.")
    else:
        console.print(f"[bold red]FAILED[/]: {len(doc['missing'])} page(s) missing, "
                      f"{len(doc['unexpected'])} unexpected.")


# ---------------------------------------------------------------- main


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m examples.fetch_service.demo",
                                description="Crawl the local demo site with 2 masters and 4 "
                                "fetchers, kill -9 the active master half-way, check the WARCs.")
    p.add_argument("--out", default="out", help="output directory (default ./out)")
    p.add_argument("--pages", type=int, default=600, help="pages of the demo site")
    p.add_argument("--hosts", type=int, default=6, help="virtual hosts (ports) of the site")
    p.add_argument("--slow-delay", type=float, default=0.3, help="slow pages' delay (s)")
    p.add_argument("--fetchers", type=_positive, default=4, help="fetcher processes (default 4)")
    p.add_argument("--max-depth", type=int, default=5)
    p.add_argument("--politeness", type=float, default=0.05,
                   help="seconds between two requests to one host (default 0.05)")
    p.add_argument("--batch-size", type=int, default=8, help="URLs per work item")
    p.add_argument("--session-timeout", type=_positive_float, default=3.0,
                   help="the processes' ZooKeeper session timeout in seconds (default 3)")
    p.add_argument("--kill-at", type=_fraction, default=0.5,
                   help="kill -9 the active master at this fraction of the pages (0: never)")
    p.add_argument("--timeout", type=_positive_float, default=100.0,
                   help="give up on the crawl after this many seconds (default 100)")
    return p


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def _fraction(text: str) -> float:
    value = float(text)
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"must be in [0, 1), got {text}")
    return value


async def run_demo(args: argparse.Namespace, console: Console) -> int:
    """The whole demo; returns the exit status."""
    started = time.monotonic()
    # user mistakes are reported before anything is started
    SiteSpec(pages=args.pages, hosts=args.hosts, slow_delay_s=args.slow_delay)
    demo_config(args, ())
    out = Path(args.out).resolve()
    for sub in ("warc", "logs"):
        shutil.rmtree(out / sub, ignore_errors=True)
        try:
            (out / sub).mkdir(parents=True)
        except OSError as exc:
            raise ConfigurationError(f"cannot create {out / sub}: {exc.strerror}") from None
    demo = Demo(args, console, out)
    try:
        async with _zookeeper(console) as (zk, chroot):
            site = await demo.start_site()
            console.print(f"site: {args.pages} pages on {', '.join(site.hosts)} "
                          "(some slow, some 404/500, one redirect loop)", highlight=False)
            report = await demo.crawl(zk, chroot, site)
    finally:
        demo.procs.stop_all()
    expected = site.reachable_urls(args.max_depth)
    summary = await trio.to_thread.run_sync(summarize, out / "warc", expected)
    doc = summary_doc(summary, len(expected), report, demo.timeline,
                      time.monotonic() - started)
    (out / "summary.json").write_text(json.dumps(doc, indent=2) + "\n")
    print_summary(console, doc, args.session_timeout)
    console.print(f"output: {out / 'warc'} (WARC), {out / 'logs'} (process logs), "
                  f"{out / 'summary.json'}", highlight=False)
    return 0 if doc["ok"] else 1


async def _until_signal(args: argparse.Namespace, console: Console) -> int:
    """:func:`run_demo`, cancelled (every process stopped) on SIGINT or SIGTERM."""
    caught: list[str] = []
    code = 1
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        with single_body_error():
            async with trio.open_nursery() as nursery:

                async def on_signal() -> None:
                    async for signum in signals:
                        caught.append(signal.Signals(signum).name)
                        nursery.cancel_scope.cancel()
                        return

                nursery.start_soon(on_signal)
                code = await run_demo(args, console)
                nursery.cancel_scope.cancel()
    if caught:
        console.print(f"\ninterrupted ({caught[0]}): every process the demo started was "
                      "stopped", highlight=False)
        return 130
    return code


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging(level=os.environ.get("FRAMEWORK_DEMO_LOG_LEVEL", "error"))
    console = Console(soft_wrap=not sys.stdout.isatty())
    try:
        return trio.run(_until_signal, args, console)
    except (DemoFailed, FrameworkError) as exc:
        console.print(f"[bold red]demo: error:[/] {exc}", highlight=False)
        return 2 if isinstance(exc, FrameworkError) else 1
    except OSError as exc:
        console.print(f"[bold red]demo: error:[/] {exc}", highlight=False)
        return 2
    except KeyboardInterrupt:  # a second Ctrl-C while stopping
        return 130


if __name__ == "__main__":
    sys.exit(main())
