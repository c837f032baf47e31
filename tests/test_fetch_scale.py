"""The partitioned Fetch Service (issue #17), in process: canonical URLs, robots.txt, the
partition store and its checkpoints, partition ownership with epochs on a real ZooKeeper,
and a small crawl of the lazy site that must obey robots.txt and fetch each page once."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import structlog
import trio

from examples.fetch_service.config import CrawlConfig
from examples.fetch_service.fetch import Fetcher
from examples.fetch_service.lazysite import LazySite, LazySpec, serve_lazy_site
from examples.fetch_service.links import InvalidUrlError, canonicalize
from examples.fetch_service.scale import layout
from examples.fetch_service.scale.layout import CrawlReport, PartitionRecord, ScalePaths
from examples.fetch_service.scale.master import PartitionMaster
from examples.fetch_service.scale.ownership import Ownership, PartitionLost
from examples.fetch_service.scale.partition import PartitionContext, PartitionServer, PartitionStats
from examples.fetch_service.scale.robots import RobotsRules
from examples.fetch_service.scale.store import CorruptCheckpoint, PartitionStore, Progress, UrlState
from examples.fetch_service.scale.urls import partition_of
from examples.fetch_service.scale.worker import FetcherStatus, PartitionFetcher, config_digest
from examples.fetch_service.site import SiteSpec, Target, serve_site
from examples.fetch_service.warc import WarcWriter, iter_stored
from framework import ConfigurationError, Session, records
from framework.primitives import Group
from framework.runtime import App
from framework.zk import watch_data

APP = App(layout.APP_NAME)
PATHS = ScalePaths(APP)
BUSY = Progress(pending=1)
IDLE = Progress()


# ---------------------------------------------------------------- canonical URLs (w3lib)


@pytest.mark.parametrize("spelling", [
    "http://127.0.0.1:8001/p/7.html",
    "HTTP://127.0.0.1:8001/p/7.html#top",
    "http://127.0.0.1:8001/x/../p/./7.html",
    "http://127.0.0.1:8001/p/%37.html",
])
def test_equivalent_spellings_have_one_canonical_form(spelling: str) -> None:
    assert canonicalize(spelling) == "http://127.0.0.1:8001/p/7.html"


def test_canonical_rules_beyond_the_path() -> None:
    assert canonicalize("https://Example.COM:443") == "https://example.com/"
    assert canonicalize("http://h:80/a b?b=2&a=1") == "http://h/a%20b?a=1&b=2"
    assert canonicalize("../q.html#x", "http://h:81/a/b/c.html") == "http://h:81/a/q.html"


@pytest.mark.parametrize("bad", ["mailto:x@example.org", "ftp://h/f", "/relative", "http://",
                                 "http://h:99999/"])
def test_uncrawlable_urls_are_refused_with_a_reason(bad: str) -> None:
    with pytest.raises(InvalidUrlError, match="invalid URL"):
        canonicalize(bad)


def test_partition_of_a_host_is_stable_and_in_range() -> None:
    hosts = [f"127.0.0.1:{port}" for port in range(9000, 9064)]
    first = [partition_of(h, 8) for h in hosts]
    assert first == [partition_of(h, 8) for h in hosts]
    assert set(first) <= set(range(8)) and len(set(first)) > 4


# ---------------------------------------------------------------- robots.txt (protego)


def test_robots_answers_are_read_as_rfc_9309_says() -> None:
    rules = RobotsRules.from_answer(200, "User-agent: *\nDisallow: /private/\n")
    assert not rules.allows("http://h/private/1.html", "bot/1")
    assert rules.allows("http://h/p/1.html", "bot/1")
    assert RobotsRules.from_answer(404, "").allows("http://h/private/x", "bot/1")
    assert not RobotsRules.from_answer(503, "").allows("http://h/p/1.html", "bot/1")
    assert not RobotsRules.from_answer(0, "").allows("http://h/p/1.html", "bot/1")


# ---------------------------------------------------------------- the partition store


def test_store_checkpoint_restores_frontier_outbox_and_consumed(tmp_path: Path) -> None:
    store = PartitionStore(tmp_path / "work.sqlite")
    assert store.consume("seeds.json", [("http://h/", "h", 0)]) == [("http://h/", "h", 0)]
    assert store.add([("http://h/", "h", 3)]) == []  # seen: not added twice
    new = store.complete("http://h/", UrlState.DONE,
                         [("http://h/a", "h", 1), ("http://h/", "h", 1)], [(3, "http://g/b", 1)])
    assert new == [("http://h/a", "h", 1)]
    store.set_robots("h", 404, "")
    store.checkpoint(tmp_path / "ckpt.sqlite")
    store.complete("http://h/a", UrlState.DONE, [], [])  # after the checkpoint: not in it
    store.close()
    restored = PartitionStore.restore(tmp_path / "ckpt.sqlite", tmp_path / "again.sqlite")
    assert restored.pending() == [("http://h/a", "h", 1)]
    assert [row[1:] for row in restored.outbox(10)] == [(3, "http://g/b", 1)]
    assert restored.consumed() == {"seeds.json"}
    assert restored.robots() == {"h": (404, "")}
    counts = restored.progress()
    assert (counts.pending, counts.done, counts.outbox) == (1, 1, 1)
    restored.close()


@pytest.mark.parametrize("damage", ["cut", "garbage", "missing"])
def test_a_damaged_checkpoint_is_refused_with_a_clear_error(tmp_path: Path,
                                                           damage: str) -> None:
    store = PartitionStore(tmp_path / "work.sqlite")
    store.add([(f"http://h/{i}", "h", 1) for i in range(2000)])
    store.checkpoint(tmp_path / "ckpt.sqlite")
    store.close()
    data = (tmp_path / "ckpt.sqlite").read_bytes()
    damaged = tmp_path / "damaged.sqlite"
    if damage == "cut":  # what a crash of the file system could leave
        damaged.write_bytes(data[: len(data) // 2])
    elif damage == "garbage":
        damaged.write_bytes(b"not sqlite" * 100)
    with pytest.raises(CorruptCheckpoint, match=f"checkpoint {damaged} cannot be restored"):
        PartitionStore.restore(damaged, tmp_path / "again.sqlite")
    assert not (tmp_path / "again.sqlite").exists()


# ---------------------------------------------------------------- the job


async def test_a_job_needs_a_valid_seed_and_an_app_holds_one_job(session: Session,
                                                               tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    with pytest.raises(ConfigurationError, match=r"at least one valid seed.*not absolute"):
        await layout.start_job(session, APP, ["no scheme", "ftp://h/f"], CrawlConfig(),
                               shared=shared)
    assert await session.exists(PATHS.job) is None
    await layout.start_job(session, APP, ["http://a.example/"], CrawlConfig(), shared=shared)
    with pytest.raises(ConfigurationError, match="already has a crawl job; purge it first"):
        await layout.start_job(session, APP, ["http://b.example/"], CrawlConfig(),
                               shared=shared)


# ---------------------------------------------------------------- ownership with epochs


async def test_a_deposed_owners_publish_is_refused_by_the_server(session: Session) -> None:
    path = PATHS.partition("p000")
    await session.create(path, records.encode(PartitionRecord()), makepath=True)
    first = Ownership(session, path, "fetcher-a")
    second = Ownership(session, path, "fetcher-b")
    with trio.fail_after(10):
        assert (await first.take_over()).epoch == 1
        await first.publish("ckpt-e000001-000001.sqlite", BUSY)
        taken = await second.take_over()
        # the new owner resumes from the old owner's last published checkpoint
        assert (taken.epoch, taken.checkpoint) == (2, "ckpt-e000001-000001.sqlite")
        with pytest.raises(PartitionLost):
            await first.publish("ckpt-e000001-000002.sqlite", IDLE)
        await second.publish("ckpt-e000002-000001.sqlite", IDLE)
    record = records.decode((await session.get(path))[0], PartitionRecord)
    assert (record.epoch, record.owner, record.checkpoint) == (
        2, "fetcher-b", "ckpt-e000002-000001.sqlite")


async def test_two_simultaneous_takeovers_get_distinct_epochs(session: Session) -> None:
    path = PATHS.partition("p001")
    await session.create(path, records.encode(PartitionRecord()), makepath=True)
    owners = [Ownership(session, path, f"fetcher-{i}") for i in range(4)]
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            for owner in owners:
                nursery.start_soon(owner.take_over)
    assert sorted(owner.epoch for owner in owners) == [1, 2, 3, 4]
    last = max(owners, key=lambda o: o.epoch)
    for owner in owners:
        if owner is last:
            await owner.publish("ckpt.sqlite", IDLE)
        else:
            with pytest.raises(PartitionLost):
                await owner.publish("ckpt.sqlite", IDLE)


async def test_a_fetcher_not_assigned_the_partition_cannot_take_it_over(
        session: Session) -> None:
    path = PATHS.partition("p002")
    await session.create(path, records.encode(PartitionRecord()), makepath=True)
    assignment = f"{APP.assignment_dir('fetcher-a')}/p002"
    owner = Ownership(session, path, "fetcher-a", assignment=assignment)
    with trio.fail_after(10):
        with pytest.raises(PartitionLost, match="not assigned"):
            await owner.take_over()
        assert records.decode((await session.get(path))[0], PartitionRecord).epoch == 0
        await session.create(assignment, makepath=True)  # the master assigns it
        assert (await owner.take_over()).epoch == 1


async def test_a_new_owner_waits_until_the_live_previous_owner_releases(
        session: Session) -> None:
    """Hand-over: the next owner takes over once the previous one published its last
    checkpoint as released, or once the previous one is dead (its member node gone)."""
    path = PATHS.partition("p003")
    await session.create(path, records.encode(PartitionRecord()), makepath=True)
    for name in ("fetcher-a", "fetcher-c"):
        await session.create(f"{APP.workers}/{name}", makepath=True)
    waited: list[str] = []
    waiting = trio.Event()

    def on_wait(previous: str) -> None:
        waited.append(previous)
        waiting.set()

    def owner(name: str) -> Ownership:
        return Ownership(session, path, name, members=APP.workers, on_wait=on_wait)

    first, second, third, fourth = (owner(f"fetcher-{c}") for c in "abcd")
    with trio.fail_after(20):
        await first.take_over()
        await first.publish("ckpt-e000001-000001.sqlite", BUSY)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(second.take_over)
            await waiting.wait()
            # the second waits: the first's last checkpoint is still accepted
            await first.publish("ckpt-e000001-000002.sqlite", IDLE, released=True)
        assert (second.epoch, second.record.checkpoint) == (2, "ckpt-e000001-000002.sqlite")
        assert (second.previous.owner, second.previous.released) == ("fetcher-a", True)
        # fetcher-b has no member node (dead): not waited for
        assert (await third.take_over()).epoch == 3 and waited == ["fetcher-a"]
        waiting = trio.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(fourth.take_over)
            await waiting.wait()
            await third.publish("ckpt-e000003-000001.sqlite", BUSY)  # not released
            await session.delete(f"{APP.workers}/fetcher-c")  # fetcher-c dies
        assert (fourth.epoch, fourth.record.checkpoint) == (4, "ckpt-e000003-000001.sqlite")
        assert (fourth.previous.owner, fourth.previous.released) == ("fetcher-c", False)
        with pytest.raises(PartitionLost):
            await third.publish("ckpt-e000003-000002.sqlite", IDLE)


@contextmanager
def logged(event: str) -> Iterator[trio.Event]:
    """An event set when ``event`` is logged (from the trio thread) within the block."""
    seen = trio.Event()

    def spy(_logger: object, _method: str, event_dict: Any) -> Any:
        if event_dict.get("event") == event:
            seen.set()
        return event_dict

    with structlog.testing.capture_logs(processors=[spy]):
        yield seen


async def test_a_corrupt_partition_record_is_waited_out_never_overwritten(
        session: Session) -> None:
    path = PATHS.partition("p004")
    damaged = b'{"epoch":4,"owner":"fetcher-x","checkpoint":"ckpt-e0000'
    await session.create(path, damaged, makepath=True)
    owner = Ownership(session, path, "fetcher-a")
    repaired = PartitionRecord(epoch=4, owner="fetcher-x",
                               checkpoint="ckpt-e000004-000002.sqlite")
    with logged("partition.record_corrupt") as seen, trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(owner.take_over)
            await seen.wait()
            assert (await session.get(path))[0] == damaged  # left for an operator
            await session.set(path, records.encode(repaired))
    assert (owner.epoch, owner.record.checkpoint) == (5, "ckpt-e000004-000002.sqlite")


async def test_a_job_record_that_does_not_decode_is_waited_out(session: Session) -> None:
    job = layout.Job("j1", ("http://a.example/",), 2, "/shared")
    await session.create(PATHS.job, b'{"id":"j1","partitions":"two"}', makepath=True)
    read: list[layout.Job] = []

    async def reader() -> None:
        read.append(await layout.wait_job(session, PATHS))

    with logged("crawl.job_corrupt") as seen, trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(reader)
            await seen.wait()
            assert not read
            await session.set(PATHS.job, records.encode(job))
    assert read == [job]


# ---------------------------------------------------------------- a small crawl, in process


@pytest.fixture
async def lazy_site() -> AsyncIterator[LazySite]:
    async with serve_lazy_site(LazySpec(pages=300, hosts=6, private_every=7,
                                        gone_every=11)) as site:
        yield site


def one_fetcher(tmp_path: Path) -> PartitionFetcher:
    """Fetcher ``f1`` with its directories under ``tmp_path``."""
    return PartitionFetcher(APP, name="f1", warc_dir=tmp_path / "warc",
                            local_dir=tmp_path / "local")


def unhurried(hosts: tuple[str, ...]) -> CrawlConfig:
    """No politeness delay, no depth limit, only ``hosts``."""
    return CrawlConfig(politeness_delay_s=0.0, max_depth=1000, allowed_hosts=hosts,
                       request_timeout_s=5.0)


async def crawl_in_process(hosts: str, chroot: str, session: Session,
                           fetcher: PartitionFetcher,
                           *beside: Callable[[], Awaitable[None]]) -> None:
    """A master in ``session`` and ``fetcher`` in a session of its own (and ``beside``
    tasks) until the master has written the crawl's report; then the fetcher stops."""

    async def serve_fetcher() -> None:
        async with Session(hosts, chroot=chroot, session_timeout=4.0) as own:
            await fetcher.run(own)

    with trio.fail_after(40):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve_fetcher)
            for task in beside:
                nursery.start_soon(task)
            await PartitionMaster(APP, name="m1").run(session)
            fetcher.request_stop()


