"""Graceful shutdown hands every primary over; the controller does not race it (issue #25,
item 3).

The stopping server's topics are handed to an in-sync backup each; one of them has its only
backup hung (SIGSTOP of the real process), so its hand-over must wait for the replacement
the controller places once the lag limit dropped the hung one.  Meanwhile the controller
keeps the stopping server in every placement until it has left ``nodes/``: no topic fails
over abruptly, and nothing acknowledged is lost.
"""

from __future__ import annotations

import os
import signal
from datetime import datetime
from pathlib import Path

import trio

from examples.message_broker.client import Producer
from examples.message_broker.cluster import ProcessCluster, primaries, wait_server_gone
from examples.message_broker.ctl import create_topics, request_shutdown, wait_placed
from examples.message_broker.layout import BrokerPaths, decode_replicas
from framework import Session
from framework.zk import wait_exists
from tests.test_broker_failover import Load, check_delivery, wait_full_isr
from tests.test_broker_replication_lag import events

PATHS = BrokerPaths()
TIMEOUT = 4.0
LAG_LIMIT = 1.5


def at(event: dict[str, object]) -> float:
    return datetime.fromisoformat(str(event["timestamp"]).replace("Z", "+00:00")).timestamp()


async def test_graceful_shutdown_hands_over_even_with_a_hung_backup(
    session: Session, zk_hosts: str, chroot: str, tmp_path: Path
) -> None:
    topics = [f"h{i}" for i in range(6)]
    cluster = ProcessCluster(zk_hosts, chroot, tmp_path / "data", tmp_path / "logs",
                             session_timeout=TIMEOUT)
    env = {"BROKER_LAG_LIMIT": str(LAG_LIMIT)}
    hung = ""
    try:
        with trio.fail_after(60):
            for name in ("s1", "s2", "s3", "s4"):
                await cluster.spawn("server", name, env)
            await cluster.spawn("controller", "c1")
            for name in ("s1", "s2", "s3", "s4"):
                await cluster.wait_joined(session, name)
            await wait_exists(session, PATHS.app.rendezvous)
            await create_topics(session, topics)
            await wait_placed(session, topics)
            await wait_full_isr(session, topics, {"s1", "s2", "s3", "s4"})
            leaders = await primaries(session, topics)
            stopping = max(sorted(set(leaders.values())),
                           key=lambda s: sum(1 for t in topics if leaders[t] == s))
            led = [t for t in topics if leaders[t] == stopping]
            replicas = decode_replicas((await session.get(PATHS.placement(led[0])))[0])
            hung = next(s for s in replicas if s != stopping)
            load = Load(topics)
            async with Producer(session, ack_timeout=3.0) as producer, \
                    trio.open_nursery() as nursery:
                for topic in topics:
                    nursery.start_soon(load.run, producer, topic)
                await load.until(300)
                os.kill(cluster.procs[hung].pid, signal.SIGSTOP)
                await request_shutdown(session, [stopping])
                assert await cluster.wait_exit(stopping) == 0
                await wait_server_gone(session, stopping)
                os.kill(cluster.procs[hung].pid, signal.SIGCONT)
                await load.until(load.total + 200)
                live = {"s1", "s2", "s3", "s4"} - {stopping}
                await wait_full_isr(session, topics, live)
                nursery.cancel_scope.cancel()
            print(f"longest ack gap: {max(load.longest_gap[t] for t in led):.2f} s on the "
                  f"topics {stopping} handed over, one with its backup {hung} stopped "
                  f"(lag limit {LAG_LIMIT} s)")
            await check_delivery(session, load, "checker")
    finally:
        if hung and cluster.procs[hung].running:
            os.kill(cluster.procs[hung].pid, signal.SIGCONT)
        await cluster.stop_all()
    mine = events(cluster, stopping)
    handed = {e["topic"] for e in mine if e.get("event") == "broker.handed_over"}
    assert handed == set(led)  # every primary handed over, the hung backup's topic too
    left = max(at(e) for e in mine if e.get("event") == "broker.stopped")
    placement = events(cluster, "c1")
    assert any(e.get("event") == "replicated.plan_written" for e in placement)
    early = [e for e in placement if e.get("event") == "replicated.replica_dropped"
             and stopping in (e.get("dropped") or []) and at(e) < left]
    assert early == []  # the controller kept its replicas while it handed over
