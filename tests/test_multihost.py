"""Every process on its own host (issue #36): the runtime, the message broker, Katta and the
crawler deployed across machines, on the network-namespace harness
(:mod:`framework.testing.netns`, ``docs/netns.md``).

Hosts (one network namespace each, one bridge; shared by every test of the module, with the
ensemble): ``zk1``-``zk3`` hold the three ZooKeeper members, ``a``-``d`` the applications'
processes, and the **client host** is this test process, in the root namespace, which is on
the bridge with an address of its own (``10.203.X.254``): everything it does (submit, read
results, produce, consume, query) crosses the network to the other hosts.  No process is
given an address: each one publishes what :mod:`framework.addresses` chooses (the interface
towards ZooKeeper), so a server that published loopback, or listened on it, fails here.

* runtime: master on ``a``, workers on ``b`` and ``c`` (``b``'s metrics endpoint read from
  the client host); tasks submitted from the client host, results read there, both workers
  ran some;
* broker: servers on ``a``, ``b``, ``c`` and the controller on ``d``, every link in mutual
  TLS; produce and consume from the client host; kill -9 of a primary's process; then a
  backup cut off from its primary only (both still reach ZooKeeper): its primary drops it
  within the lag limit and publishing goes on; nothing acknowledged is lost;
* Katta: master on ``d``, nodes on ``a``, ``b``, ``c``, query links in mutual TLS; queries
  from the client host while a node is killed (kill -9): no failed, partial or wrong query;
* crawler: the demo site on ``d``, master on ``a``, fetchers on ``b`` and ``c``; every page
  of the site is stored.

Needs root, iproute2, iptables and openssl; skipped otherwise, in one line saying why.
"""

from __future__ import annotations

import secrets
import shutil
import sys
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import httpx
import pytest
import trio

from examples.fetch_service.config import CrawlConfig
from examples.fetch_service.lazysite import LazySite
from examples.fetch_service.scale import layout as crawl_layout
from examples.fetch_service.warc import iter_stored
from examples.katta_like import wire
from examples.katta_like.client import SearchClient
from examples.katta_like.cluster import Cluster
from examples.katta_like.corpus import sample_queries
from examples.katta_like.ctl import wait_replicated
from examples.katta_like.load import LoadStats, reference, run_load
from examples.message_broker import protocol
from examples.message_broker.client import Producer
from examples.message_broker.cluster import ProcessCluster, primaries
from examples.message_broker.ctl import create_topics, wait_placed
from examples.message_broker.layout import BrokerPaths, Isr, decode, find_server
from framework import Session, ZooKeeperEnsemble
from framework.runtime import App, Client
from framework.testing import Child, spawn
from framework.testing.netns import VirtualNetwork, cleanup_stale, netns_available
from framework.zk import wait_exists, watch_children
from framework.zkserver import Placement
from tests.helpers.certs import Certs, make_certs
from tests.test_broker_failover import Load, check_delivery, wait_full_isr
from tests.test_broker_replication_lag import events, wait_out_of_isr, wait_settled
from tests.test_katta_crash import SPEC as KATTA_SPEC
from tests.test_katta_crash import checked, start

_UNAVAILABLE = netns_available() or (None if shutil.which("openssl") else "no openssl command")
pytestmark = [
    pytest.mark.netns,
    pytest.mark.skipif(_UNAVAILABLE is not None, reason=f"multihost: {_UNAVAILABLE}"),
]

ROOT = Path(__file__).resolve().parents[1]
APP_HOSTS = ["a", "b", "c", "d"]
TIMEOUT = 3.0  # every application process's session timeout
LAG_LIMIT = 1.5  # the broker servers'


@pytest.fixture(scope="module")
def net() -> Iterator[VirtualNetwork]:
    cleanup_stale()
    with VirtualNetwork.create(["zk1", "zk2", "zk3", *APP_HOSTS]) as network:
        yield network


@pytest.fixture(scope="module")
def zk(net: VirtualNetwork) -> Iterator[ZooKeeperEnsemble]:
    """Three members, each on its own host."""
    places = [Placement(net[h].address, net[h].netns) for h in ("zk1", "zk2", "zk3")]
    with ZooKeeperEnsemble(3, placement=places) as ensemble:
        yield ensemble