async def test_small_crawl_obeys_robots_and_fetches_each_page_once(
        zk_hosts: str, chroot: str, lazy_site: LazySite, tmp_path: Path) -> None:
    site = lazy_site
    config = unhurried(site.hosts)
    fetcher = one_fetcher(tmp_path)
    async with Session(zk_hosts, chroot=chroot, session_timeout=4.0) as s:
        await layout.start_job(s, APP, site.seeds, config, shared=tmp_path / "shared",
                               partitions=4, checkpoint_interval_s=0.2)
        await crawl_in_process(zk_hosts, chroot, s, fetcher)
        report = records.decode((await s.get(PATHS.report))[0], CrawlReport)
    expected = site.expected_urls(obey_robots=True)
    stored = [url for url, _ in iter_stored(tmp_path / "warc")]
    assert set(stored) == expected and len(stored) == len(expected)
    assert report.done == len(expected)
    assert report.blocked == len(site.private_urls())
    # the site's own log: each page asked once, robots.txt once per host, no private page
    robots = [u for u in site.requests if u.endswith("/robots.txt")]
    assert sorted(robots) == sorted(f"http://{h}/robots.txt" for h in site.hosts)
    assert not set(site.requests) & site.private_urls()
    assert set(site.requests) - set(robots) == expected
    assert set(site.requests.values()) == {1}


