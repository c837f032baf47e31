"""The lag limit (issue #25, item 1): a hung backup (SIGSTOP of its real process) leaves the
in-sync set within ``lag_limit``, long before its ZooKeeper session expires: silent and behind
for half the limit, its primary reports it and the controller places a replacement; it is
dropped at the limit or as soon as the replacement is in sync.  Publishing goes on, and
nothing acknowledged is lost."""

from __future__ import annotations

import json
import os
import signal
from collections import Counter
from pathlib import Path

import trio

from examples.message_broker.client import Producer
from examples.message_broker.cluster import ProcessCluster, primaries
from examples.message_broker.ctl import create_topics, wait_placed
from examples.message_broker.layout import BrokerPaths, Isr, decode, decode_replicas
from framework import Session
from framework.zk import wait_exists, watch_data
from tests.test_broker_failover import Load, check_delivery, wait_full_isr

PATHS = BrokerPaths()
TIMEOUT = 4.0  # the broker processes' session timeout
LAG_LIMIT = 1.5


async def wait_out_of_isr(session: Session, topic: str, server: str) -> None:
    async for snap in watch_data(session, PATHS.isr(topic)):
        if server not in decode(snap.data, Isr).in_sync:
            return


async def wait_settled(session: Session, topics: list[str]) -> None:
    """Every topic placed on exactly two servers, both in its in-sync set."""
    for topic in topics:
        while True:
            fired = trio.Event()
            placement = decode_replicas((await session.get(PATHS.placement(topic),
                                                 watch=session.waker(fired)))[0])
            isr = decode((await session.get(PATHS.isr(topic),
                                            watch=session.waker(fired)))[0], Isr)
            if len(placement) == 2 and set(placement) <= set(isr.in_sync):
                break
            await fired.wait()


def events(cluster: ProcessCluster, name: str) -> list[dict[str, object]]:
    out = []
    for line in (cluster.logs / f"{name}.log").read_text(errors="replace").splitlines():
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


async def test_a_hung_backup_leaves_the_in_sync_set_after_the_lag_limit(
    session: Session, zk_hosts: str, chroot: str, tmp_path: Path
) -> None:
    topics = [f"t{i}" for i in range(4)]
    cluster = ProcessCluster(zk_hosts, chroot, tmp_path / "data", tmp_path / "logs",
                             session_timeout=TIMEOUT)
    env = {"BROKER_LAG_LIMIT": str(LAG_LIMIT)}
    victim = ""
    try:
        with trio.fail_after(60):
            for name in ("s1", "s2", "s3"):
                await cluster.spawn("server", name, env)
            await cluster.spawn("controller", "c1")
            for name in ("s1", "s2", "s3"):
                await cluster.wait_joined(session, name)
            await wait_exists(session, PATHS.app.rendezvous)
            await create_topics(session, topics)
            await wait_placed(session, topics)
            await wait_full_isr(session, topics, {"s1", "s2", "s3"})
            leaders = await primaries(session, topics)
            placed = {t: decode_replicas((await session.get(PATHS.placement(t)))[0])
                      for t in topics}
            backups = Counter(s for t in topics for s in placed[t] if s != leaders[t])
            victim = backups.most_common(1)[0][0]
            backed = [t for t in topics if victim in placed[t] and leaders[t] != victim]
            load = Load(topics)
            async with Producer(session, ack_timeout=3.0) as producer, \
                    trio.open_nursery() as nursery:
                for topic in topics:
                    nursery.start_soon(load.run, producer, topic)
                await load.until(400)
                os.kill(cluster.procs[victim].pid, signal.SIGSTOP)
                stopped_at = {t: len(load.acked[t]) for t in topics}
                async with trio.open_nursery() as waits:
                    for topic in backed:
                        waits.start_soon(wait_out_of_isr, session, topic, victim)
                # the primaries dropped it while its session still lives: the lag limit,
                # not the session's expiry, took it out
                assert await session.exists(f"{PATHS.nodes}/{victim}") is not None
                # publishing goes on on every topic it backed up (a replacement caught up)
                for topic in backed:
                    while len(load.acked[topic]) < stopped_at[topic] + 50:
                        await load.until(load.total + 1)
                print(f"longest ack gap with {victim} stopped: "
                      f"{max(load.longest_gap[t] for t in backed):.2f} s "
                      f"(lag limit {LAG_LIMIT} s)")
                os.kill(cluster.procs[victim].pid, signal.SIGCONT)
                await load.until(load.total + 200)
                nursery.cancel_scope.cancel()
            await wait_settled(session, topics)
            await check_delivery(session, load, "checker")
    finally:
        if victim and cluster.procs[victim].running:
            os.kill(cluster.procs[victim].pid, signal.SIGCONT)
        await cluster.stop_all()
    logged = [e for name in ("s1", "s2", "s3") for e in events(cluster, name)]
    # its primaries found it silent and behind (half the lag limit: a replacement is placed)
    slow = [e for e in logged if e.get("event") == "broker.backup_slow"]
    assert {e["backup"] for e in slow} == {victim}
    assert {e["topic"] for e in slow} == set(backed)
    # and each dropped it: after the lag limit, or once its replacement was in sync and the
    # controller took it out of the placement (make before break), whichever came first
    lost = [e for e in logged if e.get("event") == "broker.backup_lost"
            and e.get("backup") == victim]
    assert {e["topic"] for e in lost} >= set(backed)
    assert {e["reason"] for e in lost if e["topic"] in backed} <= {"lag", "unplaced"}
