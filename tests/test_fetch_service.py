"""The Fetch Service crawler end to end: real ZooKeeper, real HTTP, real processes for crashes.

The demo site runs in the test's own trio run (its access log is the evidence for what was
requested, with which user agent); the WARC files are checked against the site's ground
truth (:meth:`Site.reachable_urls`).
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio
from helpers.fs_net import refused_port

from examples.fetch_service import ctl
from examples.fetch_service.app import APP_NAME, CrawlMaster, FetchWorker
from examples.fetch_service.config import CrawlConfig
from examples.fetch_service.planning import make_batches
from examples.fetch_service.site import Site, SiteSpec, serve_site
from examples.fetch_service.state import CrawlPaths, SeenSet, loads, url_hash
from examples.fetch_service.warc import iter_records, summarize, warc_files
from framework import ConfigurationError, Session
from framework.primitives import ConfigStore, Group, Lock, Rendezvous
from framework.runtime import App, TaskResult
from framework.zk import watch_children

ROOT = Path(__file__).resolve().parent.parent
APP = App(APP_NAME)
PATHS = CrawlPaths(APP)
SPEC = SiteSpec(pages=120, hosts=4, seed=3, slow_fraction=0.05, slow_delay_s=0.05, deep_chain=6)
SESSION_TIMEOUT = 2.0


@pytest.fixture
async def site() -> AsyncIterator[Site]:
    async with serve_site(SPEC) as served:
        yield served


def crawl_config(site: Site, *extra_hosts: str, **changes: Any) -> CrawlConfig:
    settings: dict[str, Any] = {"politeness_delay_s": 0.01, "request_timeout_s": 5.0,
                                "batch_size": 6, "allowed_hosts": (*site.hosts, *extra_hosts)}
    return CrawlConfig(**(settings | changes))


async def open_session(nursery: trio.Nursery, hosts: str, chroot: str) -> Session:
    async def hold(task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        async with Session(hosts, chroot=chroot, session_timeout=4.0) as s:
            task_status.started(s)
            await trio.sleep_forever()

    return await nursery.start(hold)


async def run_master(session: Session, done: trio.Event) -> None:
    await CrawlMaster(APP, name="master").run(session)
    done.set()


async def report_of(session: Session) -> dict[str, Any]:
    return loads((await session.get(PATHS.report))[0])


async def serve(worker: FetchWorker, hosts: str, chroot: str) -> None:
    """Run ``worker`` in its own session until it is stopped."""
    async with Session(hosts, chroot=chroot, session_timeout=4.0) as s:
        await worker.run(s)


async def crawl_in_process(hosts: str, chroot: str, workers: list[FetchWorker]) -> None:
    """Run a master and ``workers`` until the crawl's report is written and they stopped."""
    async with trio.open_nursery() as nursery:
        for worker in workers:
            nursery.start_soon(serve, worker, hosts, chroot)
        async with Session(hosts, chroot=chroot) as s:
            await CrawlMaster(APP, name="master").run(s)
        for worker in workers:
            worker.request_stop()


# ---------------------------------------------------------------- a crawl end to end


async def test_small_crawl_matches_ground_truth_and_stores_each_page_once(
    zk_hosts: str, chroot: str, site: Site, tmp_path: Path
) -> None:
    depth, delay = 3, 0.01
    expected = site.reachable_urls(depth)
    workers = [FetchWorker(APP, name=f"f{i}", warc_dir=tmp_path) for i in range(3)]
    async with Session(zk_hosts, chroot=chroot) as s:
        job = await ctl.start_job(s, APP, site.seeds,
                                  crawl_config(site, max_depth=depth, politeness_delay_s=delay))
        with trio.fail_after(40):
            await crawl_in_process(zk_hosts, chroot, workers)
        report = await report_of(s)
        seen = 0
        for bucket in await s.children(PATHS.seen):
            seen += len(await s.children(f"{PATHS.seen}/{bucket}"))
    stored = summarize(tmp_path, expected)
    assert stored.complete, (sorted(stored.missing)[:5], sorted(stored.unexpected)[:5])
    assert stored.duplicates == 0 and stored.records == len(expected)
    # every URL requested was requested once, and only those (the site's own log)
    requested = Counter(f"http://127.0.0.1:{r.port}{r.path}" for r in site.access_log)
    assert set(requested) == expected and set(requested.values()) == {1}
    # the seen-set holds every URL requested (seeds, links, redirect hops), once
    assert seen == len(expected)
    totals = report["totals"]
    assert report["job"] == job and totals["responses"] == len(expected)
    assert totals["levels"] == depth + 1 and totals["failed_batches"] == 0
    assert set(totals["errors"]) <= {"http", "redirect_loop"} and totals["errors"]["http"] > 0
    assert sum(w.pages for w in workers) == len(expected)
    assert sum(w.batches for w in workers) >= 3  # the work was shared
    # politeness across fetchers: one host's requests never overlap and keep the delay
    # (causal bound: a client ends its exchange after the server's `finished`)
    for port in site.ports:
        log = sorted((r for r in site.access_log if r.port == port), key=lambda r: r.started)
        for before, after in itertools.pairwise(log):
            assert after.started - before.finished >= delay - 1e-6, (before, after)


