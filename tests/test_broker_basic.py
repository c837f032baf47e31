"""Message broker, in one process against the real ZooKeeper: placement, publish, subscribe,
backup catch-up, idempotent retries, bad input."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from examples.message_broker import protocol
from examples.message_broker.client import Producer, Router, Subscriber, UnknownTopicError
from examples.message_broker.cluster import LocalCluster, primaries
from examples.message_broker.ctl import create_topics, wait_placed
from examples.message_broker.layout import (
    BrokerPaths,
    NodeRecord,
    PrimaryRecord,
    ServerPayload,
    decode,
    decode_replicas,
    discovery,
    server_instance,
)
from examples.message_broker.protocol import ErrorCode, ErrorReply, Produce
from examples.message_broker.server import BrokerServer
from framework import Session, records
from framework.zk import watch_children, watch_data
from framework.zkserver.launcher import four_letter
from tests.test_broker_failover import wait_full_isr

PATHS = BrokerPaths()


async def _collect(sub: Subscriber, want: int, seen: dict[str, set[bytes]]) -> None:
    count = 0
    async for msg in sub:
        seen.setdefault(msg.topic, set()).add(msg.payload)
        sub.ack(msg)
        count += 1
        if sum(len(v) for v in seen.values()) >= want:
            return


async def test_publish_subscribe_three_servers(session: Session, zk_hosts: str, chroot: str,
                                               tmp_path: Path) -> None:
    topics = [f"t{i}" for i in range(6)]
    with trio.fail_after(40):
        async with trio.open_nursery() as nursery:
            cluster = LocalCluster(zk_hosts, chroot, tmp_path, nursery)
            for name in ("s1", "s2", "s3"):
                await cluster.start_server(name, session)
            await cluster.start_controller("c1")
            await create_topics(session, topics)
            await wait_placed(session, topics)
            placed = await primaries(session, topics)
            assert set(placed) == set(topics)
            async with Producer(session) as producer:
                async with trio.open_nursery() as sends:
                    for topic in topics:
                        for i in range(50):
                            sends.start_soon(producer.send, topic, f"{topic}-{i}".encode())
            seen: dict[str, set[bytes]] = {}
            async with Subscriber(session, "sub1", topics) as sub:
                await _collect(sub, 300, seen)
            assert {t: len(v) for t, v in seen.items()} == {t: 50 for t in topics}
            nursery.cancel_scope.cancel()


async def test_unknown_topic_is_a_clear_error(session: Session, zk_hosts: str, chroot: str,
                                             tmp_path: Path) -> None:
    with trio.fail_after(20):
        await session.ensure_path("/apps/broker/topics")
        async with Producer(session) as producer:
            with pytest.raises(UnknownTopicError, match="unknown topic 'nope'"):
                await producer.send("nope", b"x")


def test_ctl_user_mistakes_are_one_line(zk_hosts: str, chroot: str,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    from examples.message_broker import ctl

    base = ["--zk", zk_hosts, "--chroot", chroot]
    assert ctl.main([*base, "create", "bad/name"]) == 2
    assert ctl.main([*base, "describe", "missing"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("broker ctl: error:") for line in err)
    assert ctl.main([*base, "create", "good", "--mode", "one_copy"]) == 0
    assert ctl.main([*base, "prohibit-migration"]) == 0
    assert ctl.main([*base, "status", "--json"]) == 0
    out = capsys.readouterr().out
    assert '"migration_prohibited": true' in out and '"mode": "one_copy"' in out


async def test_subscriber_resumes_from_its_committed_position(
    session: Session, zk_hosts: str, chroot: str, tmp_path: Path
) -> None:
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            cluster = LocalCluster(zk_hosts, chroot, tmp_path, nursery)
            await cluster.start_with_topics(session, ["r"])
            async with Producer(session) as producer:
                for i in range(100):
                    await producer.send("r", str(i).encode())
            first: list[int] = []
            with trio.CancelScope() as crash:
                async with Subscriber(session, "durable", ["r"], commit_interval=3600) as sub:
                    async for msg in sub:
                        first.append(int(msg.payload))
                        sub.ack(msg)
                        if len(first) == 40:
                            await sub.commit()  # a batched commit: one write for 40 acks
                        if len(first) == 60:
                            crash.cancel()  # acked 60, committed 40
                            break
            committed = await session.get("/apps/broker/topics/r/subscribers/durable")
            assert b'"offset":40' in committed[0] or b'"offset":60' in committed[0]
            second: list[int] = []
            async with Subscriber(session, "durable", ["r"]) as sub:
                async for msg in sub:
                    second.append(int(msg.payload))
                    sub.ack(msg)
                    if second[-1] == 99:
                        break
            assert second[0] in (40, 60) and second == list(range(second[0], 100))
            assert set(first) | set(second) == set(range(100))
            nursery.cancel_scope.cancel()


def test_connection_options_go_before_or_after_the_command() -> None:
    from examples.message_broker import ctl

    for argv in (["status", "--zk", "h:1", "--timeout", "3"],
                 ["--zk", "h:1", "--timeout", "3", "status"]):
        args = ctl.parse(argv)
        assert (args.zk, args.chroot, args.timeout) == ("h:1", None, 3.0)
    assert ctl.parse(["list"]).timeout == 30.0


class CountingSession(Session):
    """Counts every request this session sends to ZooKeeper."""

    requests = 0

    async def _call(self, request: Any) -> Any:
        self.requests += 1
        return await super()._call(request)


def zxid(zk_hosts: str) -> int:
    """The ZooKeeper server's last zxid: every write moves it."""
    port = int(zk_hosts.split(",")[0].rsplit(":", 1)[1])
    line = next(x for x in four_letter(port, "srvr").splitlines() if x.startswith("Zxid:"))
    return int(line.split(":")[1].strip(), 16)


