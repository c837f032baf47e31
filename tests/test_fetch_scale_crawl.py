"""The partitioned Fetch Service end to end, in separate processes on a real ZooKeeper (the
test session's server): a master, 4 fetchers and the lazy site, each its own process.

- the znodes under the crawl's chroot are as many after a crawl of 3,000 pages as after one
  of 500 (ZooKeeper holds no per-URL state);
- kill -9 of a fetcher mid-crawl (a replacement started on "another machine": its own WARC
  and local directories): every page is stored, nothing else; duplicates are reported.
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
        small = await run_crawl(options(zk_hosts, tmp_path / "small", 500))
    with trio.fail_after(90):
        large = await run_crawl(options(zk_hosts, tmp_path / "large", 3000))
    assert small.ok and large.ok, (small.missing_sample, large.missing_sample)
    assert large.stored == large.expected > 5 * small.expected
    assert large.app_znodes == small.app_znodes < 100


async def test_fetcher_killed_mid_crawl_loses_no_page(zk_hosts: str, tmp_path: Path) -> None:
    with trio.fail_after(120):
        result = await run_crawl(options(zk_hosts, tmp_path, 3000, kill_at=0.3))
    assert result.killed == "fetcher-1"
    assert result.missing == 0, result.missing_sample
    assert result.unexpected == 0, result.unexpected_sample  # robots.txt obeyed too
    assert result.stored == result.expected
    print(f"duplicates after kill -9: {result.duplicates}")  # at-least-once redelivery
