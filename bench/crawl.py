"""Crawl benchmark: the partitioned Fetch Service against a plain single-process crawler.

Run: ``.venv/bin/python bench/crawl.py [--json] [--quick]``.

Every crawl of ours is a whole run of ``examples.fetch_service.scale.run`` (its own embedded
ZooKeeper, the lazy site, 1 master and 4 fetcher processes); ZooKeeper numbers come from the
server's ``mntr`` (``zk_znode_count``; writes = ``zk_cnt_updatelatency``, every write request
the server applied).  The baseline is the crawl with no framework at all: one process, one
``Fetcher`` with as many exchanges in flight as the 4 fetchers together (32), the seen-set
and the frontier in memory, robots.txt obeyed, WARC files on disk, against the same site in
its own process.  It is the ceiling of one machine's crawler with nothing to survive a crash.
Workloads:

1. pages/s, politeness off, 50k pages: ours vs the baseline;
2. pages/s, politeness 0.1 s per host, 10k pages: both;
3. ZooKeeper znodes (peak) and writes/s at 10k, 50k and 200k pages (ours): flat is the goal;
4. kill -9 of the active master and of a fetcher during a 50k-page crawl (a replacement is
   started): missing pages (must be 0), duplicate WARC records, pages/s.

``--quick`` divides every size by 10 (a smoke run).  ``--json`` prints a JSON list of
``{workload, unit, baseline, ours, ratio}`` (ratio = ours / baseline).
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import time
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from bench.common import Result  # noqa: E402
from examples.fetch_service.config import CrawlConfig  # noqa: E402
from examples.fetch_service.fetch import Fetcher  # noqa: E402
from examples.fetch_service.lazysite import LazySite  # noqa: E402
from examples.fetch_service.links import host_key  # noqa: E402
from examples.fetch_service.scale.robots import RobotsRules, robots_url  # noqa: E402
from examples.fetch_service.scale.run import (  # noqa: E402
    NO_DEPTH_LIMIT,
    RunOptions,
    RunResult,
    run_crawl,
)
from examples.fetch_service.warc import WarcWriter, iter_stored  # noqa: E402
from framework import configure_logging  # noqa: E402
from framework.testing import python_argv, spawn  # noqa: E402

POLITE_DELAY = 0.1
SLOTS = 32  # the baseline's exchanges in flight: 4 fetchers x fetch_concurrency 8
SMOKE_PAGES = 150  # every run's size with --smoke


def crawl(pages: int, *, politeness: float = 0.0, kill: bool = False, out: Path) -> RunResult:
    name = f"ours-{pages}-p{politeness:g}" + ("-killed" if kill else "")
    print(f"crawl: {name} ...", file=sys.stderr, flush=True)
    options = RunOptions(pages=pages, politeness=politeness, out=out / name,
                         masters=2 if kill else 1, kill_master_at=0.4 if kill else 0.0,
                         kill_at=0.5 if kill else 0.0,
                         progress=lambda t: print(f"  {t}", file=sys.stderr, flush=True))
    result = trio.run(run_crawl, options)
    print(f"  -> {json.dumps(result.to_dict())}", file=sys.stderr, flush=True)
    if not result.ok:
        print(f"  WARNING: {name}: {result.missing} missing, {result.unexpected} unexpected",
              file=sys.stderr)
    return result


async def plain_crawl(pages: int, politeness: float, out: Path) -> tuple[int, int, float]:
    """The baseline (see the module doc): ``(expected, stored, seconds)``."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    manifest = out / "site.json"
    argv = python_argv("-m", "examples.fetch_service.lazysite", "--pages", pages,
                       "--manifest", manifest)
    async with spawn(argv, name="site", log_dir=out, pipe_stdout=True, cwd=ROOT) as child:
        assert child.lines is not None
        with trio.fail_after(30):
            await child.lines.until(lambda line: line == "READY")
        site = LazySite.from_manifest(manifest)
        config = CrawlConfig(politeness_delay_s=politeness, max_depth=NO_DEPTH_LIMIT,
                             request_timeout_s=10.0, fetch_concurrency=SLOTS,
                             allowed_hosts=site.hosts)
        seen = set(site.seeds)
        robots: dict[str, RobotsRules] = {}
        send, receive = trio.open_memory_channel[str](math.inf)
        pending = len(site.seeds)
        for seed in site.seeds:
            send.send_nowait(seed)
        started = time.monotonic()
        async with Fetcher(config) as fetcher, \
                WarcWriter(out / "warc", writer_id="plain") as warc:

            async def allowed(url: str) -> bool:
                host = host_key(url)
                if host not in robots:
                    answer = await fetcher.fetch(robots_url(host))
                    status = answer.outcome.status or 0
                    body = answer.responses[-1].body.decode() if answer.responses else ""
                    robots[host] = RobotsRules.from_answer(status, body)
                return robots[host].allows(url, config.user_agent)

            async def slot() -> None:
                nonlocal pending
                async for url in receive:
                    if await allowed(url):
                        result = await fetcher.fetch(url)
                        await warc.store(result)
                        for link in result.outcome.links:
                            if link not in seen:
                                seen.add(link)
                                pending += 1
                                send.send_nowait(link)
                    pending -= 1
                    if pending == 0:
                        await send.aclose()

            async with trio.open_nursery() as nursery:
                for _ in range(SLOTS):
                    nursery.start_soon(slot)
        seconds = time.monotonic() - started
    stored = {url for url, _digest in iter_stored(out / "warc")}
    expected = site.expected_urls()
    if stored != expected:
        print(f"  WARNING: baseline stored {len(stored & expected)}/{len(expected)}, "
              f"{len(stored - expected)} unexpected", file=sys.stderr)
    return len(expected), len(stored & expected), seconds


