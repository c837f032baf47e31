"""Where servers listen, what they publish, and TLS on the applications' data links (issue
#36), on one machine: the address rule (:mod:`framework.addresses`), a process that refuses
an address it cannot bind in one line, the broker's and Katta's links with mutual TLS (a
client with the right certificate is served; one without a certificate, with a certificate
from another CA, or in plain TCP is refused).  Across hosts: ``tests/test_multihost.py``."""

from __future__ import annotations

import functools
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from examples.katta_like import wire
from examples.katta_like.links import LinkFailed, NodeLinks
from examples.katta_like.node import SearchNode
from examples.message_broker import protocol
from examples.message_broker.client import Producer
from examples.message_broker.cluster import LocalCluster
from examples.message_broker.ctl import wait_placed
from examples.message_broker.protocol import Produce, Produced
from framework import (
    ConfigurationError,
    LinkTls,
    Session,
    check_bindable,
    choose_endpoint,
    route_address,
)
from framework.addresses import parse_address
from tests.helpers.certs import Certs, make_certs

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="no openssl command")


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"), ["127.0.0.1"])


@pytest.fixture
def fresh_tls() -> Iterator[None]:
    """The examples read their TLS variables once per process: read them again."""
    for fn in (protocol.link_tls, protocol.client_context, wire.link_tls, wire.client_context):
        fn.cache_clear()
    yield
    for fn in (protocol.link_tls, protocol.client_context, wire.link_tls, wire.client_context):
        fn.cache_clear()


# ------------------------------------------------------------------------------ the rule


def test_the_address_rule() -> None:
    assert parse_address("10.0.0.5:9092") == ("10.0.0.5", 9092)
    assert parse_address("[::1]:80") == ("::1", 80)
    assert parse_address(":80") == (None, 80)
    assert parse_address("broker-1.example") == ("broker-1.example", None)
    with pytest.raises(ConfigurationError, match="BROKER_LISTEN: port"):
        parse_address("h:99999", what="BROKER_LISTEN")
    # ZooKeeper on loopback (or unknown): loopback; elsewhere: the interface towards it
    assert route_address("127.0.0.1:2181/chroot", environ={}) == "127.0.0.1"
    assert route_address(None, environ={}) == "127.0.0.1"
    assert route_address(None, environ={"FRAMEWORK_ZK_HOSTS": "localhost:2181"}) == "127.0.0.1"
    away = route_address("192.0.2.10:2181", environ={})  # TEST-NET-1: routed, never sent to
    assert away == choose_endpoint(zk_hosts="192.0.2.10:2181").advertise_host
    plain = choose_endpoint(zk_hosts="127.0.0.1:2181", port=7000)
    assert (plain.listen, plain.advertised(7000)) == ("127.0.0.1:7000", "127.0.0.1:7000")
    every = choose_endpoint("0.0.0.0:9000", zk_hosts="127.0.0.1:1")
    assert (every.listen_host, every.port, every.advertised(9000)) == (
        "0.0.0.0", 9000, "127.0.0.1:9000")
    named = choose_endpoint("0.0.0.0", "broker-1.example:443", zk_hosts="127.0.0.1:1")
    assert named.advertised(5555) == "broker-1.example:443"
    given = choose_endpoint("127.0.0.2", zk_hosts="192.0.2.10:2181")
    assert (given.listen_host, given.advertise_host) == ("127.0.0.2", "127.0.0.2")


def test_an_address_that_cannot_be_bound_is_one_line() -> None:
    with pytest.raises(ConfigurationError) as refused:
        check_bindable(choose_endpoint("192.0.2.77:0"), what="KATTA_LISTEN")
    assert "cannot listen on 192.0.2.77:0 (KATTA_LISTEN)" in str(refused.value)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize(("component", "setting"), [
    ("examples.message_broker.app:BrokerServer", "BROKER_LISTEN"),
    ("examples.katta_like.node:SearchNode", "KATTA_LISTEN"),
])
def test_a_server_refuses_an_address_it_cannot_bind(zk_hosts: str, chroot: str, tmp_path: Path,
                                                    component: str, setting: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "framework", "run", component,
         "--zk", zk_hosts, "--chroot", chroot, "--name", "s1"],
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), setting: "192.0.2.77",
             "BROKER_DATA_DIR": str(tmp_path), "KATTA_DATA": str(tmp_path),
             "FRAMEWORK_LOG_LEVEL": "error"},
        cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    assert f"cannot listen on 192.0.2.77:0 ({setting})" in lines[0]


@pytest.mark.parametrize(("component", "listen", "said"), [
    ("examples.katta_like.node:SearchNode", "192.0.2.77", "cannot listen on 192.0.2.77:0"),
    ("examples.katta_like.node:SearchNode", "host:99999", "--listen: port"),
    ("framework.runtime:Worker", "0.0.0.0", "--listen is for a component that serves"),
])
def test_framework_run_listen_flag(zk_hosts: str, chroot: str, tmp_path: Path,
                                   component: str, listen: str, said: str) -> None:
    """``framework run ... --listen``: a serving component binds there (or refuses in one
    line, exit 2); a malformed address or a component that serves nothing is one line."""
    done = subprocess.run(
        [sys.executable, "-m", "framework", "run", component, "--listen", listen,
         "--zk", zk_hosts, "--chroot", chroot, "--name", "s1", "--app", "listen"],
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "KATTA_DATA": str(tmp_path),
             "FRAMEWORK_LOG_LEVEL": "error"},
        cwd=ROOT, capture_output=True, text=True, timeout=60)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert said in lines[0]


