"""The broker on a 3-node ZooKeeper ensemble: a ZooKeeper leader kill, a follower kill and a
rolling restart under a publish load end no backup's replication (issue #30).

kazoo fires every watch with a NONE event when its connection drops; a backup used to take
that for a change of primary, close its replication link, and the primary dropped it from the
in-sync set (every topic, on every ZooKeeper leader election).  Now a backup re-reads the
primary znode after reconnecting and stops only for a new epoch: the in-sync sets are not
rewritten at all (their znode versions do not move), no produce is refused, every primary
term goes on.
"""

from __future__ import annotations

from pathlib import Path

import trio

from examples.message_broker.client import Producer
from examples.message_broker.cluster import LocalCluster
from examples.message_broker.ctl import create_topics, wait_placed
from examples.message_broker.layout import BrokerPaths
from framework import Session, ZooKeeperEnsemble
from framework.zk import SessionState
from tests.test_broker_failover import Load, wait_full_isr

PATHS = BrokerPaths()
TOPICS = [f"t{i}" for i in range(6)]
#: the broker sessions' timeout: a trust window of 2.7 s, well over an election (0.7-1.1 s)
TIMEOUT = 4.0


def connected_to(session: Session, ensemble: ZooKeeperEnsemble) -> int | None:
    """The ensemble member this session's connection goes to (test introspection only)."""
    server = session.server
    if server is None:
        return None
    port = server[1]
    return next((m.sid for m in ensemble.members if m.client_port == port), None)


async def isr_versions(session: Session) -> dict[str, tuple[int, int]]:
    """Per topic: the ``isr`` znode's version and the primary znode's czxid (its epoch)."""
    await session.sync(PATHS.topics)
    out = {}
    for topic in TOPICS:
        isr = await session.exists(PATHS.isr(topic))
        primary = await session.exists(PATHS.primary(topic))
        assert isr is not None and primary is not None
        out[topic] = (isr.version, primary.czxid)
    return out


async def ride_through(fault: str, sessions: list[Session], load: Load) -> None:
    """After a ZooKeeper fault: wait until every session that dropped its connection is
    connected again, then until every topic acknowledged 100 more messages."""
    for s in sessions:
        await s.wait_connected()
    counts = {t: len(v) for t, v in load.acked.items()}
    while not all(len(load.acked[t]) >= counts[t] + 100 for t in TOPICS):
        await load.until(load.total + 1)


async def test_zookeeper_leader_follower_and_rolling_restarts_shrink_no_in_sync_set(
    ensemble: ZooKeeperEnsemble, tmp_path: Path, captured_logs: list[dict[str, object]]
) -> None:
    hosts = ensemble.connect_string
    chroot = "/broker-ensemble"
    async with Session(hosts, chroot=chroot, session_timeout=10.0) as session:
        with trio.fail_after(90):
            async with trio.open_nursery() as nursery:
                cluster = LocalCluster(hosts, chroot, tmp_path, nursery, session_timeout=TIMEOUT)
                for name in ("s1", "s2", "s3"):
                    await cluster.start_server(name, session)
                await cluster.start_controller("c1")
                await create_topics(session, TOPICS)
                await wait_placed(session, TOPICS)
                await wait_full_isr(session, TOPICS, {"s1", "s2", "s3"})
                before = await isr_versions(session)
                mark = len(captured_logs)  # the events from here on
                servers = [s.session for s in cluster.servers.values()]
                assert all(s is not None for s in servers)
                brokers: list[Session] = [s for s in servers if s is not None]
                load = Load(TOPICS)
                async with Session(hosts, chroot=chroot, session_timeout=TIMEOUT) as ps, \
                        Producer(ps) as producer:
                    for topic in TOPICS:
                        nursery.start_soon(load.run, producer, topic)
                    await load.until(600)
                    generations = [s.snapshot().generation for s in brokers]

                    leader = ensemble.leader()
                    assert leader is not None
                    await trio.to_thread.run_sync(ensemble.kill, leader)
                    await ride_through("leader kill", [*brokers, ps], load)
                    print(f"leader kill: longest ack gap {max(load.longest_gap.values()):.2f} s")
                    load.longest_gap = dict.fromkeys(TOPICS, 0.0)
                    # every broker server's connection dropped (the fault reached them all)
                    assert all(s.snapshot().generation > g
                               for s, g in zip(brokers, generations, strict=True))
                    await trio.to_thread.run_sync(ensemble.restart, leader)

                    # the follower that carries the most broker sessions
                    followers = [m.sid for m in ensemble.members
                                 if m.sid != ensemble.leader() and m.running]
                    carried = {sid: [s for s in brokers if connected_to(s, ensemble) == sid]
                               for sid in followers}
                    victim = max(followers, key=lambda sid: len(carried[sid]))
                    generations = [s.snapshot().generation for s in carried[victim]]
                    await trio.to_thread.run_sync(ensemble.kill, victim)
                    await ride_through("follower kill", [*brokers, ps], load)
                    print(f"follower kill ({len(carried[victim])} broker sessions on it): "
                          f"longest ack gap {max(load.longest_gap.values()):.2f} s")
                    assert all(s.snapshot().generation > g
                               for s, g in zip(carried[victim], generations, strict=True))
                    await trio.to_thread.run_sync(ensemble.restart, victim)

                    # a rolling restart: each member in turn (one of them the leader)
                    load.longest_gap = dict.fromkeys(TOPICS, 0.0)
                    for member in ensemble.members:
                        await trio.to_thread.run_sync(ensemble.restart, member.sid)
                        await ride_through("rolling restart", [*brokers, ps], load)
                    print(f"rolling restart: longest ack gap "
                          f"{max(load.longest_gap.values()):.2f} s")
                    assert all(s.state is SessionState.CONNECTED for s in brokers)
                    after = await isr_versions(session)
                    events = [e["event"] for e in captured_logs[mark:]]
                nursery.cancel_scope.cancel()
    # not one in-sync set rewritten, no backup dropped, no produce refused, no new term
    assert after == before
    assert events.count("broker.backup_lost") == 0
    assert events.count("broker.isr_changed") == 0
    assert events.count("broker.produce_refused") == 0
    assert events.count("broker.primary_ended") == 0  # every term rode through (trust window)
    assert events.count("broker.watch_rearmed") > 0  # the backups did see the disconnections
