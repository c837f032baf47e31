"""Message broker crash cases with real processes and kill -9, against the real ZooKeeper:
nothing acknowledged is lost, order per producer and topic holds, new backups catch up."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import trio

from examples.message_broker.client import Producer, Subscriber
from examples.message_broker.cluster import ProcessCluster, primaries, wait_server_gone
from examples.message_broker.ctl import create_topics, wait_placed
from examples.message_broker.layout import BrokerPaths, Isr, decode, decode_replicas
from framework import Session
from framework.runtime import MasterIdentity
from framework.zk import wait_exists, watch_data

TIMEOUT = 2.0  # broker processes' session timeout (failover waits for the expiry)


class Load:
    """Producers sending numbered messages; records what was acknowledged."""

    def __init__(self, topics: list[str]) -> None:
        self.topics = topics
        self.acked: dict[str, list[int]] = {t: [] for t in topics}
        self.total = 0
        #: per topic, the longest stretch between two acknowledgements (trio seconds; shown
        #: by the tests that measure it, never asserted)
        self.longest_gap: dict[str, float] = dict.fromkeys(topics, 0.0)
        self._progress = trio.Event()

    async def run(self, producer: Producer, topic: str) -> None:
        n = 0
        last = trio.current_time()
        while True:
            await producer.send(topic, f"{topic}:{n}".encode())
            now = trio.current_time()
            self.longest_gap[topic] = max(self.longest_gap[topic], now - last)
            last = now
            self.acked[topic].append(n)
            n += 1
            self.total += 1
            self._progress.set()
            self._progress = trio.Event()

    async def until(self, total: int) -> None:
        while self.total < total:
            await self._progress.wait()


async def wait_full_isr(session: Session, topics: list[str], live: set[str]) -> None:
    """Return once every topic has two live in-sync replicas (watches)."""
    paths = BrokerPaths()

    async def one(topic: str) -> None:
        async for snap in watch_data(session, paths.isr(topic)):
            in_sync = set(decode(snap.data, Isr).in_sync)
            if len(in_sync) == 2 and in_sync <= live:
                return

    async with trio.open_nursery() as nursery:
        for topic in topics:
            nursery.start_soon(one, topic)


class Received:
    """What a subscriber running through the faults received, per topic, in order."""

    def __init__(self, topics: list[str]) -> None:
        self.got: dict[str, list[int]] = {t: [] for t in topics}
        self._progress = trio.Event()

    async def collect(self, sub: Subscriber) -> None:
        async for msg in sub:
            topic, n = msg.payload.decode().split(":")
            self.got[topic].append(int(n))
            sub.ack(msg)
            self._progress.set()
            self._progress = trio.Event()

    async def covers(self, load: Load) -> None:
        """Return once every acknowledged message arrived."""
        while not all(set(v) <= set(self.got[t]) for t, v in load.acked.items()):
            await self._progress.wait()


async def check_delivery(session: Session, load: Load, name: str) -> Counter[str]:
    """Subscribe from the start: every acknowledged message arrives, in order per topic."""
    want = {t: set(v) for t, v in load.acked.items()}
    got: dict[str, list[int]] = {t: [] for t in load.topics}
    async with Subscriber(session, name, load.topics) as sub:
        async for msg in sub:
            topic, n = msg.payload.decode().split(":")
            got[topic].append(int(n))
            sub.ack(msg)
            if all(want[t] <= set(got[t]) for t in load.topics):
                break
    dups: Counter[str] = Counter()
    for topic, seq in got.items():
        assert seq == sorted(seq), f"order violated in {topic}"
        dups[topic] = len(seq) - len(set(seq))
    return dups


async def test_kill9_primary_then_controller_nothing_acked_lost(
    session: Session, zk_hosts: str, chroot: str, tmp_path: Path
) -> None:
    topics = [f"t{i}" for i in range(6)]
    cluster = ProcessCluster(zk_hosts, chroot, tmp_path / "data", tmp_path / "logs",
                             session_timeout=TIMEOUT)
    paths = BrokerPaths()
    try:
        with trio.fail_after(50):
            for name in ("s1", "s2", "s3"):
                await cluster.spawn("server", name)
            await cluster.spawn("controller", "c1")
            for name in ("s1", "s2", "s3"):
                await cluster.wait_joined(session, name)
            await wait_exists(session, paths.app.rendezvous)  # c1 leads
            await cluster.spawn("controller", "c2")
            await create_topics(session, topics)
            await wait_placed(session, topics)
            await wait_full_isr(session, topics, {"s1", "s2", "s3"})
            load = Load(topics)
            live = Received(topics)  # a subscriber that rides through every failure
            async with Subscriber(session, "live", topics) as sub, \
                    trio.open_nursery() as reading:
                reading.start_soon(live.collect, sub)
                async with Producer(session, ack_timeout=3.0) as producer, \
                        trio.open_nursery() as nursery:
                    for topic in topics:
                        nursery.start_soon(load.run, producer, topic)
                    await load.until(300)
                    await kill_primary_then_controller(session, cluster, topics, load)
                    nursery.cancel_scope.cancel()
                await live.covers(load)
                reading.cancel_scope.cancel()
            assert sub.resubscribes > 0  # it did follow a failover
            for topic, seq in live.got.items():
                assert seq == sorted(set(seq)), f"order or duplicates in {topic}"
            assert producer.retries > 0
            dups = await check_delivery(session, load, "checker")
            assert sum(dups.values()) == 0  # idempotent producer: retries never duplicate
    finally:
        await cluster.stop_all()


async def kill_primary_then_controller(session: Session, cluster: ProcessCluster,
                                       topics: list[str], load: Load) -> None:
    """kill -9 the busiest primary, then the active controller, a new server joins and a
    second server is killed: each time the load goes on and every topic gets two in-sync
    replicas again."""
    paths = BrokerPaths()
    # kill -9 the server that is primary for the most topics, under load
    placed = await primaries(session, topics)
    victim = Counter(placed.values()).most_common(1)[0][0]
    await cluster.kill9(victim)
    at_kill = load.total
    await wait_server_gone(session, victim)
    await load.until(at_kill + 300)  # the backups took over and ack again
    live = {"s1", "s2", "s3"} - {victim}
    # the controller placed new backups on the last live server; they caught up
    await wait_full_isr(session, topics, live)
    # kill -9 the active controller; the standby must repair the next failure
    leader = decode((await session.get(paths.app.rendezvous))[0], MasterIdentity).name
    await cluster.kill9(leader)
    await cluster.spawn("server", "s4")
    await cluster.wait_joined(session, "s4")
    second = sorted(live)[0]
    await cluster.kill9(second)
    await wait_server_gone(session, second)
    at_second = load.total
    await load.until(at_second + 300)
    await wait_full_isr(session, topics, (live - {second}) | {"s4"})


async def test_kill9_backup_primary_goes_on_and_new_backup_catches_up(
    session: Session, zk_hosts: str, chroot: str, tmp_path: Path
) -> None:
    topics = ["k0", "k1"]
    cluster = ProcessCluster(zk_hosts, chroot, tmp_path / "data", tmp_path / "logs",
                             session_timeout=TIMEOUT)
    paths = BrokerPaths()
    try:
        with trio.fail_after(40):
            for name in ("s1", "s2", "s3"):
                await cluster.spawn("server", name)
            await cluster.spawn("controller", "c1")
            for name in ("s1", "s2", "s3"):
                await cluster.wait_joined(session, name)
            await create_topics(session, topics)
            await wait_placed(session, topics)
            await wait_full_isr(session, topics, {"s1", "s2", "s3"})
            primary = (await primaries(session, ["k0"]))["k0"]
            replicas = decode_replicas((await session.get(paths.placement("k0")))[0])
            backup = next(s for s in replicas if s != primary)
            load = Load(topics)
            async with Producer(session, ack_timeout=3.0) as producer, \
                    trio.open_nursery() as nursery:
                for topic in topics:
                    nursery.start_soon(load.run, producer, topic)
                await load.until(200)
                await cluster.kill9(backup)
                await wait_server_gone(session, backup)
                live = {"s1", "s2", "s3"} - {backup}
                await wait_full_isr(session, topics, live)  # a new backup caught up
                await load.until(load.total + 200)
                nursery.cancel_scope.cancel()
            assert (await primaries(session, ["k0"]))["k0"] == primary  # it went on
            await check_delivery(session, load, "checker")
    finally:
        await cluster.stop_all()
