"""The framework-independent core of the Fetch Service example, over real HTTP.

The site is served by hypercorn on 127.0.0.1 in the test's own trio run; politeness is
checked on the server's access log (causal bounds, no wall-clock thresholds), concurrency
with the site's rendezvous hook.  No ZooKeeper here.
"""

from __future__ import annotations

import itertools
import json
import signal
import socket
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import trio
from helpers.fs_net import refused_port

from examples.fetch_service.config import CrawlConfig, normalize_host
from examples.fetch_service.fetch import ErrorKind, Fetcher, FetchOutcome, payload_digest
from examples.fetch_service.links import (
    InvalidUrlError,
    canonicalize,
    extract_links,
    host_key,
)
from examples.fetch_service.site import Site, SiteManifest, SiteSpec, Target, serve_site
from examples.fetch_service.warc import (
    WarcWriter,
    iter_records,
    iter_stored,
    summarize,
    warc_files,
)
from framework import records
from framework.errors import ConfigurationError, FrameworkError
from framework.testing import python_argv, spawn

SMALL = SiteSpec(pages=60, hosts=3, seed=7, slow_fraction=0.05, slow_delay_s=0.05, deep_chain=6)
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
async def site() -> AsyncIterator[Site]:
    async with serve_site(SMALL) as served:
        yield served


def config_for(site: Site, **changes: object) -> CrawlConfig:
    settings: dict[str, object] = {
        "politeness_delay_s": 0.0,
        "request_timeout_s": 5.0,
        "allowed_hosts": site.hosts,
    }
    settings.update(changes)
    return CrawlConfig(**settings)  # type: ignore[arg-type]


def find(site: Site, predicate: object) -> list[Target]:
    return sorted(
        (t for t, r in site.resources.items() if predicate(t, r)),  # type: ignore[operator]
        key=lambda t: (t.host, t.path),
    )


async def crawl(
    fetcher: Fetcher, seeds: tuple[str, ...], max_depth: int, warc: WarcWriter | None = None
) -> dict[str, FetchOutcome]:
    """A level-by-level crawl in one process, for the fetcher's and the site's tests."""
    depth = dict.fromkeys(seeds, 0)
    outcomes: dict[str, FetchOutcome] = {}
    frontier = list(seeds)
    while frontier:
        batch = await fetcher.fetch_batch(
            frontier, on_result=warc.store if warc is not None else None
        )
        frontier = []
        for outcome in batch:
            outcomes[outcome.url] = outcome
            level = depth[outcome.url]
            for hop in outcome.redirects:
                depth.setdefault(hop, level)
            if level < max_depth:
                for link in outcome.links:
                    if link not in depth:
                        depth[link] = level + 1
                        frontier.append(link)
    return outcomes


# -- links ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "base", "expected"),
    [
        ("HTTP://Example.COM:80/a/./b/../c#frag", None, "http://example.com/a/c"),
        ("https://h:443", None, "https://h/"),
        ("http://h/?", None, "http://h/"),
        ("http://h/x?b=2&a=%7e%2f", None, "http://h/x?a=~%2F&b=2"),  # arguments sorted
        ("http://h/a b/%e2%82%ac", None, "http://h/a%20b/%E2%82%AC"),
        ("http://h/100%", None, "http://h/100%"),  # w3lib leaves a lone % as it is
        ("../s1/p3.html#top", "http://h:8001/s2/p1.html", "http://h:8001/s1/p3.html"),
        ("./p3.html", "http://h:8001/s2/p1.html", "http://h:8001/s2/p3.html"),
        ("//g:81/x", "http://h/", "http://g:81/x"),
        ("?q=1", "http://h/a/b", "http://h/a/b?q=1"),
        ("/x/../../y/.", "http://h/a", "http://h/y/"),
        ("http://bücher.example/", None, "http://xn--bcher-kva.example/"),
    ],
)
def test_canonicalize_equivalent_forms(url: str, base: str | None, expected: str) -> None:
    assert canonicalize(url, base) == expected
    assert canonicalize(expected) == expected  # idempotent


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("mailto:a@b", "scheme 'mailto' is not http or https"),
        ("javascript:void(0)", "scheme 'javascript'"),
        ("ftp://h/f", "scheme 'ftp'"),
        ("not a url", "not absolute"),
        ("http://", "no host"),
        ("http://h:99999/", "out of range"),
        ("http://[::1/", "Invalid IPv6"),
    ],
)
def test_canonicalize_rejects_with_reason(url: str, reason: str) -> None:
    with pytest.raises(InvalidUrlError, match=r".*") as info:
        canonicalize(url)
    assert reason in str(info.value)
    assert repr(url) in str(info.value)


