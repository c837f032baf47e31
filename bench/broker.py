"""Message broker benchmark: the YMB-style broker against the framework's ZooKeeper WorkQueue.

    .venv/bin/python bench/broker.py [--json] [--messages N]

Runs 2 broker servers and a controller as real processes (``framework run``, fsync never) on a
fresh standalone ZooKeeper (or ``$FRAMEWORK_ZK_HOSTS``) and measures, with 1 KB messages:

* publish throughput with replication, batched (many sends in flight per topic) and unbatched
  (``batch_max=1``, one send at a time per topic), each acknowledged after the backup has it;
* publish -> deliver latency p50/p99 at a moderate load (subscriber in this process);
* how many of the batched topics' primaries the controller put on the busier server (4 or
  2: the batched figure differs between the two);
* CPU per message of the batched publish (user + system, from ``/proc``): the producer's
  process and the two servers' (primary and backup) - the figure the machine's load does not
  move, where msgs/s on shared cores does;
* ZooKeeper transactions per 1,000 messages (zxid delta on the server: every write or multi
  moves it by one), for the batched publish and for publish -> deliver (with the
  subscriber's batched position commits and the servers' status), against the queue's;
* failover time after kill -9 of a primary (session timeout 2 s);
* the same 1 KB messages through the framework's ZooKeeper ``WorkQueue``, as the baseline
  column (why the data stays off ZooKeeper): ``put_many`` against batched publish, one
  ``put`` at a time in 4 lanes against unbatched publish (4 topics, one send at a time
  each), put -> take+ack by 4 consumers against publish -> deliver, and the put -> take
  latency against publish -> deliver latency.

Each row: workload, unit, baseline (WorkQueue, where there is one), ours (broker), ratio =
ours / baseline (above 1 is better for msgs/s, below 1 is better for ms).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import attrs
import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import zookeeper
from examples.message_broker.client import Producer, Subscriber
from examples.message_broker.cluster import ProcessCluster, primaries
from examples.message_broker.ctl import create_topics, wait_placed
from examples.message_broker.layout import BrokerPaths, Isr, decode
from framework import Session, WorkQueue, configure_logging
from framework.zk import watch_data
from framework.zkserver.launcher import four_letter

PATHS = BrokerPaths()
PAYLOAD = b"x" * 1024


@attrs.frozen
class Row:
    workload: str
    unit: str
    baseline: float | None
    ours: float | None

    @property
    def ratio(self) -> float | None:
        if not self.baseline or self.ours is None:
            return None
        ratio = self.ours / self.baseline
        return round(ratio, 2) if ratio >= 0.1 else round(ratio, 4)

    def as_dict(self) -> dict[str, Any]:
        return {"workload": self.workload, "unit": self.unit, "baseline": self.baseline,
                "ours": self.ours, "ratio": self.ratio}


def zxid(hosts: str) -> int:
    port = int(hosts.split(",")[0].rsplit(":", 1)[1])
    for line in four_letter(port, "srvr").splitlines():
        if line.startswith("Zxid:"):
            return int(line.split(":")[1].strip(), 16)
    raise RuntimeError("no Zxid in srvr output")


def cpu_seconds(pid: int | None = None) -> float | None:
    """User + system CPU seconds of process ``pid`` (this one when ``None``); ``None`` without
    ``/proc``."""
    if pid is None:
        times = os.times()
        return times.user + times.system
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_per_message(before: list[float | None], after: list[float | None],
                    messages: int) -> float | None:
    """Microseconds of CPU per message between two readings of the same processes."""
    if None in before or None in after:
        return None
    return round((sum(after) - sum(before)) * 1e6 / messages, 2)  # type: ignore[arg-type]


async def wait_isr(session: Session, topics: list[str]) -> None:
    async def one(topic: str) -> None:
        async for snap in watch_data(session, PATHS.isr(topic)):
            if len(decode(snap.data, Isr).in_sync) == 2:
                return

    async with trio.open_nursery() as nursery:
        for topic in topics:
            nursery.start_soon(one, topic)


async def publish(session: Session, topics: list[str], total: int, batched: bool) -> float:
    """Messages per second acknowledged."""
    per_topic = total // len(topics)
    in_flight = 200 if batched else 1
    async with Producer(session, batch_max=500 if batched else 1) as producer:
        start = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for topic in topics:
                for lane in range(in_flight):
                    count = per_topic // in_flight + (lane < per_topic % in_flight)

                    async def run(topic: str = topic, count: int = count) -> None:
                        for _ in range(count):
                            await producer.send(topic, PAYLOAD)

                    nursery.start_soon(run)
        return (per_topic * len(topics)) / (time.perf_counter() - start)


def _stamp() -> bytes:
    return f"L{time.perf_counter():<29.6f}".encode() + PAYLOAD[30:]


def _age(payload: bytes) -> float:
    return time.perf_counter() - float(payload[1:30])


async def latency(session: Session, topics: list[str], total: int) -> tuple[float, float]:
    """p50/p99 publish -> deliver (ms): one message in flight end to end per (fresh) topic
    (the next is sent once the subscriber has it)."""
    samples: list[float] = []
    delivered = {t: trio.Event() for t in topics}
    async with Subscriber(session, f"lat-{uuid.uuid4().hex[:6]}", topics) as sub, \
            Producer(session) as producer:
        async with trio.open_nursery() as nursery:
            async def consume() -> None:
                async for msg in sub:
                    sub.ack(msg)
                    samples.append(_age(msg.payload))
                    delivered[msg.topic].set()

            nursery.start_soon(consume)

            async def send(topic: str) -> None:
                for _ in range(total // len(topics)):
                    delivered[topic] = trio.Event()
                    await producer.send(topic, _stamp())
                    await delivered[topic].wait()

            async with trio.open_nursery() as senders:
                for topic in topics:
                    senders.start_soon(send, topic)
            nursery.cancel_scope.cancel()

    samples.sort()
    return samples[len(samples) // 2] * 1000, samples[int(len(samples) * 0.99)] * 1000


async def end_to_end(session: Session, topics: list[str], total: int) -> float:
    """Messages/s from the first publish until a subscriber has received all of them."""
    start = time.perf_counter()
    async with Subscriber(session, "e2e", topics) as sub:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(publish, session, topics, total, True)
            got = 0
            async for msg in sub:
                sub.ack(msg)
                got += 1
                if got >= (total // len(topics)) * len(topics):
                    break
    return got / (time.perf_counter() - start)


async def queue_baseline(session: Session, total: int) -> tuple[float, float]:
    """WorkQueue: put_many items/s, and end-to-end put -> take+ack items/s (4 consumers)."""
    queue = WorkQueue(session, "/bench/queue")
    start = time.perf_counter()
    await queue.put_many([PAYLOAD] * total)
    put_rate = total / (time.perf_counter() - start)
    await queue.size()
    taken = 0
    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        async def consumer() -> None:
            nonlocal taken
            while taken < total:
                async with queue.take():
                    taken += 1
                if taken >= total:
                    nursery.cancel_scope.cancel()

        for _ in range(4):
            nursery.start_soon(consumer)
    take_rate = total / (time.perf_counter() - start)
    return put_rate, take_rate


async def queue_unbatched(session: Session, total: int) -> float:
    """WorkQueue: items/s with one ``put`` at a time in each of 4 lanes."""
    queue = WorkQueue(session, "/bench/queue-unbatched")
    per_lane = total // 4
    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(4):
            async def lane() -> None:
                for _ in range(per_lane):
                    await queue.put(PAYLOAD)

            nursery.start_soon(lane)
    return per_lane * 4 / (time.perf_counter() - start)


async def queue_latency(session: Session, total: int) -> tuple[float, float]:
    """WorkQueue: p50/p99 put -> taken (ms), 4 consumers, 4 lanes each with one item in
    flight end to end (the next is put once a consumer has taken it)."""
    queue = WorkQueue(session, "/bench/queue-latency")
    samples: list[float] = []
    taken: dict[bytes, trio.Event] = {}
    async with trio.open_nursery() as nursery:
        async def consumer() -> None:
            while True:
                async with queue.take() as item:
                    samples.append(_age(item.data))
                    if item.data in taken:
                        taken[item.data].set()

        for _ in range(4):
            nursery.start_soon(consumer)

        async def lane() -> None:
            for _ in range(total // 4):
                payload = _stamp()
                event = taken[payload] = trio.Event()
                await queue.put(payload)
                await event.wait()
                del taken[payload]

        async with trio.open_nursery() as lanes:
            for _ in range(4):
                lanes.start_soon(lane)
        nursery.cancel_scope.cancel()
    samples.sort()
    return samples[len(samples) // 2] * 1000, samples[int(len(samples) * 0.99)] * 1000


async def run(hosts: str, messages: int) -> list[Row]:
    chroot = f"/bench-broker-{uuid.uuid4().hex[:6]}"
    work = Path(tempfile.mkdtemp(prefix="bench-broker-"))
    cluster = ProcessCluster(hosts, chroot, work / "data", work / "logs", session_timeout=2.0,
                             log_level="warning")
    topics = [f"b{i}" for i in range(4)]
    rows: list[Row] = []
    try:
        async with Session(hosts, chroot=chroot, session_timeout=4.0) as session:
            with trio.fail_after(30):
                for name in ("s1", "s2"):
                    await cluster.spawn("server", name)
                await cluster.spawn("controller", "c1")
                for name in ("s1", "s2"):
                    await cluster.wait_joined(session, name)
                await create_topics(session, topics)
                await wait_placed(session, topics)
                await wait_isr(session, topics)
            # baseline first: the ZooKeeper queue with the same payloads
            q_total = max(messages // 10, 500)
            before = zxid(hosts)
            put_rate, take_rate = await queue_baseline(session, q_total)
            q_writes = (zxid(hosts) - before) * 1000 / q_total
            put_one_rate = await queue_unbatched(session, max(messages // 10, 400))
            q_p50, q_p99 = await queue_latency(session, 400)
            # where the controller put the primaries moves the batched figure (4 on one
            # server or 2 on each): shown beside it
            placed = await primaries(session, topics)
            crowded = max(Counter(placed.values()).values(), default=0)
            before = zxid(hosts)
            servers = [cluster.procs[name].pid for name in ("s1", "s2")]
            cpu_before = [cpu_seconds(), *map(cpu_seconds, servers)]
            batched = await publish(session, topics, messages, True)
            cpu_after = [cpu_seconds(), *map(cpu_seconds, servers)]
            writes = zxid(hosts) - before
            unbatched = await publish(session, topics, max(messages // 10, 400), False)
            lat_topics = [f"l{i}" for i in range(4)]
            await create_topics(session, lat_topics)
            await wait_placed(session, lat_topics)
            await wait_isr(session, lat_topics)
            p50, p99 = await latency(session, lat_topics, 400)
            e2e_topics = [f"e{i}" for i in range(4)]
            await create_topics(session, e2e_topics)
            await wait_placed(session, e2e_topics)
            await wait_isr(session, e2e_topics)
            before = zxid(hosts)
            e2e = await end_to_end(session, e2e_topics, messages // 2)
            e2e_writes = (zxid(hosts) - before) * 1000 / (messages // 2)
            rows += [
                Row("publish 1 KB, replicated, batched (vs WorkQueue put_many)", "msgs/s",
                    round(put_rate, 1), round(batched, 1)),
                Row("batched: primaries of its 4 topics on the busier server", "topics", None,
                    crowded),
                Row("publish 1 KB, replicated, unbatched (vs WorkQueue put, 4 lanes)", "msgs/s",
                    round(put_one_rate, 1), round(unbatched, 1)),
                Row("end to end publish->deliver (vs WorkQueue put->take+ack)", "msgs/s",
                    round(take_rate, 1), round(e2e, 1)),
                Row("publish->deliver latency p50 (vs WorkQueue put->take)", "ms",
                    round(q_p50, 2), round(p50, 2)),
                Row("publish->deliver latency p99 (vs WorkQueue put->take)", "ms",
                    round(q_p99, 2), round(p99, 2)),
                Row("CPU per message, batched publish: the producer's process", "us", None,
                    cpu_per_message(cpu_before[:1], cpu_after[:1], messages)),
                Row("CPU per message, batched publish: both servers", "us", None,
                    cpu_per_message(cpu_before[1:], cpu_after[1:], messages)),
                Row("ZooKeeper transactions per 1,000 messages, batched publish", "txns",
                    None, round(writes * 1000 / messages, 2)),
                Row("ZooKeeper transactions per 1,000 messages, publish->deliver "
                    "(vs WorkQueue put_many->take+ack)", "txns", round(q_writes, 1),
                    round(e2e_writes, 2)),
            ]
            # failover: kill -9 the primary of b0
            placed = await primaries(session, topics)
            victim = placed["b0"]
            stat = await session.exists(PATHS.primary("b0"))
            assert stat is not None
            killed = time.monotonic()
            await cluster.kill9(victim)
            with trio.fail_after(30):
                async for snap in watch_data(session, PATHS.primary("b0")):
                    if snap.stat is not None and snap.stat.czxid != stat.czxid:
                        break
            rows.append(Row("failover after kill -9 of a primary (session 2 s)", "s", None,
                            round(time.monotonic() - killed, 3)))
    finally:
        await cluster.stop_all()
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print rows as JSON")
    parser.add_argument("--messages", type=int, default=20000)
    args = parser.parse_args(argv)
    configure_logging(level="warning")
    with zookeeper() as hosts:
        rows = trio.run(run, hosts, args.messages)
    if args.json:
        print(json.dumps([r.as_dict() for r in rows], indent=2))
    else:
        for r in rows:
            print(f"{r.workload:<62} {r.unit:>7}  baseline={r.baseline!s:>9}  "
                  f"ours={r.ours!s:>9}  ratio={r.ratio}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
