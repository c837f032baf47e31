"""Crawl benchmark: the partitioned Fetch Service against the level-by-level one (issue #17).

Run: ``.venv/bin/python bench/crawl.py [--json] [--quick]``.

Every crawl is a whole run of ``examples.fetch_service.scale.run`` (its own embedded
ZooKeeper, the lazy site, 1 master and 4 fetcher processes); ZooKeeper numbers come from the
server's ``mntr`` (``zk_znode_count``; writes = ``zk_cnt_updatelatency``, every write request
the server applied).  Workloads:

1. pages/s, politeness off, 50k pages: ours vs the level-by-level design (the baseline);
2. pages/s, politeness 0.1 s per host, 10k pages: both designs;
3. ZooKeeper znodes (peak) and writes/s at 10k, 50k and 200k pages (the baseline at 10k and
   50k): flat is the goal;
4. kill -9 of a fetcher half-way through a 50k-page crawl (a replacement is started): missing
   pages (must be 0) and duplicate WARC records (at-least-once redelivery).

``--quick`` divides every size by 10 (a smoke run).  ``--json`` prints a JSON list of
``{workload, unit, baseline, ours, ratio}`` (ratio = ours / baseline).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from bench.common import Result  # noqa: E402
from examples.fetch_service.scale.run import RunOptions, RunResult, run_crawl  # noqa: E402
from framework import configure_logging  # noqa: E402

POLITE_DELAY = 0.1


def crawl(design: str, pages: int, *, politeness: float = 0.0, kill_at: float = 0.0,
          out: Path) -> RunResult:
    name = f"{design}-{pages}-p{politeness:g}-k{kill_at:g}"
    print(f"crawl: {name} ...", file=sys.stderr, flush=True)
    options = RunOptions(design=design, pages=pages, politeness=politeness, kill_at=kill_at,
                         out=out / name, progress=lambda t: print(f"  {t}", file=sys.stderr,
                                                                  flush=True))
    result = trio.run(run_crawl, options)
    print(f"  -> {json.dumps(result.to_dict())}", file=sys.stderr, flush=True)
    if not result.ok:
        print(f"  WARNING: {name}: {result.missing} missing, {result.unexpected} unexpected",
              file=sys.stderr)
    return result


def print_table(rows: list[Result]) -> None:
    """Rows with the baseline (level by level) next to ours and the ratio ours/baseline."""
    table = Table(title="Fetch Service: partitioned (ours) vs level by level (baseline)")
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
    parser.add_argument("--quick", action="store_true", help="sizes / 10 (a smoke run)")
    parser.add_argument("--out", type=Path, default=ROOT / "out" / "bench-crawl")
    args = parser.parse_args()
    configure_logging(level="error")
    scale = 10 if args.quick else 1
    small, medium, large = 10_000 // scale, 50_000 // scale, 200_000 // scale
    out = args.out

    ours = {n: crawl("partitioned", n, out=out) for n in (small, medium, large)}
    base_medium = crawl("levels", medium, out=out)
    polite_ours = crawl("partitioned", small, politeness=POLITE_DELAY, out=out)
    polite_base = crawl("levels", small, politeness=POLITE_DELAY, out=out)
    killed = crawl("partitioned", medium, kill_at=0.5, out=out)
    base_by_size = {small: polite_base, medium: base_medium}

    k = lambda n: f"{n // 1000}k" if n >= 1000 else str(n)  # noqa: E731
    rows = [
        Result(f"pages/s, 4 fetchers, politeness off, {k(medium)} pages", "pages/s",
               base_medium.pages_per_s, ours[medium].pages_per_s),
        Result(f"pages/s, 4 fetchers, politeness {POLITE_DELAY:g} s, {k(small)} pages",
               "pages/s", polite_base.pages_per_s, polite_ours.pages_per_s),
    ]
    for n in (small, medium, large):
        base = base_by_size.get(n)
        note = "baseline politeness 0.1 s" if n == small else ""
        rows.append(Result(f"ZooKeeper znodes (peak), {k(n)} pages", "znodes",
                           base.znodes_peak if base else None, ours[n].znodes_peak,
                           higher_is_better=False, note=note))
        rows.append(Result(f"ZooKeeper writes/s, {k(n)} pages", "writes/s",
                           base.writes_per_s if base else None, ours[n].writes_per_s,
                           higher_is_better=False, note=note))
        rows.append(Result(f"ZooKeeper writes per 1,000 pages, {k(n)} pages", "writes",
                           base.writes * 1000 / base.stored if base else None,
                           ours[n].writes * 1000 / ours[n].stored, higher_is_better=False,
                           note=note))
    rows += [
        Result(f"kill -9 of a fetcher at 50%, {k(medium)} pages: missing", "pages", None,
               killed.missing, higher_is_better=False),
        Result(f"kill -9 of a fetcher at 50%, {k(medium)} pages: duplicates", "records", None,
               killed.duplicates, higher_is_better=False,
               note=f"{killed.stored}/{killed.expected} stored"),
        Result(f"kill -9 of a fetcher at 50%, {k(medium)} pages: pages/s", "pages/s", None,
               killed.pages_per_s),
    ]
    if args.json:
        print(json.dumps([{"workload": r.workload, "unit": r.unit, "baseline": r.kazoo,
                           "ours": r.ours, "ratio": r.ratio} for r in rows], indent=2))
    else:
        print_table(rows)
    everything = [*ours.values(), base_medium, polite_ours, polite_base, killed]
    return 0 if all(r.ok for r in everything) else 1


if __name__ == "__main__":
    sys.exit(main())