def test_extract_links_resolves_dedups_and_filters() -> None:
    html = """<html><head><base href="/docs/"></head><body>
      <a href="a.html#one">1</a> <a href="a.html#two">2</a> <a href="../up.html">3</a>
      <a href="HTTP://Other:80/">4</a> <a href="mailto:x@y">5</a> <a href="javascript:f()">6</a>
      <a>no href</a> <a href="">empty</a> <area href="/map"> <iframe src="frame.html"></iframe>
      <a href="http://[bad">bad</a>
    </body></html>"""
    assert extract_links(html, "http://h:8000/index.html") == [
        "http://h:8000/docs/a.html",
        "http://h:8000/up.html",
        "http://other/",
        "http://h:8000/map",
        "http://h:8000/docs/frame.html",
    ]
    assert host_key("http://h:8000/docs/a.html") == "h:8000"


# -- config ---------------------------------------------------------------------------------


def test_config_json_round_trip_and_overrides() -> None:
    config = CrawlConfig(max_depth=3, allowed_hosts=["LOCALHOST:80", "127.0.0.1:8001"])
    assert config.allowed_hosts == ("127.0.0.1:8001", "localhost")
    assert CrawlConfig.from_json(config.to_json()) == config
    assert json.loads(config.to_json())["max_depth"] == 3
    changed = config.with_overrides(["max_depth=7", "politeness_delay_s=0.5"])
    assert (changed.max_depth, changed.politeness_delay_s) == (7, 0.5)
    assert config.with_overrides({"allowed_hosts": "a:1, b:2"}).allowed_hosts == ("a:1", "b:2")
    assert config.allows("http://localhost/x") and config.allows("http://127.0.0.1:8001/")
    assert not config.allows("http://127.0.0.1:8002/") and not config.allows("garbage")
    assert CrawlConfig().allows("http://anything:1/")
    assert normalize_host("https://H:443/") == "h"


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: CrawlConfig(politeness_delay_s=-1), "politeness_delay_s must be a number >= 0"),
        (lambda: CrawlConfig(max_depth=True), "max_depth must be an integer >= 0, got True"),
        (lambda: CrawlConfig(user_agent=""), "user_agent must be a printable string"),
        (lambda: CrawlConfig(allowed_hosts=["a/b"]), "allowed host 'a/b' must be"),
        (lambda: CrawlConfig().evolve(max_dept=1), "unknown crawl config setting(s) max_dept"),
        (lambda: CrawlConfig.from_json(b'{"max_depth": "3"}'), "expected a number, got '3'"),
        (lambda: CrawlConfig.from_json(b'{"max_depth": -3}'), "max_depth must be an integer >= 0"),
        (lambda: CrawlConfig.from_json(b'{"max_depth": 2.5}'), "expected an integer"),
        (lambda: CrawlConfig.from_json(b'{"colour": 1}'), "unknown crawl config setting(s) colour"),
        (lambda: CrawlConfig.from_json(b"[1]"), "must be a JSON object"),
        (lambda: CrawlConfig.from_json(b"{"), "not valid JSON"),
        (lambda: CrawlConfig().with_overrides(["max_depth"]), "expected NAME=VALUE"),
        (lambda: CrawlConfig().with_overrides(["max_depth=x"]), "must be an integer, got 'x'"),
    ],
)
def test_config_errors_are_clear(make: object, message: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        make()  # type: ignore[operator]
    assert message in str(info.value)


# -- ground truth ---------------------------------------------------------------------------


def test_reachable_urls_ground_truth_on_a_tiny_site() -> None:
    spec = SiteSpec(pages=20, hosts=2, seed=3, deep_chain=4, links_per_page=1)
    tiny = Site(spec, [9001, 9002])
    assert tiny.seeds == ("http://127.0.0.1:9001/", "http://127.0.0.1:9002/")
    assert tiny.reachable_urls(0) == frozenset(tiny.seeds)
    depths = tiny.reachable_depths(100)
    # Every page of the site is reachable without a depth limit; traps never are.
    pages = {tiny.url(t) for t, r in tiny.resources.items() if r.kind == "page"}
    assert pages <= set(depths)
    assert not any("/trap/" in url for url in depths)
    assert all(url.startswith("http://127.0.0.1:900") for url in depths)
    # The deep chain sits at depth k (only its predecessor links to it) ...
    for k in range(1, 5):
        assert depths[tiny.url(Target(k % 2, f"/deep/{k}.html"))] == k
    # ... so a depth limit cuts it, and the reachable set grows with the limit.
    assert tiny.url(Target(1, "/deep/3.html")) not in tiny.reachable_urls(2)
    assert tiny.reachable_urls(2) < tiny.reachable_urls(3) <= tiny.reachable_urls(100)
    # Both URLs of the loop are requested, at the depth of the link to it.
    loop_a, loop_b = tiny.url(Target(1, "/loop/a.html")), tiny.url(Target(0, "/loop/b.html"))
    assert depths[loop_a] == depths[loop_b]
    # A redirect's hops and its target share the source's depth; targets are linked nowhere.
    chain = [Target(*_host_path(tiny, "/r/0"))]
    while tiny.resources[chain[-1]].kind == "redirect":
        chain.append(tiny.resources[chain[-1]].location)  # type: ignore[arg-type]
    assert len(chain) == 3 and {depths[tiny.url(t)] for t in chain} == {depths[tiny.url(chain[0])]}
    linked = {link for r in tiny.resources.values() for link in r.links}
    assert chain[-1] not in linked
    # The same spec and ports give the same site (another process can rebuild it).
    manifest = records.decode(records.encode(tiny.manifest()), SiteManifest)
    assert Site.from_manifest(manifest).reachable_depths(100) == depths


def _host_path(site: Site, path: str) -> tuple[int, str]:
    (target,) = [t for t in site.resources if t.path == path]
    return target.host, path


# -- fetching over real HTTP ----------------------------------------------------------------


async def test_small_crawl_fetches_exactly_the_ground_truth(site: Site) -> None:
    max_depth = 3
    assert site.reachable_urls(max_depth) < site.reachable_urls(100)  # a depth limit bites
    with trio.fail_after(20):
        async with Fetcher(config_for(site, max_depth=max_depth)) as fetcher:
            outcomes = await crawl(fetcher, site.seeds, max_depth)
    requested = [url for outcome in outcomes.values() for url in outcome.requested]
    assert Counter(requested).most_common(1)[0][1] == 1
    assert set(requested) == site.reachable_urls(max_depth)
    # The server saw each of those once, and nothing else (no trap, no non-canonical path).
    seen = Counter(site.url(Target(r.host, r.path)) for r in site.access_log)
    assert seen == Counter(requested)
    for outcome in outcomes.values():
        assert outcome.status == site.expected_status(outcome.final_url)
        if outcome.ok:
            assert set(outcome.links) == set(site.links_of(outcome.final_url))
            assert outcome.digest == payload_digest(
                site.body(site.target_of(outcome.final_url))  # type: ignore[arg-type]
            )
        else:
            assert outcome.links == ()
    kinds = Counter(outcome.error_kind for outcome in outcomes.values())
    assert kinds[None] > 20 and set(kinds) <= {None, "http", "redirect_loop"}


async def test_politeness_serialises_each_host_per_the_access_log(site: Site) -> None:
    delay = 0.1
    pages = find(site, lambda t, r: r.kind == "page")
    by_host = {h: [site.url(t) for t in pages if t.host == h][:4] for h in (0, 1)}
    urls = [url for pair in zip(by_host[0], by_host[1], strict=True) for url in pair]
    with trio.fail_after(15):
        async with Fetcher(config_for(site, politeness_delay_s=delay)) as fetcher:
            outcomes = await fetcher.fetch_batch(urls)
    assert [o.url for o in outcomes] == urls and all(o.ok for o in outcomes)
    assert all(o.waited >= 0 for o in outcomes)
    for host in (0, 1):
        log = sorted((r for r in site.access_log if r.host == host), key=lambda r: r.started)
        assert len(log) == 4
        for before, after in itertools.pairwise(log):
            # Causal bound: the client ended its exchange after `finished`, then waited
            # `delay` before sending; the server saw the request after that.
            assert after.started - before.finished >= delay - 1e-6
        assert all(r.user_agent == CrawlConfig().user_agent for r in log)


async def test_requests_to_different_hosts_overlap_and_one_host_never(site: Site) -> None:
    config = config_for(site, request_timeout_s=1.0)
    a, b = site.roots[0], site.roots[1]
    with trio.fail_after(15):
        async with Fetcher(config) as fetcher:
            # Two hosts: both requests wait at the server until both arrived.
            both = await fetcher.fetch_batch([a + "_rendezvous/x/2", b + "_rendezvous/x/2"])
            # One host: the second request cannot start while the first waits, so the
            # first times out and only then does the second go (and completes the pair).
            same = await fetcher.fetch_batch([a + "_rendezvous/y/2", a + "_rendezvous/y/2"])
    assert [(o.status, o.error) for o in both] == [(200, None), (200, None)]
    assert sorted(o.error_kind or "ok" for o in same) == ["ok", "timeout"]
    timed_out = next(o for o in same if o.error_kind == "timeout")
    assert timed_out.status is None and "timed out after 1s" in (timed_out.error or "")


async def test_redirects_loop_and_hop_limit(site: Site) -> None:
    two_hop = site.url(Target(*_host_path(site, "/r/0")))
    chain = [Target(*_host_path(site, "/r/0"))]
    while site.resources[chain[-1]].kind == "redirect":
        chain.append(site.resources[chain[-1]].location)  # type: ignore[arg-type]
    loop = site.url(Target(*_host_path(site, "/loop/a.html")))
    loop_b = site.url(Target(*_host_path(site, "/loop/b.html")))
    with trio.fail_after(10):
        async with Fetcher(config_for(site)) as fetcher:
            followed, looped = await fetcher.fetch_batch([two_hop, loop])
            fetcher.config = fetcher.config.evolve(max_redirects=1)
            limited = await fetcher.fetch(two_hop)
    assert followed.ok and followed.status == 200
    assert followed.final_url == site.url(chain[-1])
    assert followed.redirects == tuple(site.url(t) for t in chain[1:])
    assert followed.links and set(followed.links) == set(site.links_of(followed.final_url))
    assert looped.error_kind == "redirect_loop" and looped.status == 302
    assert looped.error == f"redirect loop: {loop} -> {loop_b} -> {loop}"
    assert looped.requested == (loop, loop_b) and looped.links == ()
    assert limited.outcome.error_kind == "too_many_redirects"
    assert "more than 1 redirects" in (limited.outcome.error or "")
    assert [r.status for r in limited.responses] == [
        site.resources[chain[0]].status,
        site.resources[chain[1]].status,
    ]


async def test_http_errors_are_recorded_and_their_links_ignored(site: Site, tmp_path: Path) -> None:
    gone = site.url(find(site, lambda t, r: r.status == 404)[0])
    broken = site.url(find(site, lambda t, r: r.status == 500)[0])
    with trio.fail_after(10):
        async with Fetcher(config_for(site)) as fetcher, WarcWriter(tmp_path) as warc:
            outcomes = await fetcher.fetch_batch([gone, broken], on_result=warc.store)
    assert [(o.status, o.error_kind, o.error) for o in outcomes] == [
        (404, "http", "HTTP 404 Not Found"),
        (500, "http", "HTTP 500 Internal Server Error"),
    ]
    assert all(o.links == () and o.bytes > 0 for o in outcomes)  # the body links to a trap
    stored = {r.url: r for r in iter_records(tmp_path, with_body=True)}
    assert {url: r.status for url, r in stored.items()} == {gone: 404, broken: 500}
    assert b"/trap/" in (stored[gone].body or b"")


async def test_bad_urls_and_unreachable_hosts_give_clear_outcomes(site: Site) -> None:
    with refused_port() as closed_port:
        good = site.seeds[0]
        dead = f"http://127.0.0.1:{closed_port}/page.html"
        elsewhere = "http://not-allowed.invalid/"
        stuck = site.roots[0] + "_rendezvous/never/2"
        config = config_for(site, allowed_hosts=(*site.hosts, f"127.0.0.1:{closed_port}"))
        with trio.fail_after(15):
            async with Fetcher(config) as fetcher:
                urls = ["not a url", "ftp://127.0.0.1/f", dead, good, elsewhere, "http://:80/"]
                outcomes = await fetcher.fetch_batch(urls)
                fetcher.config = config.evolve(request_timeout_s=0.5, max_page_bytes=100)
                slow, big = await fetcher.fetch_batch([stuck, good])
        assert [o.url for o in outcomes] == [
            "not a url",
            "ftp://127.0.0.1/f",
            dead,
            good,
            elsewhere,
            "http://:80/",
        ]
        kinds = [o.error_kind for o in outcomes]
        assert kinds == ["invalid_url", "invalid_url", "connect", None, "not_allowed",
                         "invalid_url"]
        assert all(isinstance(kind, ErrorKind) for kind in kinds if kind is not None)
        errors = [o.error or "" for o in outcomes]
        assert "not absolute" in errors[0] and "scheme 'ftp'" in errors[1]
        assert errors[2].startswith(f"cannot connect to 127.0.0.1:{closed_port}")
        assert errors[4] == "host not-allowed.invalid is not in allowed_hosts"
        assert all(o.status is None for i, o in enumerate(outcomes) if i != 3)
        assert (slow.error_kind, slow.status) == ("timeout", None)
        assert (big.error_kind, big.links) == ("too_large", ())
        assert big.error == "body larger than 100 bytes (cut)"


async def test_live_config_change_applies_to_the_next_request(site: Site) -> None:
    with trio.fail_after(10):
        async with Fetcher(config_for(site)) as fetcher:
            await fetcher.fetch(site.seeds[0])
            fetcher.config = fetcher.config.evolve(user_agent="changed-agent/2")
            await fetcher.fetch(site.seeds[1])
            fetcher.config = fetcher.config.evolve(allowed_hosts=[site.hosts[0]])
            refused = await fetcher.fetch(site.seeds[1])
            kept = await fetcher.fetch(site.seeds[0])
    assert [r.user_agent for r in site.access_log][:2] == [
        CrawlConfig().user_agent,
        "changed-agent/2",
    ]
    assert refused.outcome.error_kind == "not_allowed" and refused.responses == ()
    assert kept.outcome.ok
    assert all(host_key(link) == site.hosts[0] for link in kept.outcome.links)


def test_outcome_record_round_trip() -> None:
    outcome = FetchOutcome(
        url="http://h/",
        final_url="http://h/x",
        status=200,
        error=None,
        links=("http://h/a",),
        redirects=("http://h/x",),
        digest="sha1:AAAA",
    )
    failed = FetchOutcome(url="http://h/", final_url="http://h/", status=None, error="late",
                          error_kind=ErrorKind.TIMEOUT)
    for record in (outcome, failed):
        assert records.decode(records.encode(record), FetchOutcome) == record
    assert b'"error_kind":"timeout"' in records.encode(failed)


# -- WARC -----------------------------------------------------------------------------------


async def test_warc_round_trip_rotation_duplicates_and_damage(site: Site, tmp_path: Path) -> None:
    max_depth = 2
    store = tmp_path / "warc"
    with trio.fail_after(20):
        async with Fetcher(config_for(site)) as fetcher:
            async with WarcWriter(store, max_bytes=4096, writer_id="t1") as warc:
                outcomes = await crawl(fetcher, site.seeds, max_depth, warc)
            assert warc.current_path is None and len(warc.files) > 1  # rotated, all closed
            assert all(p.name.endswith(".warc.gz") for p in warc_files(store))
            expected = site.reachable_urls(max_depth)
            summary = summarize(store, expected)
            assert summary.complete and summary.duplicates == 0 and not summary.damaged
            assert summary.records == len(expected) == warc.records_written
            # Digests: each final response's digest is the one the outcome reported.
            stored = dict(iter_stored(store))
            for outcome in outcomes.values():
                if outcome.status is not None:
                    assert stored[outcome.final_url] == outcome.digest
            # A redelivered URL is stored again and counted as a duplicate.
            again = WarcWriter(store, writer_id="t2")
            await again.store(await fetcher.fetch(site.seeds[0]))
            await again.store(await fetcher.fetch(site.seeds[0]))
    summary = summarize(store, expected)
    assert summary.duplicates == 2 and summary.duplicated_urls == {site.seeds[0]: 3}
    # A writer killed mid-record leaves an .open file with a cut tail: earlier records count.
    assert again.current_path is not None and again.current_path.name.endswith(".open")
    data = again.current_path.read_bytes()
    again.current_path.write_bytes(data[:-5])  # only the gzip trailer is missing
    damaged = summarize(store, expected)
    assert damaged.duplicated_urls == {site.seeds[0]: 2}
    assert len(damaged.damaged) == 1 and "cut-short record" in damaged.damaged[0][1]
    stored_records = list(iter_records(store, with_body=True))
    seed_record = next(r for r in stored_records if r.url == site.seeds[0])
    assert seed_record.body == site.body(Target(0, "/")) and seed_record.status == 200
    assert ("Content-Type", "text/html; charset=utf-8") in [
        (k.title(), v) for k, v in seed_record.headers
    ]
    assert seed_record.digest == payload_digest(seed_record.body)
    again.close()


# -- the site's command line ----------------------------------------------------------------


async def test_a_taken_port_is_a_one_line_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(FrameworkError, match=f"cannot listen on 127.0.0.1:{port}, "):
            async with serve_site(SMALL, ports=[port, 0, 0]):
                pass


async def test_site_cli_prints_seeds_serves_and_stops_on_sigint(tmp_path: Path) -> None:
    manifest = tmp_path / "site.json"
    argv = python_argv("-m", "examples.fetch_service.site", "--pages", 30, "--hosts", 2,
                       "--manifest", manifest)
    async with spawn(argv, name="site", log_dir=tmp_path, pipe_stdout=True, cwd=REPO) as site:
        assert site.lines is not None
        with trio.fail_after(20):
            lines = await site.lines.until(lambda line: line == "READY")
            served = Site.from_manifest(manifest)
            assert lines == [*served.seeds, "READY"]
            async with httpx.AsyncClient(trust_env=False) as client:
                response = await client.get(served.seeds[0])
            assert response.status_code == 200
            assert response.content == served.body(Target(0, "/"))
            site.process.send_signal(signal.SIGINT)
            assert await site.wait() == 0
