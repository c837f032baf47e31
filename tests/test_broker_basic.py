"""Message broker, in one process against the real ZooKeeper: placement, publish, subscribe,
backup catch-up, idempotent retries, bad input."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from examples.message_broker.client import Producer, Subscriber, UnknownTopicError
from examples.message_broker.cluster import LocalCluster, primaries
from examples.message_broker.ctl import create_topics, wait_placed
from framework import Session


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