def test_metrics_listen_flag_refuses_an_address_it_cannot_bind(zk_hosts: str, chroot: str
                                                              ) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "framework", "run", "framework.runtime:Worker", "--app", "m",
         "--metrics-port", "0", "--metrics-listen", "192.0.2.77", "--zk", zk_hosts,
         "--chroot", chroot],
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "FRAMEWORK_LOG_LEVEL": "error"},
        cwd=ROOT, capture_output=True, text=True, timeout=60)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert "cannot serve metrics on 192.0.2.77:0" in lines[0]


def test_bad_tls_settings_are_one_line(certs: Certs) -> None:
    with pytest.raises(ConfigurationError, match="BROKER_TLS_CA: '/nonexistent' is not"):
        LinkTls.from_env("BROKER", {"BROKER_TLS_CA": "/nonexistent"})
    with pytest.raises(ConfigurationError, match="KATTA_TLS_CERT and KATTA_TLS_KEY go together"):
        LinkTls.from_env("KATTA", {"KATTA_TLS_CERT": str(certs.cert)})
    with pytest.raises(ConfigurationError, match="a TLS server needs BROKER_TLS_CERT"):
        LinkTls.from_env("BROKER", {"BROKER_TLS_CA": str(certs.ca)}).server_context()
    assert LinkTls.from_env("BROKER", {}) is None


# ------------------------------------------------------------------------------ broker


def client(certs: Certs, kind: str) -> LinkTls | None:
    """A client's TLS settings: the right certificate, none, another CA's, or no TLS."""
    if kind == "right":
        return LinkTls(ca=str(certs.ca), cert=str(certs.cert), key=str(certs.key))
    if kind == "no certificate":
        return LinkTls(ca=str(certs.ca))
    if kind == "another CA's certificate":
        return LinkTls(ca=str(certs.ca), cert=str(certs.other_cert), key=str(certs.other_key))
    return None


async def produce_once(address: str, tls: LinkTls | None) -> object:
    conn = await protocol.connect(address, tls=None if tls is None else tls.client_context())
    try:
        await conn.send(Produce(1, "t0", "direct", 0, [b"x"]))  # type: ignore[list-item]
        with trio.fail_after(10):
            return await conn.read()
    finally:
        await conn.aclose()


async def test_broker_links_with_mutual_tls(session: Session, zk_hosts: str, chroot: str,
                                            tmp_path: Path, certs: Certs, fresh_tls: None,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in certs.env("BROKER").items():
        monkeypatch.setenv(name, value)  # the servers and this process's Producer
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            cluster = LocalCluster(zk_hosts, chroot, tmp_path, nursery)
            await cluster.start_with_topics(session, ["t0"], servers=("s1", "s2"))
            await wait_placed(session, ["t0"])
            async with Producer(session) as producer:  # replication and clients over TLS
                for n in range(20):
                    await producer.send("t0", b"%d" % n)
            address = next(s.address for s in cluster.servers.values() if s.primaries)
            assert isinstance(await produce_once(address, client(certs, "right")), Produced)
            for kind in ("no certificate", "another CA's certificate", "plain TCP"):
                with pytest.raises((trio.BrokenResourceError, protocol.PeerClosed,
                                    OSError)):
                    await produce_once(address, client(certs, kind))
            # a client that does not trust the servers' CA refuses them itself
            stranger = LinkTls(ca=str(certs.other_cert))
            with pytest.raises(trio.BrokenResourceError):
                await produce_once(address, stranger)
            nursery.cancel_scope.cancel()


# ------------------------------------------------------------------------------ Katta


async def test_katta_links_with_mutual_tls(certs: Certs) -> None:
    tls = LinkTls(ca=str(certs.ca), cert=str(certs.cert), key=str(certs.key), mutual=True)
    node = SearchNode(name="n0", tls=tls)
    request = wire.ShardRequest("ix", (0,), "q")
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(functools.partial(
                trio.serve_tcp, node.serve_connection, 0, host="127.0.0.1"))
            address = f"127.0.0.1:{listeners[0].socket.getsockname()[1]}"
            for kind in ("right", "no certificate", "another CA's certificate", "plain TCP"):
                settings = client(certs, kind)
                links = NodeLinks(nursery, tls=None if settings is None
                                  else settings.client_context())
                if kind == "right":
                    answer = await links.call(address, wire.Kind.SEARCH, request)
                    assert answer.error is None  # served (the node has no shard: refused)
                else:
                    with pytest.raises(LinkFailed):
                        await links.call(address, wire.Kind.SEARCH, request)
                links.close()
            nursery.cancel_scope.cancel()