@pytest.fixture(scope="module")
def zk_hosts(zk: ZooKeeperEnsemble) -> str:
    """The ensemble on three hosts (the conftest's ``session`` connects to it)."""
    return zk.connect_string


@pytest.fixture(scope="module")
def certs(net: VirtualNetwork, tmp_path_factory: pytest.TempPathFactory) -> Certs:
    """One certificate naming every application host, and the CA that signed it."""
    return make_certs(tmp_path_factory.mktemp("certs"), [net[h].address for h in APP_HOSTS])


@pytest.fixture
def network(net: VirtualNetwork) -> Iterator[VirtualNetwork]:
    """The module's network, whole again after the test (whatever happened in it)."""
    try:
        yield net
    finally:
        net.heal()


@pytest.fixture
def tls_env(certs: Certs, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """Mutual TLS for the broker's and Katta's links, in this process (the client host,
    read afresh) and in the children (the returned variables)."""
    env = certs.env("BROKER") | certs.env("KATTA")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    caches = (protocol.link_tls, protocol.client_context, wire.link_tls, wire.client_context)
    for fn in caches:
        fn.cache_clear()
    yield env
    for fn in caches:
        fn.cache_clear()


def on(net: VirtualNetwork, host: str) -> list[str]:
    """The prefix that runs a command line on ``host``."""
    return net[host].command()


def child_env(**extra: str) -> dict[str, str]:
    return {"PYTHONPATH": str(ROOT), "FRAMEWORK_LOG_LEVEL": "warning", **extra}


@asynccontextmanager
async def processes() -> AsyncIterator[AsyncExitStack]:
    async with AsyncExitStack() as stack:
        yield stack


async def run_on(stack: AsyncExitStack, net: VirtualNetwork, host: str, name: str,
                 argv: list[str], logs: Path, env: dict[str, str] | None = None, *,
                 pipe_stdout: bool = False) -> Child:
    """``python argv...`` on ``host`` (killed -9 when ``stack`` closes)."""
    return await stack.enter_async_context(spawn(
        [*on(net, host), sys.executable, *argv], name=name, log_dir=logs,
        env=child_env(**(env or {})), cwd=ROOT, pipe_stdout=pipe_stdout))


def framework_run(component: str, zk_hosts: str, chroot: str, name: str,
                  *extra: str) -> list[str]:
    return ["-m", "framework", "run", component, "--zk", zk_hosts, "--chroot", chroot,
            "--name", name, "--session-timeout", str(TIMEOUT), *extra]


# ------------------------------------------------------------------------------ runtime


async def test_runtime_master_and_workers_on_their_hosts(
        network: VirtualNetwork, zk_hosts: str, chroot: str, session: Session,
        tmp_path: Path) -> None:
    net = network
    app = App("mh")
    with trio.fail_after(60):
        async with processes() as stack:
            await run_on(stack, net, "a", "master", framework_run(
                "tests.helpers.mh_app:MhMaster", zk_hosts, chroot, "master"), tmp_path)
            for host in ("b", "c"):
                await run_on(stack, net, host, f"w-{host}", framework_run(
                    "tests.helpers.mh_app:MhWorker", zk_hosts, chroot, f"w-{host}",
                    *(["--metrics-port", "9464"] if host == "b" else [])), tmp_path)
            await session.ensure_path(app.workers)
            async for snap in watch_children(session, app.workers):
                if {"w-b", "w-c"} <= set(snap.children):
                    break
            client = Client(session, app)
            keys = [f"n{n:03d}" for n in range(30)]
            for n, key in enumerate(keys):
                await client.submit("echo", {"n": n}, key=key)
            results = [await client.result(key, wait=True) for key in keys]
            assert all(r is not None and r.ok for r in results)
            assert [r.result["n"] for r in results] == list(range(30))  # type: ignore[union-attr]
            assert {r.result["by"] for r in results} == {"w-b", "w-c"}  # type: ignore[union-attr]
            async with httpx.AsyncClient() as http:  # b's metrics, from the client host
                reply = await http.get(f"http://{net['b'].address}:9464/metrics")
            assert reply.status_code == 200
            assert 'framework_tasks_done_total{app="mh"}' in reply.text


# ------------------------------------------------------------------------------ broker


async def test_broker_servers_on_their_hosts_survive_kill9_and_a_cut_link(
        network: VirtualNetwork, zk_hosts: str, chroot: str, session: Session,
        tmp_path: Path, tls_env: dict[str, str]) -> None:
    net = network
    paths = BrokerPaths()
    hosts = {"s1": "a", "s2": "b", "s3": "c", "c1": "d"}
    topics = ["t0", "t1", "t2"]
    cluster = ProcessCluster(zk_hosts, chroot, tmp_path / "data", tmp_path / "logs",
                             session_timeout=TIMEOUT, log_level="info",
                             prefixes={n: on(net, h) for n, h in hosts.items()})
    env = {"BROKER_LAG_LIMIT": str(LAG_LIMIT), "BROKER_SECRET": secrets.token_hex(16),
           **tls_env}
    servers = ("s1", "s2", "s3")
    try:
        with trio.fail_after(90):
            for name in servers:
                await cluster.spawn("server", name, env)
            await cluster.spawn("controller", "c1", env)
            for name in servers:
                await cluster.wait_joined(session, name)
                # where it is found: its discovery instance (the address it advertises)
                address = await find_server(session, paths, name)
                assert address is not None
                assert address.rpartition(":")[0] == net[hosts[name]].address
            await wait_exists(session, paths.app.rendezvous)
            await create_topics(session, topics)
            await wait_placed(session, topics)
            await wait_full_isr(session, topics, set(servers))
            load = Load(topics)
            async with Producer(session, ack_timeout=3.0) as producer, \
                    trio.open_nursery() as nursery:
                for topic in topics:
                    nursery.start_soon(load.run, producer, topic)
                await load.until(150)
                # a backup cut off from its primary only: both still reach ZooKeeper
                await wait_settled(session, topics)  # two replicas each, both in sync
                leaders = await primaries(session, topics)
                topic = "t1"
                primary = leaders[topic]
                isr = decode((await session.get(paths.isr(topic)))[0], Isr)
                backup = next(s for s in isr.in_sync if s != primary)
                before = len(load.acked[topic])
                cut = trio.current_time()
                net.partition(hosts[primary], hosts[backup])
                await wait_out_of_isr(session, topic, backup)
                dropped_after = trio.current_time() - cut
                assert await session.exists(f"{paths.nodes}/{backup}") is not None
                assert await session.exists(f"{paths.nodes}/{primary}") is not None
                while len(load.acked[topic]) < before + 50:  # publishing goes on
                    await load.until(load.total + 1)
                print(f"\nbroker: backup {backup} cut off from primary {primary}: out of the "
                      f"in-sync set after {dropped_after:.2f} s (lag limit {LAG_LIMIT} s, "
                      f"session timeout {TIMEOUT} s); longest ack gap "
                      f"{load.longest_gap[topic]:.2f} s")
                net.heal()
                # kill -9 of a primary's process: its backup takes over, publishing goes on
                await wait_settled(session, topics)
                leaders = await primaries(session, topics)
                victim = leaders["t0"]
                await cluster.kill9(victim)
                before = len(load.acked["t0"])
                while len(load.acked["t0"]) < before + 50:
                    await load.until(load.total + 1)
                assert (await primaries(session, ["t0"]))["t0"] != victim
                nursery.cancel_scope.cancel()
            dups: Counter[str] = await check_delivery(session, load, "checker")
            print(f"broker: {load.total} acknowledged, all delivered; duplicates {dict(dups)}")
    finally:
        await cluster.stop_all()
    # the primary found its backup silent (and placed a replacement) while both were alive
    slow = [e for e in events(cluster, primary) if e.get("event") == "broker.backup_slow"]
    assert (topic, backup) in {(e["topic"], e["backup"]) for e in slow}


# ------------------------------------------------------------------------------ Katta


async def test_katta_nodes_on_their_hosts_a_node_killed_no_failed_query(
        network: VirtualNetwork, zk_hosts: str, chroot: str, session: Session,
        tmp_path: Path, tls_env: dict[str, str]) -> None:
    net = network
    hosts = {"m1": "d", "n1": "a", "n2": "b", "n3": "c"}
    queries = sample_queries(KATTA_SPEC, 40)
    expected = reference(KATTA_SPEC, tmp_path, list(dict.fromkeys(queries)), 10)
    async with Cluster(zk_hosts, chroot, tmp_path, session_timeout=TIMEOUT,
                       env={"KATTA_CHILD_LOG_LEVEL": "warning", **tls_env},
                       prefixes={n: on(net, h) for n, h in hosts.items()}) as cluster:
        with trio.fail_after(90):
            await start(cluster, session, tmp_path)
            stats, stop = LoadStats(), trio.Event()
            async with SearchClient.open(session) as client, trio.open_nursery() as nursery:
                deployment = await client.deployment("docs")
                addresses = {a.rpartition(":")[0] for nodes in deployment.values()
                             for a in nodes.values()}
                assert addresses <= {net[h].address for h in ("a", "b", "c")}, addresses
                nursery.start_soon(run_load, client, queries, expected, stats, stop)
                await cluster.kill9("n2")
                sent_at_kill = stats.sent
                await wait_replicated(session, "docs", 2, exclude={"n2"})
                assert stats.sent > sent_at_kill  # the load ran through the recovery
                stop.set()
            checked(stats)
            print(f"\nkatta: {stats.answered} queries from the client host across a kill -9, "
                  f"none failed")


# ------------------------------------------------------------------------------ crawler


def stored_urls(warc_root: Path) -> set[str]:
    urls: set[str] = set()
    for directory in sorted(warc_root.iterdir()) if warc_root.is_dir() else []:
        urls.update(url for url, _digest in iter_stored(directory))
    return urls


async def test_crawler_master_fetchers_and_site_on_their_hosts(
        network: VirtualNetwork, zk_hosts: str, chroot: str, session: Session,
        tmp_path: Path) -> None:
    net = network
    app = App(crawl_layout.APP_NAME)
    manifest = tmp_path / "site.json"
    with trio.fail_after(90):
        async with processes() as stack:
            # no --host: the site follows the rule (the interface towards ZooKeeper)
            site_proc = await run_on(stack, net, "d", "site", [
                "-m", "examples.fetch_service.lazysite", "--pages", "120", "--hosts", "3",
                "--manifest", str(manifest)], tmp_path,
                {"FRAMEWORK_ZK_HOSTS": zk_hosts}, pipe_stdout=True)
            assert site_proc.lines is not None
            await site_proc.lines.until(lambda line: line == "READY")
            site = LazySite.from_manifest(manifest)
            assert site.host == net["d"].address
            config = CrawlConfig(politeness_delay_s=0.0, max_depth=1_000_000,
                                 request_timeout_s=10.0, fetch_concurrency=8,
                                 allowed_hosts=site.hosts, warc_max_bytes=20_000_000)
            await crawl_layout.start_job(session, app, site.seeds, config,
                                         shared=tmp_path / "shared", partitions=4,
                                         checkpoint_interval_s=0.5)
            for host, role, name in (("a", "PartitionMaster", "master-1"),
                                     ("b", "PartitionFetcher", "fetcher-b"),
                                     ("c", "PartitionFetcher", "fetcher-c")):
                await run_on(stack, net, host, name, framework_run(
                    f"examples.fetch_service.app:{role}", zk_hosts, chroot, name), tmp_path,
                    {"FETCH_WARC_DIR": str(tmp_path / "warc" / name),
                     "FETCH_LOCAL_DIR": str(tmp_path / "local" / name)})
            report = crawl_layout.ScalePaths(app).report
            await session.ensure_path(report.rpartition("/")[0])
            await wait_exists(session, report)
    expected = site.expected_urls()
    stored = stored_urls(tmp_path / "warc")
    assert expected - stored == set()
    assert stored - expected == set()
    by_fetcher = {d.name: len(list(iter_stored(d))) for d in (tmp_path / "warc").iterdir()}
    print(f"\ncrawler: {len(stored)} pages from the site on d, per fetcher {by_fetcher}")