def test_batches_are_per_host_bounded_and_interleaved() -> None:
    urls = [f"http://h{h}.example/p{i}" for h in (1, 2) for i in range(5)] + ["http://h3.example/"]
    batches = make_batches(reversed(urls), 2, id_prefix="j-L001")
    assert [b.host for b in batches] == ["h1.example", "h2.example", "h3.example",
                                         "h1.example", "h2.example", "h1.example", "h2.example"]
    assert all(len(b.urls) <= 2 and {u.split("/")[2] for u in b.urls} == {b.host}
               for b in batches)
    assert sorted(u for b in batches for u in b.urls) == sorted(urls)
    assert [b.id for b in batches][:2] == ["j-L001-00000", "j-L001-00001"]
    assert make_batches(urls, 2, id_prefix="j-L001") == batches  # deterministic


async def test_seen_set_claims_are_create_if_absent_and_bucketed(session: Session) -> None:
    seen = SeenSet(session, PATHS)
    urls = [f"http://h.example/{i}" for i in range(300)]
    first = await seen.claim_many(urls, 2, "link")
    again = await seen.claim_many(urls[:10], 1, "hop")
    assert all(s.depth == 2 and s.kind == "link" for s in first.values())
    assert all(s.depth == 2 and s.kind == "link" for s in again.values())  # first claim wins
    assert await seen.unseen([*urls[:3], "http://h.example/new"]) == ["http://h.example/new"]
    buckets = await session.children(PATHS.seen)
    assert set(buckets) == {url_hash(url)[:2] for url in [*urls, *first]}
    assert all(len(b) == 2 for b in buckets)


# ---------------------------------------------------------------- a fetcher killed mid-batch


class Tarpit:
    """A tiny HTTP server: ``/hang...`` never answers the first time it is asked."""

    def __init__(self) -> None:
        self.port = 0
        self.asked: Counter[str] = Counter()
        self.hanging = trio.Event()

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def url(self, path: str) -> str:
        return f"http://{self.host}{path}"

    async def serve(self, nursery: trio.Nursery) -> None:
        listeners = await nursery.start(trio.serve_tcp, self._handle, 0)
        self.port = listeners[0].socket.getsockname()[1]

    async def _handle(self, stream: trio.SocketStream) -> None:
        async with stream:
            request = b""
            while b"\r\n\r\n" not in request:
                chunk = await stream.receive_some(4096)
                if not chunk:
                    return
                request += chunk
            path = request.split(b" ")[1].decode()
            self.asked[path] += 1
            if path.startswith("/hang") and self.asked[path] == 1:
                self.hanging.set()
                await trio.sleep_forever()
            body = f"<html><body>{path}</body></html>".encode()
            await stream.send_all(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nConnection: close\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
            )