async def test_a_serving_owner_taken_over_stops_and_its_checkpoint_is_refused(
        zk_hosts: str, chroot: str, lazy_site: LazySite, tmp_path: Path) -> None:
    site = lazy_site
    config = CrawlConfig(politeness_delay_s=0.0, max_depth=1000, allowed_hosts=site.hosts)
    async with Session(zk_hosts, chroot=chroot, session_timeout=4.0) as s:
        job = await layout.start_job(s, APP, site.seeds, config, shared=tmp_path / "shared",
                                     partitions=1, checkpoint_interval_s=0.05)
        path = PATHS.partition("p000")
        await s.create(path, records.encode(PartitionRecord()))
        await s.create(f"{APP.assignment_dir('owner')}/p000", makepath=True)
        async with Fetcher(config) as fetcher:
            with WarcWriter(tmp_path / "warc") as warc:
                ctx = PartitionContext(s, "owner", job, PATHS, fetcher, warc, tmp_path / "local",
                                       lambda: config, PartitionStats())
                published: list[str] = []

                async def intrude() -> None:
                    async for snap in watch_data(s, path):
                        assert snap.data is not None
                        record = records.decode(snap.data, PartitionRecord)
                        if record.epoch == 1 and record.checkpoint:
                            published.append(record.checkpoint)
                            break
                    await Ownership(s, path, "intruder").take_over()

                with trio.fail_after(20):
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(intrude)
                        with pytest.raises(PartitionLost):
                            await PartitionServer(ctx, "p000").serve()
        record = records.decode((await s.get(path))[0], PartitionRecord)
    # the intruder owns epoch 2 and resumes from a checkpoint the old owner published
    # before the takeover; nothing the old owner wrote later was accepted
    assert (record.epoch, record.owner) == (2, "intruder")
    assert record.checkpoint is not None and record.checkpoint.startswith("ckpt-e000001-")
    assert record.checkpoint >= published[0]