def baseline(pages: int, *, politeness: float = 0.0, out: Path) -> float:
    """The baseline's pages/s."""
    name = f"plain-{pages}-p{politeness:g}"
    print(f"crawl: {name} ...", file=sys.stderr, flush=True)
    expected, stored, seconds = trio.run(plain_crawl, pages, politeness, out / name)
    print(f"  -> {stored}/{expected} in {seconds:.1f}s", file=sys.stderr, flush=True)
    return stored / seconds


def print_table(rows: list[Result]) -> None:
    """Rows with the baseline (one process, no framework) next to ours and the ratio."""
    table = Table(title="Fetch Service: partitioned (ours) vs one plain process (baseline)")
    for column in ("workload", "unit", "baseline", "ours", "ours/baseline", "note"):
        table.add_column(column, justify="left" if column in ("workload", "note") else "right")
    for r in rows:
        ratio = r.ratio
        better = "" if ratio is None else (
            " (better)" if (ratio >= 1) == r.higher_is_better else " (worse)")
        table.add_row(r.workload, r.unit, "-" if r.kazoo is None else f"{r.kazoo:,.1f}",
                      "-" if r.ours is None else f"{r.ours:,.1f}",
                      "-" if ratio is None else f"{ratio:.3g}x{better}", r.note)
    Console(width=160).print(table)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print rows as JSON")
    parser.add_argument("--quick", action="store_true", help="sizes / 10 (a short run)")
    parser.add_argument("--smoke", action="store_true",
                        help=f"{SMOKE_PAGES} pages in every run (make test's smoke run: "
                             "its numbers mean nothing)")
    parser.add_argument("--out", type=Path, default=ROOT / "out" / "bench-crawl")
    args = parser.parse_args()
    configure_logging(level="error")
    scale = 10 if args.quick else 1
    small, medium, large = 10_000 // scale, 50_000 // scale, 200_000 // scale
    if args.smoke:
        small = medium = large = SMOKE_PAGES
    out = args.out

    ours = {n: crawl(n, out=out) for n in (small, medium, large)}
    plain_medium = baseline(medium, out=out)
    # a smoke run leaves out the politeness and kill -9 runs (the fault is tested by
    # tests/test_fetch_scale*.py): it only proves the bench still runs
    polite_ours = None if args.smoke else crawl(small, politeness=POLITE_DELAY, out=out)
    polite_plain = None if args.smoke else baseline(small, politeness=POLITE_DELAY, out=out)
    killed = None if args.smoke else crawl(medium, kill=True, out=out)

    k = lambda n: f"{n // 1000}k" if n >= 1000 else str(n)  # noqa: E731
    rows = [
        Result(f"pages/s, 4 fetchers, politeness off, {k(medium)} pages", "pages/s",
               plain_medium, ours[medium].pages_per_s),
    ]
    if polite_ours is not None:
        rows.append(Result(f"pages/s, 4 fetchers, politeness {POLITE_DELAY:g} s, "
                           f"{k(small)} pages", "pages/s", polite_plain,
                           polite_ours.pages_per_s))
    for n in (small, medium, large):
        rows.append(Result(f"ZooKeeper znodes (peak), {k(n)} pages", "znodes", None,
                           ours[n].znodes_peak, higher_is_better=False))
        rows.append(Result(f"ZooKeeper writes/s, {k(n)} pages", "writes/s", None,
                           ours[n].writes_per_s, higher_is_better=False))
        rows.append(Result(f"ZooKeeper writes per 1,000 pages, {k(n)} pages", "writes", None,
                           ours[n].writes * 1000 / ours[n].stored, higher_is_better=False))
    rows += [] if killed is None else [
        Result(f"kill -9 of master and fetcher, {k(medium)} pages: missing", "pages", None,
               killed.missing, higher_is_better=False),
        Result(f"kill -9 of master and fetcher, {k(medium)} pages: duplicates", "records",
               None, killed.duplicates, higher_is_better=False,
               note=f"{killed.stored}/{killed.expected} stored"),
        Result(f"kill -9 of master and fetcher, {k(medium)} pages: pages/s", "pages/s",
               plain_medium, killed.pages_per_s),
    ]
    if args.json:
        print(json.dumps([{"workload": r.workload, "unit": r.unit, "baseline": r.kazoo,
                           "ours": r.ours, "ratio": r.ratio} for r in rows], indent=2))
    else:
        print_table(rows)
    everything = [*ours.values(), *(r for r in (polite_ours, killed) if r is not None)]
    return 0 if all(r.ok for r in everything) else 1


if __name__ == "__main__":
    sys.exit(main())
