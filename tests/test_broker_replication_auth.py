"""Authenticated links between servers (issue #25, item 5): with a shared secret, replication
runs over signed frames; an unsigned fetch, a frame signed with another key, and even a
signed fetch claiming a newer epoch change nothing - the primary's term goes on."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from examples.message_broker import protocol
from examples.message_broker.client import Producer
from examples.message_broker.cluster import LocalCluster
from examples.message_broker.layout import BrokerPaths, PrimaryRecord, decode
from examples.message_broker.protocol import ErrorCode, ErrorReply, Fetch
from framework import Session
from tests.test_broker_failover import wait_full_isr

PATHS = BrokerPaths()
SECRET = b"the servers' shared secret"


async def forged_fetch(address: str, epoch: int, secret: bytes | None) -> ErrorCode:
    """One fetch frame claiming ``epoch``, signed with ``secret`` (``None``: unsigned): the
    code it was refused with."""
    conn = await protocol.connect(address)
    try:
        frame = protocol.encode(Fetch(7, "a", epoch, 0, "intruder", "x"), secret)
        await conn.send_raw(frame)
        reply = await conn.read()
        assert isinstance(reply, ErrorReply), reply
        return reply.code
    finally:
        await conn.aclose()


async def test_forged_fetch_frames_change_nothing(
    session: Session, zk_hosts: str, chroot: str, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch, captured_logs: list[dict[str, object]]
) -> None:
    monkeypatch.setenv(protocol.SECRET_ENV, SECRET.decode())
    with trio.fail_after(40):
        async with trio.open_nursery() as nursery:
            cluster = LocalCluster(zk_hosts, chroot, tmp_path, nursery, session_timeout=4.0)
            await cluster.start_with_topics(session, ["a"])
            await wait_full_isr(session, ["a"], {"s1", "s2"})  # replication over signed frames
            data, stat = await session.get(PATHS.primary("a"))
            primary = cluster.servers[decode(data, PrimaryRecord).server]
            epoch = stat.czxid
            async with Producer(session) as producer:
                await producer.send("a", b"before")

                # unsigned, with a newer epoch: refused, nothing asked of ZooKeeper
                code = await forged_fetch(primary.address, epoch + 1000, None)
                assert code is ErrorCode.UNAUTHENTICATED
                # signed with another secret: bad_mac, that connection closed
                code = await forged_fetch(primary.address, epoch + 1000, b"guessed")
                assert code is ErrorCode.BAD_MAC
                # signed with the right secret (a confused or compromised peer), repeated:
                # checked against ZooKeeper, which says the term is still this primary's
                for _ in range(5):
                    code = await forged_fetch(primary.address, epoch + 1000, SECRET)
                    assert code is ErrorCode.STALE_EPOCH

                await producer.send("a", b"after")  # still acknowledged by the same term
            assert [t.epoch for t in primary.terms if t.topic == "a"] == [epoch]
            assert primary.terms[-1].ended is None  # the term has not ended
            assert (await session.exists(PATHS.primary("a"))).czxid == epoch
            nursery.cancel_scope.cancel()
    events = [e["event"] for e in captured_logs]
    assert "broker.deposed_by_fetch" not in events
    assert events.count("broker.unauthenticated_fetch") == 1
    assert events.count("broker.newer_epoch_refused") >= 1


async def test_without_a_secret_a_forged_newer_epoch_is_checked_against_zookeeper(
    session: Session, zk_hosts: str, chroot: str, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(protocol.SECRET_ENV, raising=False)
    with trio.fail_after(40):
        async with trio.open_nursery() as nursery:
            cluster = LocalCluster(zk_hosts, chroot, tmp_path, nursery, session_timeout=4.0)
            await cluster.start_with_topics(session, ["a"])
            await wait_full_isr(session, ["a"], {"s1", "s2"})
            data, stat = await session.get(PATHS.primary("a"))
            primary = cluster.servers[decode(data, PrimaryRecord).server]
            for _ in range(5):
                code = await forged_fetch(primary.address, stat.czxid + 1000, None)
                assert code is ErrorCode.STALE_EPOCH
            async with Producer(session) as producer:
                await producer.send("a", b"after")
            assert [t.epoch for t in primary.terms if t.topic == "a"] == [stat.czxid]
            assert primary.terms[-1].ended is None
            nursery.cancel_scope.cancel()