async def test_a_corrupt_inbox_file_is_set_aside_logged_and_reported(
        zk_hosts: str, chroot: str, lazy_site: LazySite, tmp_path: Path) -> None:
    """An inbox file that is not a batch (here cut short) neither stops its partition nor
    vanishes: it is renamed aside, logged, and named in the crawl's report; the crawl ends
    and every page is fetched (the file only repeated links found elsewhere too)."""
    site = lazy_site
    config = unhurried(site.hosts)
    fetcher = one_fetcher(tmp_path)
    async with Session(zk_hosts, chroot=chroot, session_timeout=4.0) as s:
        job = await layout.start_job(s, APP, site.seeds, config, shared=tmp_path / "shared",
                                     partitions=2, checkpoint_interval_s=0.2)
        inbox = job.directory().inbox("p001")
        (inbox / "f0-e000001-000000001.json").write_bytes(b'{"links":[["http://127.0.0.1')
        with logged("partition.inbox_corrupt") as seen:
            await crawl_in_process(zk_hosts, chroot, s, fetcher)
            assert seen.is_set()
        report = records.decode((await s.get(PATHS.report))[0], CrawlReport)
    assert report.quarantined == ("p001/.f0-e000001-000000001.json.corrupt",)
    assert (inbox / ".f0-e000001-000000001.json.corrupt").exists()
    assert fetcher.stats.corrupt_inbox_files == 1
    stored = {url for url, _ in iter_stored(tmp_path / "warc")}
    assert stored == site.expected_urls(obey_robots=True)


