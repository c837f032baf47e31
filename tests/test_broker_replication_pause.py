"""A primary paused past its session (SIGSTOP of the real process) acknowledges nothing when
it resumes: a produce that reached its socket while it was stopped gets an error, never an
ack, and the message is not in the topic (issue #25: the pause-safe check before an ack)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import trio

from examples.message_broker import protocol
from examples.message_broker.client import Producer, Subscriber
from examples.message_broker.cluster import ProcessCluster
from examples.message_broker.ctl import create_topics, wait_placed
from examples.message_broker.layout import BrokerPaths, PrimaryRecord, decode, find_server
from examples.message_broker.protocol import ErrorReply, Produce
from framework import Session
from framework.zk import wait_exists, watch_data
from tests.test_broker_failover import wait_full_isr

PATHS = BrokerPaths()
TIMEOUT = 3.0


async def test_a_resumed_zombie_primary_acknowledges_nothing(
    session: Session, zk_hosts: str, chroot: str, tmp_path: Path
) -> None:
    cluster = ProcessCluster(zk_hosts, chroot, tmp_path / "data", tmp_path / "logs",
                             session_timeout=TIMEOUT)
    zombie = ""
    try:
        with trio.fail_after(60):
            for name in ("s1", "s2", "s3"):  # a third: the new primary gets a new backup
                await cluster.spawn("server", name)
            await cluster.spawn("controller", "c1")
            for name in ("s1", "s2", "s3"):
                await cluster.wait_joined(session, name)
            await wait_exists(session, PATHS.app.rendezvous)
            await create_topics(session, ["z"])
            await wait_placed(session, ["z"])
            await wait_full_isr(session, ["z"], {"s1", "s2", "s3"})
            data, stat = await session.get(PATHS.primary("z"))
            record = decode(data, PrimaryRecord)
            zombie, address = record.server, await find_server(session, PATHS, record.server)
            assert address is not None
            async with Producer(session, ack_timeout=3.0) as producer:
                for i in range(50):
                    await producer.send("z", b"before-%d" % i)
                probe = await protocol.connect(address)
                os.kill(cluster.procs[zombie].pid, signal.SIGSTOP)
                # reaches the stopped primary's socket: it can only answer after resuming
                await probe.send(Produce(1, "z", "probe", 0, [b"zombie"]))
                async for snap in watch_data(session, PATHS.primary("z")):
                    if snap.stat is not None and snap.stat.czxid != stat.czxid:
                        break  # its backup took over with a newer epoch
                for i in range(50):
                    await producer.send("z", b"after-%d" % i)
            os.kill(cluster.procs[zombie].pid, signal.SIGCONT)
            reply: protocol.Message | None = None
            try:
                reply = await probe.read()
            except protocol.PeerClosed:
                pass  # closed: no acknowledgement either
            await probe.aclose()
            print(f"the resumed zombie answered: {reply}")
            assert reply is None or isinstance(reply, ErrorReply), reply
            got: list[bytes] = []
            async with Subscriber(session, "checker", ["z"]) as sub:
                async for msg in sub:
                    got.append(msg.payload)
                    if msg.payload == b"after-49":
                        break
            assert b"zombie" not in got
            assert got[:50] == [b"before-%d" % i for i in range(50)]
            assert [p for p in got if p.startswith(b"after-")] == \
                [b"after-%d" % i for i in range(50)]
    finally:
        if zombie and cluster.procs[zombie].running:
            os.kill(cluster.procs[zombie].pid, signal.SIGCONT)
        await cluster.stop_all()