def spawn(component: str, hosts: str, chroot: str, name: str, logs: Path,
          env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """``python -m framework run examples.fetch_service.app:<component>`` as a process."""
    log = open(logs / f"{name}.log", "wb")  # noqa: SIM115 - owned by the child
    return subprocess.Popen(
        [sys.executable, "-m", "framework", "run", f"examples.fetch_service.app:{component}",
         "--zk", hosts, "--chroot", chroot, "--name", name,
         "--session-timeout", str(SESSION_TIMEOUT)],
        env=os.environ | {"PYTHONPATH": str(ROOT), "FRAMEWORK_LOG_LEVEL": "info"} | (env or {}),
        stdout=log, stderr=subprocess.STDOUT,
    )


def kill_all(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


async def test_fetcher_killed_mid_batch_its_urls_are_fetched_anyway(
    zk_hosts: str, chroot: str, site: Site, tmp_path: Path
) -> None:
    warc = tmp_path / "warc"
    tarpit = Tarpit()
    depth = 1
    victim: subprocess.Popen[bytes] | None = None
    try:
        async with trio.open_nursery() as nursery:
            await tarpit.serve(nursery)
            trap = [tarpit.url(p) for p in ("/a.html", "/b.html", "/hang.html")]
            expected = site.reachable_urls(depth) | set(trap)
            s = await open_session(nursery, zk_hosts, chroot)
            await ctl.start_job(s, APP, [*site.seeds, *trap],
                                crawl_config(site, tarpit.host, max_depth=depth))
            finished = trio.Event()
            nursery.start_soon(run_master, s, finished)
            with trio.fail_after(40):
                victim = spawn("FetchWorker", zk_hosts, chroot, "doomed", tmp_path,
                               {"FETCH_WARC_DIR": str(warc)})
                await tarpit.hanging.wait()  # its batch is half done: /hang.html is pending
                victim.kill()
                rescuer = FetchWorker(APP, name="rescuer", warc_dir=warc)
                nursery.start_soon(rescuer.run, await open_session(nursery, zk_hosts, chroot))
                await finished.wait()
            rescuer.request_stop()
            part = loads((await s.get(PATHS.part(0, 0)))[0])
            trap_batch = next(b["id"] for b in part if b["host"] == tarpit.host)
            record = TaskResult.decode((await s.get(APP.result_path(trap_batch)))[0])
            report = await report_of(s)
            nursery.cancel_scope.cancel()
    finally:
        kill_all([victim] if victim is not None else [])
    assert victim.returncode == -9
    stored = summarize(warc, expected)
    assert stored.complete, (sorted(stored.missing), sorted(stored.unexpected))
    # the victim stored what it had before /hang.html (and maybe pages of its other batch);
    # the rescuer stored each page once: every duplicate is a victim's record redone
    by_victim = Counter(r.url for r in iter_records(warc) if "-doomed-" in r.file.name)
    by_rescuer = Counter(r.url for r in iter_records(warc) if "-rescuer-" in r.file.name)
    assert set(by_victim.values()) == {1} and set(by_rescuer.values()) == {1}
    assert set(stored.duplicated_urls) <= set(by_victim)
    assert [stored.counts[url] for url in trap] == [2, 2, 1]
    assert trap[2] not in by_victim
    assert record.ok and record.worker == "rescuer" and record.attempts == 2
    assert [o["url"] for o in record.result["outcomes"]] == trap
    assert tarpit.asked["/hang.html"] == 2 and report["totals"]["failed_batches"] == 0
    assert any("-doomed-" in f.name and f.name.endswith(".open") for f in warc_files(warc))


# ---------------------------------------------------------------- the master killed mid-level


async def test_master_killed_mid_level_the_standby_finishes_the_crawl(
    zk_hosts: str, chroot: str, site: Site, tmp_path: Path
) -> None:
    depth = 3
    expected = site.reachable_urls(depth)
    gate = site.hosts[3]  # not a seed host: its first pages are links of the seeds
    workers = [FetchWorker(APP, name=f"f{i}", warc_dir=tmp_path) for i in range(2)]
    masters: list[subprocess.Popen[bytes]] = []
    try:
        async with trio.open_nursery() as nursery:
            s = await open_session(nursery, zk_hosts, chroot)
            await ctl.start_job(s, APP, site.seeds, crawl_config(site, max_depth=depth))
            lock_path = PATHS.host_lock(gate)
            await s.ensure_path(lock_path)
            await s.ensure_path(APP.masters)
            with trio.fail_after(60):
                async with Lock(s, lock_path).acquire():  # the level cannot finish meanwhile
                    masters.append(spawn("CrawlMaster", zk_hosts, chroot, "m1", tmp_path))
                    for worker in workers:
                        nursery.start_soon(serve, worker, zk_hosts, chroot)
                    async for snap in watch_children(s, lock_path):
                        if len(snap.children) >= 2:  # a fetcher waits for the gate host
                            break
                    masters.append(spawn("CrawlMaster", zk_hosts, chroot, "m2", tmp_path))
                    async for snap in watch_children(s, APP.masters):
                        if len(snap.children) == 2:  # m2 stands by
                            break
                    level = loads((await s.get(PATHS.progress))[0])["level"]
                    masters[0].kill()
                    async for data in Rendezvous(s, APP.rendezvous).watch():
                        if data and loads(data)["name"] == "m2":
                            break  # the standby leads (the gate is released now)
                report = await ctl.wait_report(s, APP)
                await trio.to_thread.run_sync(masters[1].wait, abandon_on_cancel=True)
            nursery.cancel_scope.cancel()
    finally:
        kill_all(masters)
    assert [m.returncode for m in masters] == [-9, 0]
    assert report["master"] == "m2" and 1 <= level <= depth
    assert report["totals"]["levels"] == depth + 1 and report["totals"]["failed_batches"] == 0
    stored = summarize(tmp_path, expected)
    assert stored.complete, (sorted(stored.missing)[:5], sorted(stored.unexpected)[:5])
    # the new master resumed the level from ZooKeeper: it queued nothing again
    assert stored.duplicates == 0
    requested = Counter(f"http://127.0.0.1:{r.port}{r.path}" for r in site.access_log)
    assert set(requested) == expected and set(requested.values()) == {1}


# ---------------------------------------------------------------- configuration changed live


async def test_configuration_change_mid_crawl_takes_effect(
    zk_hosts: str, chroot: str, site: Site, tmp_path: Path
) -> None:
    gate = site.hosts[3]  # not a seed host: its first pages are links of the seeds
    workers = [FetchWorker(APP, name=f"f{i}", warc_dir=tmp_path) for i in range(2)]
    async with trio.open_nursery() as nursery:
        s = await open_session(nursery, zk_hosts, chroot)
        await ctl.start_job(s, APP, site.seeds,
                            crawl_config(site, max_depth=5, user_agent="agent-before"))
        lock_path = PATHS.host_lock(gate)
        await s.ensure_path(lock_path)
        with trio.fail_after(40):
            async with Lock(s, lock_path).acquire():  # hold the gate host's politeness lock
                finished = trio.Event()
                nursery.start_soon(run_master, s, finished)
                for worker in workers:
                    nursery.start_soon(worker.run, await open_session(nursery, zk_hosts, chroot))
                async for snap in watch_children(s, lock_path):
                    if len(snap.children) >= 2:  # a fetcher waits for the gate host
                        break
                progress = loads((await s.get(PATHS.progress))[0])
                level = progress["level"]  # this level cannot finish while we hold the gate
                assert progress["state"] == "fetching" and 1 <= level <= 3
                await ctl.set_config(s, APP, ["user_agent=agent-after",
                                              f"max_depth={level + 1}"])
                async for members in Group(s, APP.workers).watch():
                    agents = {json.loads(d)["health"]["user_agent"] for d in members.values()}
                    if len(members) == 2 and agents == {"agent-after"}:
                        break  # every fetcher applied the new configuration
            await finished.wait()
        for worker in workers:
            worker.request_stop()
        report = await report_of(s)
        nursery.cancel_scope.cancel()
    new_depth = level + 1
    expected = site.reachable_urls(new_depth)
    assert expected < site.reachable_urls(5)  # lowering max_depth mattered
    stored = summarize(tmp_path, expected)
    assert stored.complete and stored.duplicates == 0
    assert report["max_depth"] == new_depth and report["totals"]["levels"] == new_depth + 1
    depth_of = site.reachable_depths(new_depth)
    agents: dict[str, set[str]] = {"before": set(), "after": set()}
    for r in site.access_log:
        url = f"http://127.0.0.1:{r.port}{r.path}"
        if depth_of[url] == 0:
            agents["before"].add(r.user_agent)  # the seeds were fetched before the change
        elif depth_of[url] > level:
            agents["after"].add(r.user_agent)  # planned after the change
    assert agents == {"before": {"agent-before"}, "after": {"agent-after"}}


# ---------------------------------------------------------------- bad seeds, dead hosts


async def test_bad_seeds_and_unreachable_host_are_reported_and_do_not_stall(
    zk_hosts: str, chroot: str, site: Site, tmp_path: Path
) -> None:
    with refused_port() as closed_port:
        dead = f"127.0.0.1:{closed_port}"
        seeds = [*site.seeds, "htp://typo.example/", "no scheme at all", f"http://{dead}/"]
        warned: list[str] = []
        async with Session(zk_hosts, chroot=chroot) as s:
            await ctl.start_job(s, APP, seeds, crawl_config(site, dead, max_depth=2),
                                warn=warned.append)
            with trio.fail_after(30):
                await crawl_in_process(zk_hosts, chroot,
                                       [FetchWorker(APP, name="f", warc_dir=tmp_path)])
            report = await report_of(s)
            state = await ctl.crawl_state(s, APP)
        assert len(warned) == 2 and "htp://typo.example/" in warned[0]
        errors = {sample["url"]: sample for sample in report["totals"]["samples"]}
        assert report["totals"]["errors"]["invalid_url"] == 2
        assert "scheme 'htp' is not http or https" in errors["htp://typo.example/"]["error"]
        assert "not absolute" in errors["no scheme at all"]["error"]
        unreachable = errors[f"http://{dead}/"]
        assert unreachable["kind"] == "connect"
        assert f"cannot connect to {dead}" in unreachable["error"]
        stored = summarize(tmp_path, site.reachable_urls(2))
        assert stored.complete and stored.duplicates == 0
        assert state["report"] == report and state["progress"]["state"] == "finished"


async def test_a_job_without_a_crawlable_seed_is_refused(session: Session) -> None:
    with pytest.raises(ConfigurationError, match="no crawlable seed"):
        await ctl.start_job(session, APP, ["ftp://x/"], CrawlConfig())
    assert await session.exists(PATHS.job) is None


async def test_second_job_is_refused_until_reset(session: Session) -> None:
    await ctl.start_job(session, APP, ["http://a.example/"], CrawlConfig())
    with pytest.raises(ConfigurationError, match="already has a crawl job"):
        await ctl.start_job(session, APP, ["http://b.example/"], CrawlConfig())
    with pytest.raises(ConfigurationError, match="not finished"):
        await ctl.reset_job(session, APP)
    await session.ensure_path(APP.workers)
    async with Group(session, APP.workers).join("f", b"{}"):
        with pytest.raises(ConfigurationError, match=r"0 master\(s\) and 1 fetcher\(s\) "):
            await ctl.reset_job(session, APP, force=True)
    assert await ctl.reset_job(session, APP, force=True)
    await ctl.start_job(session, APP, ["http://b.example/"], CrawlConfig())


def test_ctl_reports_bad_settings_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert ctl.main(["set", "--zk", "127.0.0.1:1", "max_dept=3"]) == 2
    assert ctl.main(["set", "--zk", "127.0.0.1:1", "max_depth=-1"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("ctl: error: unknown crawl config setting(s) max_dept")
    assert err[1] == "ctl: error: CrawlConfig.max_depth must be an integer >= 0, got -1"


async def test_ctl_set_changes_the_published_configuration(session: Session) -> None:
    await ctl.start_job(session, APP, ["http://a.example/"], CrawlConfig(max_depth=4))
    before, after = await ctl.set_config(session, APP, ["max_depth=2", "user_agent=x/1"])
    assert (before.max_depth, after.max_depth, after.user_agent) == (4, 2, "x/1")
    # the master publishes the wanted configuration to the fetchers (ready-znode config)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(CrawlMaster(APP, name="m").run, session)
        with trio.fail_after(10):
            async for published in ConfigStore(session, APP.config).watch():
                if CrawlConfig.from_dict(published) == after:
                    break
        nursery.cancel_scope.cancel()


# ---------------------------------------------------------------- the demo, small


def test_demo_kills_the_master_and_checks_every_page(tmp_path: Path) -> None:
    """``make demo`` in small: separate processes, a kill -9 of the active master."""
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-m", "examples.fetch_service.demo", "--out", str(out), "--pages",
         "80", "--hosts", "3", "--max-depth", "3", "--fetchers", "2",
         "--session-timeout", str(SESSION_TIMEOUT), "--timeout", "90"],
        env=os.environ | {"PYTHONPATH": str(ROOT)}, cwd=tmp_path, stdin=subprocess.DEVNULL,
        capture_output=True, text=True, timeout=150,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["ok"] and not summary["missing"] and not summary["unexpected"]
    assert summary["stored_urls"] == summary["reachable_pages"] > 0
    assert (summary["killed_master"], summary["new_master"]) == ("master-1", "master-2")
    assert "every reachable page was fetched and stored" in done.stdout
    assert sorted(p.name for p in (out / "logs").iterdir()) == [
        "fetcher-1.log", "fetcher-2.log", "master-1.log", "master-2.log", "site.log"]