async def test_a_damaged_checkpoint_stops_the_partition_with_a_clear_error(
        session: Session, tmp_path: Path) -> None:
    """The published checkpoint cannot be read: serving raises CorruptCheckpoint (logged as
    ``partition.checkpoint_corrupt``) and nothing is overwritten: neither the file nor the
    record's pointer to it."""
    config = CrawlConfig(politeness_delay_s=0.0)
    job = await layout.start_job(session, APP, ["http://127.0.0.1:9/"], config,
                                 shared=tmp_path / "shared", partitions=1)
    name = "ckpt-e000001-000003.sqlite"
    damaged = job.directory().parts("p000") / name
    damaged.write_bytes(b"SQLite format 3\x00" + b"\x00" * 90)
    path = PATHS.partition("p000")
    await session.create(path, records.encode(PartitionRecord(epoch=1, checkpoint=name)))
    await session.create(f"{APP.assignment_dir('owner')}/p000", makepath=True)
    async with Fetcher(config) as fetcher:
        with WarcWriter(tmp_path / "warc") as warc:
            ctx = PartitionContext(session, "owner", job, PATHS, fetcher, warc,
                                   tmp_path / "local", lambda: config, PartitionStats())
            with logged("partition.checkpoint_corrupt") as seen, trio.fail_after(10):
                with pytest.raises(CorruptCheckpoint, match=f"checkpoint .*{name} cannot be"):
                    await PartitionServer(ctx, "p000").serve()
            assert seen.is_set()
    record = records.decode((await session.get(path))[0], PartitionRecord)
    assert (record.epoch, record.checkpoint, record.idle) == (2, name, False)
    assert damaged.read_bytes() == b"SQLite format 3\x00" + b"\x00" * 90


