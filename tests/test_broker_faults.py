"""Message broker faults in one process against the real ZooKeeper: bad input, a crashed
backup, a primary frozen behind proxies (ZooKeeper link and client links), graceful shutdown."""

from __future__ import annotations

import struct
from pathlib import Path

import msgpack
import pytest
import trio

from examples.message_broker import protocol
from examples.message_broker.client import BrokerError, Producer
from examples.message_broker.cluster import LocalCluster, wait_server_gone
from examples.message_broker.ctl import create_topics, request_shutdown, wait_placed
from examples.message_broker.layout import (
    BrokerPaths,
    Isr,
    PrimaryRecord,
    decode,
    decode_replicas,
    find_server,
)
from examples.message_broker.protocol import ErrorCode, ErrorReply
from framework import Session
from framework.testing import TcpProxy
from framework.zk import watch_data
from framework.zkserver.launcher import free_ports
from tests.test_broker_failover import Load, check_delivery, wait_full_isr

PATHS = BrokerPaths()


async def primary_of(session: Session, topic: str) -> PrimaryRecord:
    return decode((await session.get(PATHS.primary(topic)))[0], PrimaryRecord)


async def placement_of(session: Session, topic: str) -> tuple[str, ...]:
    return decode_replicas((await session.get(PATHS.placement(topic)))[0])


def codes(frames: list[protocol.Message]) -> list[ErrorCode]:
    return [f.code for f in frames if isinstance(f, ErrorReply)]


async def raw(address: str, data: bytes) -> list[protocol.Message]:
    """Send raw bytes, then read frames until the server closes the connection."""
    conn = await protocol.connect(address)
    await conn.stream.send_all(data)
    await conn.stream.send_eof()  # type: ignore[attr-defined]  # half-close: we are done
    frames = []
    try:
        while True:
            frames.append(await conn.read())
    except (protocol.PeerClosed, trio.BrokenResourceError):
        pass
    await conn.aclose()
    return frames


async def start(nursery: trio.Nursery, session: Session, zk_hosts: str, chroot: str,
                tmp_path: Path, servers: int = 3, timeout: float = 4.0) -> LocalCluster:
    cluster = LocalCluster(zk_hosts, chroot, tmp_path, nursery, session_timeout=timeout)
    for i in range(1, servers + 1):
        await cluster.start_server(f"s{i}", session)
    await cluster.start_controller("c1")
    return cluster


async def test_bad_input_gets_a_clear_error_and_the_server_keeps_serving(
    session: Session, zk_hosts: str, chroot: str, tmp_path: Path
) -> None:
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await start(nursery, session, zk_hosts, chroot, tmp_path, servers=2)
            await create_topics(session, ["a"])
            await wait_placed(session, ["a"])
            await wait_full_isr(session, ["a"], {"s1", "s2"})
            address = await find_server(session, PATHS, (await primary_of(session, "a")).server)
            assert address is not None
            body = msgpack.packb({"op": "produce", "id": 1}, use_bin_type=True)
            # wrong protocol version
            frames = await raw(address, struct.pack(">BI", 9, len(body)) + body)
            assert codes(frames) == [ErrorCode.BAD_VERSION]
            # frame larger than the maximum
            frames = await raw(address, struct.pack(">BI", 1, protocol.MAX_FRAME + 1))
            assert codes(frames) == [ErrorCode.TOO_LARGE]
            # malformed body (0xc1 is never valid msgpack) and a body that is not a map
            frames = await raw(address, struct.pack(">BI", 1, 3) + b"\xc1\xc1\xc1")
            assert codes(frames) == [ErrorCode.BAD_FRAME]
            frames = await raw(address, struct.pack(">BI", 1, 3) + msgpack.packb([1, 2]))
            assert codes(frames) == [ErrorCode.BAD_FRAME]
            # truncated frame (header says 100 bytes, 10 arrive, then the sender closes):
            # a bad_frame error naming what arrived, then that connection is closed
            frames = await raw(address, struct.pack(">BI", 1, 100) + b"x" * 10)
            assert codes(frames) == [ErrorCode.BAD_FRAME]
            assert isinstance(frames[0], ErrorReply) and "truncated frame" in frames[0].message
            frames = await raw(address, b"\x01\x00")  # even the header cut short
            assert codes(frames) == [ErrorCode.BAD_FRAME]
            # request errors keep the connection open: unknown topic, oversized message
            conn = await protocol.connect(address)

            async def refusal(request: bytes | protocol.Produce) -> ErrorReply:
                if isinstance(request, bytes):
                    await conn.send_raw(request)
                else:
                    await conn.send(request)
                reply = await conn.read()
                assert isinstance(reply, ErrorReply), reply
                return reply

            reply = await refusal(protocol.Produce(1, "zzz", "p", 0, [b"x"]))
            assert (reply.id, reply.code) == (1, ErrorCode.UNKNOWN_TOPIC)
            oversized = b"x" * (protocol.MAX_MESSAGE + 1)
            reply = await refusal(protocol.Produce(2, "a", "p", 0, [oversized]))
            assert (reply.id, reply.code) == (2, ErrorCode.TOO_LARGE)
            # whole frames that are no request: refused, the connection goes on
            for body in ({"op": "nonsense", "id": 3}, {"op": "produce", "id": 3},
                         {"op": "produce", "id": 3, "topic": "a", "producer": "p", "seq": 0,
                          "msgs": ["text, not bytes"]}):
                packed = msgpack.packb(body, use_bin_type=True)
                reply = await refusal(struct.pack(">BI", 1, len(packed)) + packed)
                assert (reply.id, reply.code) == (3, ErrorCode.BAD_REQUEST)
                assert "Traceback" not in reply.message
            await conn.send(protocol.Produce(4, "a", "p", 0, [b"fine"]))
            assert await conn.read() == protocol.Produced(4, 1)
            await conn.aclose()
            async with Producer(session) as producer:
                with pytest.raises(BrokerError, match="exceeds the maximum"):
                    await producer.send("a", b"x" * (protocol.MAX_MESSAGE + 1))
                await producer.send("a", b"still serving")
            nursery.cancel_scope.cancel()