async def test_the_data_path_costs_zookeeper_nothing_per_message(
    session: Session, zk_hosts: str, chroot: str, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Once routes are known, publishing and receiving messages (one per batch here) sends
    no request to ZooKeeper at all, and nothing in the cluster writes to it."""
    monkeypatch.setattr(BrokerServer, "status_interval", 3600.0)  # status: once, at start
    with trio.fail_after(40):
        async with trio.open_nursery() as nursery:
            cluster = LocalCluster(zk_hosts, chroot, tmp_path, nursery)
            await cluster.start_with_topics(session, ["z0", "z1"])
            await wait_full_isr(session, ["z0", "z1"], {"s1", "s2"})
            async with CountingSession(zk_hosts, chroot=chroot) as psession, \
                    CountingSession(zk_hosts, chroot=chroot) as ssession, \
                    Producer(psession, batch_max=1) as producer, \
                    Subscriber(ssession, "quiet", ["z0", "z1"],
                               commit_interval=3600) as sub:
                for topic in ("z0", "z1"):
                    await producer.send(topic, b"warm-up")  # reads each route once
                got = 0
                async for msg in sub:
                    sub.ack(msg)
                    got += 1
                    if got == 2:
                        break
                before = (psession.requests, ssession.requests, zxid(zk_hosts))
                for i in range(150):
                    for topic in ("z0", "z1"):
                        await producer.send(topic, b"m%d" % i)
                async for msg in sub:
                    sub.ack(msg)
                    got += 1
                    if got == 302:
                        break
                assert (psession.requests, ssession.requests, zxid(zk_hosts)) == before
            nursery.cancel_scope.cancel()


async def test_batches_of_large_messages_fit_in_a_frame(
    session: Session, zk_hosts: str, chroot: str, tmp_path: Path
) -> None:
    """Messages queued while a batch is in flight form the next batch; a batch of large
    messages must still fit in one frame (8 x 900 KB would not)."""
    with trio.fail_after(40):
        async with trio.open_nursery() as nursery:
            cluster = LocalCluster(zk_hosts, chroot, tmp_path, nursery)
            await cluster.start_with_topics(session, ["big"])
            payloads = [bytes([i]) * 900_000 for i in range(8)]
            async with Producer(session) as producer, trio.open_nursery() as sends:
                for payload in payloads:
                    sends.start_soon(producer.send, "big", payload)
            got: list[bytes] = []
            async with Subscriber(session, "big-reader", ["big"]) as sub:
                async for msg in sub:
                    got.append(msg.payload)
                    if len(got) == len(payloads):
                        break
            assert sorted(got) == sorted(payloads)
            nursery.cancel_scope.cancel()


async def test_a_route_to_a_server_not_serving_the_topic_is_retried(
    session: Session, zk_hosts: str, chroot: str, tmp_path: Path
) -> None:
    """``unknown_topic`` from a server while the topic exists means a stale route (the
    znode names a server that does not serve the topic yet): retry, do not fail the send."""
    with trio.fail_after(40):
        async with trio.open_nursery() as nursery:
            cluster = LocalCluster(zk_hosts, chroot, tmp_path, nursery)
            s1 = await cluster.start_server("s1", session)
            await create_topics(session, ["late"])  # no controller yet: nobody serves it
            await session.create(PATHS.primary("late"),
                                 records.encode(PrimaryRecord("s1")), ephemeral=True)
            conn = await protocol.connect(s1.address)
            await conn.send(Produce(1, "late", "p", 0, [b"x"]))
            assert await conn.read() == ErrorReply(1, ErrorCode.UNKNOWN_TOPIC,
                                                   "s1 does not serve topic 'late'")
            await conn.aclose()
            async with Producer(session) as producer, trio.open_nursery() as sends:
                refused = trio.Event()
                forget = getattr(producer.router, "forget", lambda topic: None)

                def forget_and_tell(topic: str) -> None:
                    refused.set()
                    forget(topic)

                producer.router.forget = forget_and_tell  # type: ignore[method-assign]
                sends.start_soon(producer.send, "late", b"first")
                await refused.wait()  # s1 answered unknown_topic; the producer goes on
                await session.delete(PATHS.primary("late"))  # the stale route goes away
                await cluster.start_server("s2", session)
                await cluster.start_controller("c1")  # places the topic: s1 or s2 serves it
            assert producer.retries > 0
            nursery.cancel_scope.cancel()


async def test_servers_are_found_through_service_discovery(
    session: Session, zk_hosts: str, chroot: str, tmp_path: Path
) -> None:
    """A server registers its advertised address as a discovery instance (no address in
    its ``nodes/`` or ``primary`` records); a client routes a topic by the ``primary``
    znode's server name and that server's instance, waits while the server is not
    registered, and drops the cached route when the instance goes."""
    with trio.fail_after(40):
        async with trio.open_nursery() as nursery:
            cluster = LocalCluster(zk_hosts, chroot, tmp_path, nursery)
            s1 = await cluster.start_server("s1", session)
            [instance] = await discovery(session).instances(PATHS.service)
            assert (instance.id, instance.endpoint) == ("s1", s1.address)
            assert records.structure(instance.payload, ServerPayload).tls is False
            raw, _ = await session.get(f"{PATHS.nodes}/s1")
            assert b"address" not in raw
            await create_topics(session, ["ghosted"])  # no controller: nobody serves it
            await session.create(PATHS.primary("ghosted"), records.encode(PrimaryRecord("s9")),
                                 ephemeral=True)
            router = Router(session, PATHS)
            found: list[tuple[str, int]] = []
            routed = trio.Event()

            async def route() -> None:
                found.append(await router.primary("ghosted"))
                routed.set()

            ghost = server_instance(PATHS, "s9", "10.9.9.9:4242", tls=False)
            async with trio.open_nursery() as waiting:
                waiting.start_soon(route)
                await trio.testing.wait_all_tasks_blocked()
                assert not found  # s9 is named as primary but not registered: no route
                async with discovery(session).register(ghost):
                    await routed.wait()  # woken by the registration
                    stat = await session.exists(PATHS.primary("ghosted"))
                    assert stat is not None and found == [("10.9.9.9:4242", stat.czxid)]
                    cached = router._routes["ghosted"]
                    assert await router.primary("ghosted") == found[0]  # cached
            await cached.fired.wait()  # unregistered: the cached route is dropped
            nursery.cancel_scope.cancel()


async def _wait_status(session: Session, server: str, prohibited: bool) -> None:
    async for snap in watch_data(session, f"{PATHS.nodes}/{server}"):
        if decode(snap.data, NodeRecord).migration_prohibited is prohibited:
            return


async def test_migration_prohibited_is_watched_by_every_server_and_obeyed_by_the_controller(
    session: Session, zk_hosts: str, chroot: str, tmp_path: Path
) -> None:
    """Every server watches ``migration_prohibited`` (its status shows it); a controller
    elected while it exists places new topics and makes no voluntary move; once it is
    gone, the moves onto the new server happen."""
    topics = [f"m{i}" for i in range(4)]
    with trio.fail_after(40):
        async with trio.open_nursery() as nursery:
            cluster = LocalCluster(zk_hosts, chroot, tmp_path, nursery)
            await cluster.start_with_topics(session, topics)
            await wait_full_isr(session, topics, {"s1", "s2"})
            before = {t: decode_replicas((await session.get(PATHS.placement(t)))[0])
                      for t in topics}
            await session.create(PATHS.migration_prohibited)
            for name in ("s1", "s2"):
                await _wait_status(session, name, True)
            await cluster.start_server("s3", session)
            await _wait_status(session, "s3", True)
            cluster.crash("c1")
            await create_topics(session, ["fresh"])
            await cluster.start_controller("c2")  # elected with s3 live and migration prohibited
            await wait_placed(session, ["fresh"])
            assert await session.children(PATHS.assign_dir("s3")) == ["fresh"]
            for topic in topics:
                assert decode_replicas((await session.get(PATHS.placement(topic)))[0]) == \
                    before[topic]
            await session.delete(PATHS.migration_prohibited)
            async for snap in watch_children(session, PATHS.assign_dir("s3")):
                if len(snap.children) > 1:
                    break  # a voluntary move onto s3 started
            for name in ("s1", "s2", "s3"):
                await _wait_status(session, name, False)
            nursery.cancel_scope.cancel()


async def test_the_isr_names_the_backups_copy_so_it_may_take_over_unannounced(
    session: Session, zk_hosts: str, chroot: str, tmp_path: Path,
) -> None:
    """The primary records the in-sync set in ZooKeeper before its next reply tells the
    backup it counts.  If the primary dies in between (seen once under load: the topic then
    had no primary), the backup must still be allowed to take over: the ISR names the copy
    it counted, and only that copy, of this process, qualifies."""
    from examples.message_broker.layout import Isr

    with trio.fail_after(40):
        async with trio.open_nursery() as nursery:
            cluster = LocalCluster(zk_hosts, chroot, tmp_path, nursery)
            await cluster.start_with_topics(session, ["y0"])
            await wait_full_isr(session, ["y0"], {"s1", "s2"})
            isr = decode((await session.get(BrokerPaths().isr("y0")))[0], Isr)
            backup = next(s for s in isr.in_sync if s != isr.leader)
            server = cluster.servers[backup]
            assert isr.copies[backup] == server.copies["y0"]
            # the primary's "you are in sync" reply never arrived: only the ISR says so
            server.complete.discard("y0")
            assert server._may_take_over("y0", isr)
            assert not server._may_take_over("y0", Isr(isr.in_sync, isr.leader, isr.term,
                                                       {backup: "another-copy"}))
            nursery.cancel_scope.cancel()