# ---------------------------------------------------------------- politeness across moves


def _assert_polite(site: LazySite, delay: float) -> None:
    """One host's requests never overlap and are ``delay`` apart (causal bound: a client
    ends its exchange after the server's ``finished``, then waits ``delay``)."""
    assert site.access_log is not None
    by_host: dict[str, list[Any]] = {}
    for access in site.access_log:
        by_host.setdefault(access.url.split("/")[2], []).append(access)
    for host, log in by_host.items():
        log.sort(key=lambda a: a.started)
        for before, after in itertools.pairwise(log):
            assert after.started - before.finished >= delay - 1e-6, (host, before, after)


async def test_politeness_holds_when_partitions_move_to_a_new_fetcher(
        zk_hosts: str, chroot: str, tmp_path: Path) -> None:
    """A second fetcher joins mid-crawl: the master moves partitions (hosts) to it while
    the first one is fetching them.  The old owner stops and releases the partition before
    the new one starts, and the new one keeps the delay after the old one's last request: no
    ZooKeeper lock involved.  The new owner resumes from the old one's last checkpoint, so
    the move redoes nothing (each page stored once)."""
    delay = 0.4  # longer than a takeover takes: without the hand-over, a move breaks it
    # 15 pages a host: about 6 s of fetching at the delay, so the move (the second fetcher
    # starts after 40 requests) happens while partitions still have work
    spec = LazySpec(pages=180, hosts=12, private_every=7, gone_every=11)
    async with serve_lazy_site(spec, access_log=True) as site:
        config = CrawlConfig(politeness_delay_s=delay, max_depth=1000,
                             allowed_hosts=site.hosts, request_timeout_s=5.0)
        fetchers = [PartitionFetcher(APP, name=f"f{i}", warc_dir=tmp_path / "warc" / f"f{i}",
                                     local_dir=tmp_path / "local" / f"f{i}") for i in (1, 2)]
        async with Session(zk_hosts, chroot=chroot, session_timeout=4.0) as s:
            await layout.start_job(s, APP, site.seeds, config, shared=tmp_path / "shared",
                                   partitions=4, checkpoint_interval_s=0.2)

            async def serve(fetcher: PartitionFetcher) -> None:
                async with Session(zk_hosts, chroot=chroot, session_timeout=4.0) as own:
                    await fetcher.run(own)

            async def lead() -> None:
                await PartitionMaster(APP, name="m1").run(s)
                for fetcher in fetchers:
                    fetcher.request_stop()

            with trio.fail_after(90):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(serve, fetchers[0])
                    nursery.start_soon(lead)
                    await site.wait_requests(40)  # the first fetcher owns every host by now
                    nursery.start_soon(serve, fetchers[1])
            report = records.decode((await s.get(PATHS.report))[0], CrawlReport)
        expected = site.expected_urls(obey_robots=True)
        stored = [url for f in ("f1", "f2") for url, _ in iter_stored(tmp_path / "warc" / f)]
        assert set(stored) == expected and len(stored) == len(expected)
        # partitions did move (epoch 2) and both fetchers fetched pages
        assert max(report.epochs.values()) >= 2
        assert fetchers[0].stats.pages > 0 and fetchers[1].stats.pages > 0
        _assert_polite(site, delay)