@pytest.mark.parametrize("mode", ["refuse", "one_copy"])
async def test_backup_crash_primary_goes_on_and_a_new_backup_catches_up(
    session: Session, zk_hosts: str, chroot: str, tmp_path: Path, mode: str
) -> None:
    with trio.fail_after(40):
        async with trio.open_nursery() as nursery:
            cluster = await start(nursery, session, zk_hosts, chroot, tmp_path)
            await create_topics(session, ["x"], mode=mode)
            await wait_placed(session, ["x"])
            await wait_full_isr(session, ["x"], {"s1", "s2", "s3"})
            primary = (await primary_of(session, "x")).server
            backup = next(s for s in await placement_of(session, "x") if s != primary)
            load = Load(["x"])
            async with Producer(session) as producer, trio.open_nursery() as sending:
                sending.start_soon(load.run, producer, "x")
                await load.until(100)
                cluster.crash(backup)
                await wait_server_gone(session, backup)
                await load.until(load.total + 100)
                live = {"s1", "s2", "s3"} - {backup}
                await wait_full_isr(session, ["x"], live)
                await load.until(load.total + 100)
                sending.cancel_scope.cancel()
            assert (await primary_of(session, "x")).server == primary  # it went on
            await check_delivery(session, load, "checker")
            nursery.cancel_scope.cancel()


async def test_frozen_primary_never_acks_after_the_backup_took_over(
    session: Session, zk_hosts: str, chroot: str, tmp_path: Path
) -> None:
    port = free_ports(1)[0]
    with TcpProxy(zk_hosts) as zk_link, TcpProxy(("127.0.0.1", port)) as client_link, \
            trio.fail_after(40):
        async with trio.open_nursery() as nursery:
            cluster = LocalCluster(zk_hosts, chroot, tmp_path, nursery, session_timeout=2.0)
            s1 = await cluster.start_server("s1", session, hosts=zk_link.address, port=port,
                                            address=client_link.address)
            s2 = await cluster.start_server("s2", session)
            await cluster.start_controller("c1")
            await create_topics(session, ["f"])
            await wait_placed(session, ["f"])
            await wait_full_isr(session, ["f"], {"s1", "s2"})
            assert (await primary_of(session, "f")).server == "s1"
            await cluster.start_server("s3", session)
            load = Load(["f"])
            async with Producer(session, ack_timeout=1.0) as producer, \
                    trio.open_nursery() as sending:
                sending.start_soon(load.run, producer, "f")
                await load.until(100)
                zk_link.freeze()
                client_link.freeze()
                await load.until(load.total + 100)  # s2 took over and acknowledges
                assert (await primary_of(session, "f")).server == "s2"
                client_link.unfreeze()
                zk_link.unfreeze()
                await wait_full_isr(session, ["f"], {"s1", "s2", "s3"})
                sending.cancel_scope.cancel()
            await check_delivery(session, load, "checker")
            old = [t for t in s1.terms if t.topic == "f"]
            new = [t for t in s2.terms if t.topic == "f"]
            assert old and new and old[0].ended is not None
            assert old[0].ended <= new[0].started  # the deposed term ended before the new one
            assert new[0].epoch > old[0].epoch  # a newer epoch
            nursery.cancel_scope.cancel()


async def test_shutdown_hands_primaries_over_and_loses_nothing(
    session: Session, zk_hosts: str, chroot: str, tmp_path: Path
) -> None:
    topics = ["a", "b", "c", "d"]
    with trio.fail_after(40):
        async with trio.open_nursery() as nursery:
            cluster = await start(nursery, session, zk_hosts, chroot, tmp_path)
            await create_topics(session, topics)
            await wait_placed(session, topics)
            await wait_full_isr(session, topics, {"s1", "s2", "s3"})
            load = Load(topics)
            async with Producer(session) as producer, trio.open_nursery() as sending:
                for topic in topics:
                    sending.start_soon(load.run, producer, topic)
                await load.until(200)
                assert cluster.servers["s1"].primaries  # it has something to hand over
                await request_shutdown(session, ["s1"])
                await wait_server_gone(session, "s1")
                await load.until(load.total + 200)
                await wait_full_isr(session, topics, {"s2", "s3"})
                sending.cancel_scope.cancel()
            assert not cluster.servers["s1"].primaries
            await check_delivery(session, load, "checker")
            nursery.cancel_scope.cancel()


