"""The partitioned Fetch Service end to end, in separate processes on a real ZooKeeper (the
test session's server): a master, 4 fetchers and the lazy site, each its own process.

- the znodes under the crawl's chroot are as many after a crawl of 1,200 pages as after one
  of 200 (ZooKeeper holds no per-URL state);
- kill -9 of the active master and then of a fetcher mid-crawl (``make demo`` in small: a
  standby master leads, a replacement fetcher is started on "another machine" with its own
  WARC and local directories): every page is stored as the site serves it, nothing else;
  duplicates are reported.
"""

from __future__ import annotations

from pathlib import Path

import trio

from examples.fetch_service.scale.run import RunOptions, run_crawl


def options(zk_hosts: str, out: Path, pages: int, **changes: object) -> RunOptions:
    settings: dict[str, object] = {"pages": pages, "hosts": 16, "fetchers": 4, "partitions": 8,
                                   "checkpoint_interval": 0.5, "session_timeout": 2.0,
                                   "zk": zk_hosts, "out": out}
    return RunOptions(**(settings | changes))  # type: ignore[arg-type]


async def test_znode_count_does_not_grow_with_pages(zk_hosts: str, tmp_path: Path) -> None:
    with trio.fail_after(60):
        small = await run_crawl(options(zk_hosts, tmp_path / "small", 200))
    with trio.fail_after(90):
        large = await run_crawl(options(zk_hosts, tmp_path / "large", 1200))
    assert small.ok and large.ok, (small.missing_sample, large.missing_sample)
    assert large.stored == large.expected > 5 * small.expected
    # counted while the processes run: their ephemeral nodes (a take's place in the idle
    # line, a claim in flight) differ by a few from one moment to another, pages or not;
    # one znode per page would be 1,000 more
    assert small.app_znodes < 100 and large.app_znodes < 100
    assert abs(large.app_znodes - small.app_znodes) <= 8, (small.app_znodes, large.app_znodes)


async def test_master_and_fetcher_killed_mid_crawl_lose_no_page(zk_hosts: str,
                                                                tmp_path: Path) -> None:
    with trio.fail_after(120):
        result = await run_crawl(options(zk_hosts, tmp_path, 1500, masters=2,
                                         kill_master_at=0.2, kill_at=0.4))
    assert (result.killed, result.replacement) == ("fetcher-1", "fetcher-5")
    assert (result.killed_master, result.report_master) == ("master-1", "master-2")
    assert result.differing == 0
    assert result.missing == 0, result.missing_sample
    assert result.unexpected == 0, result.unexpected_sample  # robots.txt obeyed too
    assert result.stored == result.expected
    print(f"duplicates after kill -9: {result.duplicates}")  # at-least-once redelivery