async def test_a_configuration_rewritten_mid_crawl_reaches_the_fetchers(
        zk_hosts: str, chroot: str, tmp_path: Path) -> None:
    """``crawl/desired`` rewritten while the crawl runs: the master publishes it, the fetcher
    applies it and the crawl ends under it.  The first configuration's
    politeness keeps the crawl going for at least 20 x 0.5 s, whatever the machine's speed."""
    slow = CrawlConfig(politeness_delay_s=0.5, max_depth=1000, request_timeout_s=5.0)
    fast = slow.evolve(politeness_delay_s=0.0, user_agent="agent-after/2")
    fetcher = one_fetcher(tmp_path)
    async with serve_lazy_site(LazySpec(pages=40, hosts=2, private_every=1000)) as site, \
            Session(zk_hosts, chroot=chroot, session_timeout=4.0) as s:
        slow, fast = (c.evolve(allowed_hosts=site.hosts) for c in (slow, fast))
        await layout.start_job(s, APP, site.seeds, slow, shared=tmp_path / "shared",
                               partitions=2, checkpoint_interval_s=0.2)

        async def rewrite_once_applied() -> None:
            await s.ensure_path(APP.workers)
            async for members in Group(s, APP.workers).watch():
                if "f1" not in members:
                    continue
                health = records.decode(members["f1"], FetcherStatus).health
                if health.config == config_digest(slow):  # the fetcher runs under the first
                    break
            await s.set(PATHS.desired, fast.to_json())

        await crawl_in_process(zk_hosts, chroot, s, fetcher, rewrite_once_applied)
    assert fetcher.crawl_config == fast
    stored = {url for url, _ in iter_stored(tmp_path / "warc")}
    assert stored == site.expected_urls()


async def test_the_hand_shaped_site_is_crawled_to_its_ground_truth(
        zk_hosts: str, chroot: str, tmp_path: Path) -> None:
    """Redirects (a two-hop chain, targets on other hosts, a loop) are links routed to their
    host's partition; error pages' links (the traps) are not followed; every URL once."""
    fetcher = one_fetcher(tmp_path)
    spec = SiteSpec(pages=80, hosts=3, seed=5, slow_fraction=0.05, slow_delay_s=0.05,
                    deep_chain=6)
    async with serve_site(spec) as site, \
            Session(zk_hosts, chroot=chroot, session_timeout=4.0) as s:
        config = unhurried(site.hosts)
        await layout.start_job(s, APP, site.seeds, config, shared=tmp_path / "shared",
                               partitions=3, checkpoint_interval_s=0.2)
        await crawl_in_process(zk_hosts, chroot, s, fetcher)
    expected = site.reachable_urls(1000)
    stored = [url for url, _ in iter_stored(tmp_path / "warc")]
    assert set(stored) == expected and len(stored) == len(expected)
    pages = [r for r in site.access_log if r.path != "/robots.txt"]
    assert sorted(site.url(Target(r.host, r.path)) for r in pages) == sorted(expected)
    assert not any(r.path.startswith("/trap/") for r in site.access_log)