async def test_a_new_copy_of_a_backup_counts_in_sync_only_once_it_caught_up(
    session: Session, zk_hosts: str, chroot: str, tmp_path: Path
) -> None:
    """A backup server that comes back with less than it had (a process restarted under the
    same name while its old link is still open here) must not be counted in sync at once:
    it could take over with a log missing acknowledged messages."""
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await start(nursery, session, zk_hosts, chroot, tmp_path, servers=2)
            await create_topics(session, ["g"])
            await wait_placed(session, ["g"])
            await wait_full_isr(session, ["g"], {"s1", "s2"})
            primary = await primary_of(session, "g")
            backup = next(s for s in await placement_of(session, "g") if s != primary.server)
            async with Producer(session) as producer:
                for i in range(20):
                    await producer.send("g", b"%d" % i)  # acknowledged: on both servers
            stat = await session.exists(PATHS.primary("g"))
            assert stat is not None
            # the backup's new incarnation: same name, a fresh copy, from offset 0
            address = await find_server(session, PATHS, primary.server)
            assert address is not None
            conn = await protocol.connect(address)
            await conn.send(protocol.Fetch(1, "g", stat.czxid, 0, backup, "new-incarnation"))
            reply = await conn.read()
            assert isinstance(reply, protocol.Fetched)
            assert reply.start == 0 and len(reply.records) == 20
            assert reply.in_sync is False
            async for snap in watch_data(session, PATHS.isr("g")):
                if backup not in decode(snap.data, Isr).in_sync:
                    break  # dropped from ZooKeeper's in-sync set: it can no longer take over
            # once it holds everything acknowledged it counts again
            await conn.send(protocol.Fetch(2, "g", stat.czxid, 20, backup, "new-incarnation"))
            reply = await conn.read()
            assert isinstance(reply, protocol.Fetched) and reply.in_sync is True
            assert backup in decode((await session.get(PATHS.isr("g")))[0], Isr).in_sync
            await conn.aclose()
            nursery.cancel_scope.cancel()


async def test_a_new_term_shows_only_what_the_in_sync_backup_holds(
    session: Session, zk_hosts: str, chroot: str, tmp_path: Path, proxy: TcpProxy
) -> None:
    """Records a primary appended but never got acknowledged must not become visible when it
    starts a new term: its backup may lack them, and a subscriber that saw them would skip
    whatever the backup later stores at those offsets after a failover."""
    port = free_ports(1)[0]
    with TcpProxy(("127.0.0.1", port)) as link, trio.fail_after(40):
        async with trio.open_nursery() as nursery:
            cluster = LocalCluster(zk_hosts, chroot, tmp_path, nursery)
            # s1 reaches ZooKeeper through ``proxy``: freezing it ends s1's term at its trust
            # deadline while its session (and primary znode) survives
            s1 = await cluster.start_server("s1", session, port=port, address=link.address,
                                            hosts=proxy.address)
            await cluster.start_server("s2", session)
            await cluster.start_controller("c1")
            await create_topics(session, ["h"])
            await wait_placed(session, ["h"])
            await wait_full_isr(session, ["h"], {"s1", "s2"})
            assert (await primary_of(session, "h")).server == "s1"
            async with Producer(session) as producer:
                for i in range(10):
                    await producer.send("h", b"%d" % i)  # acknowledged: on s1 and s2
            link.freeze()  # s2 fetches from s1 through the proxy: replication stops
            direct = await protocol.connect(s1.listen_address)
            await direct.send(protocol.Produce(1, "h", "raw", 0, [b"u%d" % i for i in range(5)]))
            await s1.logs["h"].wait_beyond(14)  # on s1 only: not acknowledged
            # s1's term ends (its ZooKeeper link frozen past the trust deadline); its session
            # and znode survive, so once connected again it starts a new term of the epoch
            proxy.freeze()
            reply = await direct.read()
            assert isinstance(reply, ErrorReply)
            assert (reply.id, reply.code) == (1, ErrorCode.NOT_PRIMARY)
            proxy.unfreeze()
            await s1.wait_terms("h", 2)
            assert len({term.epoch for term in s1.terms if term.topic == "h"}) == 1  # same
            sub = await protocol.connect(s1.listen_address)
            await sub.send(protocol.Subscribe(3, "h", 0))
            assert isinstance(await sub.read(), protocol.Subscribed)
            frame = await sub.read()
            assert isinstance(frame, protocol.Msgs)
            assert frame.start == 0 and len(frame.records) == 10
            link.unfreeze()  # s2 gets the 5 records; once it holds them they are visible
            seen = 10
            while seen < 15:
                frame = await sub.read()
                assert isinstance(frame, protocol.Msgs) and frame.start == seen
                seen += len(frame.records)
            assert seen == 15
            for conn in (direct, sub):
                await conn.aclose()
            nursery.cancel_scope.cancel()
