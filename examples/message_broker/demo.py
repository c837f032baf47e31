"""``make demo-broker``: the YMB-style broker end to end, with kill -9 of a primary server and
of the active controller, and a SIGSTOP of the busiest backup.

1. starts an embedded ZooKeeper (or uses ``$FRAMEWORK_ZK_HOSTS``, in a fresh chroot);
2. starts 3 broker servers and 2 controllers as separate processes (``framework run``);
3. creates 100 topics and waits until each has a primary and an in-sync backup;
4. runs 4 producers and 4 durable subscribers (tasks of this process, each with its own
   ZooKeeper session and its own TCP links);
5. kill -9s the server that is primary for the most topics and measures, per topic it led,
   the time until the next primary serves (its backup, after the dead session expires);
6. kill -9s the active controller, starts a replacement server, and waits until the standby
   controller has placed every topic on two in-sync live servers again;
7. SIGSTOPs the server that is backup for the most topics for twice the session timeout
   (its session expires meanwhile), then SIGCONTs it, and reports the longest stretch
   without an acknowledgement on any topic it backed up (target: at most the lag limit
   + 1 s: silent and behind for half the lag limit, it is reported by its primaries and
   the controller places a replacement; it leaves the in-sync set at the lag limit or once
   the replacement is in sync) and, apart, on the topics it led (those wait for its
   session to expire: a frozen primary is replaced only then).  The servers' replication
   links are signed with a shared secret (``$BROKER_SECRET``, random unless set);
8. stops the producers, waits for the subscribers to receive everything, and checks:
   acknowledged-but-never-received = 0 and per-topic order violations = 0 (duplicates are
   reported: delivery is at-least-once).  Exit status 0 only if every check holds
   (1 otherwise, 2 for a user mistake, 130 when interrupted).

Output in ``./out/broker-demo/``: ``logs/`` (each process's JSON log), ``data/`` (segment
files) and ``summary.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import statistics
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import attrs
import trio

from examples.message_broker import protocol
from examples.message_broker.client import Producer, Subscriber
from examples.message_broker.cluster import ROOT, ProcessCluster, primaries, wait_server_gone
from examples.message_broker.ctl import create_topics, wait_placed
from examples.message_broker.layout import BrokerPaths, Isr, decode, decode_replicas
from framework import FrameworkError, ZooKeeperEnsemble, configure_logging, records
from framework.runtime import MasterIdentity
from framework.zk import Session, wait_exists, watch_children, watch_data
from framework.zkserver import four_letter

PATHS = BrokerPaths()
#: The broker processes' session timeout (why 6 s: docs/architecture.md, "Trust window,
#: ZooKeeper elections and the session timeout").
SESSION_TIMEOUT = 6.0
#: The lag limit the servers use by default: 2/3 of the session timeout.
LAG_LIMIT = SESSION_TIMEOUT * 2 / 3


@attrs.frozen
class Stamp:
    """What a demo message says (its payload, padded to about 250 bytes)."""

    producer: str
    n: int
    sent_at: float


@attrs.frozen
class Failover:
    """Seconds from the kill -9 of a primary until each topic it led had a new one."""

    p50: float
    max: float
    topics: int


@attrs.frozen
class Sigstop:
    """The SIGSTOP of the busiest backup: the longest stretches without an ack."""

    server: str
    backed_topics: int
    led_topics: int
    stopped_s: float
    lag_limit_s: float
    longest_ack_gap_backed_s: float
    longest_ack_gap_led_s: float
    longest_ack_gap_any_s: float
    target_s: float


@attrs.frozen
class Latency:
    """Publish -> deliver latency (ms)."""

    p50: float
    p99: float


@attrs.define
class Summary:
    """What the demo measured and checked (``summary.json``)."""

    topics: int
    failover_s: Failover | None = None
    controller_failover_s: float | None = None
    s4_in_sync_topics: int | None = None
    sigstop: Sigstop | None = None
    zk_writes_per_1000_msgs: float | None = None
    acknowledged: int = 0
    received: int = 0
    acknowledged_never_received: int = 0
    order_violations: int = 0
    duplicates_delivered: int = 0
    producer_retries: int = 0
    latency_ms: Latency | None = None
    killed_server: str = ""
    killed_controller: str = ""
    ok: bool = False
    elapsed_s: float | None = None


class Tally:
    """What producers had acknowledged and subscribers received."""

    def __init__(self) -> None:
        self.acked: set[tuple[str, str, int]] = set()
        self.received: set[tuple[str, str, int]] = set()
        self.deliveries = 0
        self.duplicates = 0
        self.order_violations = 0
        self.latencies: list[float] = []
        self._last: dict[tuple[str, str], int] = {}
        #: per topic: monotonic time of its latest ack, and the longest stretch without one
        #: since :meth:`reset_gaps`
        self.last_ack: dict[str, float] = {}
        self.max_gap: dict[str, float] = {}
        self._seen_ids: set[str] = set()
        self.changed = trio.Event()

    def on_ack(self, key: tuple[str, str, int]) -> None:
        self.acked.add(key)
        topic, _producer, _n = key
        now = time.monotonic()
        if topic in self.last_ack:
            self.max_gap[topic] = max(self.max_gap.get(topic, 0.0), now - self.last_ack[topic])
        self.last_ack[topic] = now
        self._poke()

    def reset_gaps(self) -> None:
        self.max_gap = {}

    async def wait_acked_everywhere(self, topics: list[str], since: float) -> None:
        """Return once every topic in ``topics`` had an ack after monotonic time ``since``."""
        while not all(self.last_ack.get(t, 0.0) > since for t in topics):
            await self.changed.wait()

    def on_message(self, msg_id: str, key: tuple[str, str, int], sent_at: float) -> None:
        self.deliveries += 1
        if msg_id in self._seen_ids or key in self.received:
            self.duplicates += 1
            return
        self._seen_ids.add(msg_id)
        self.received.add(key)
        self.latencies.append(time.time() - sent_at)
        topic, producer, n = key
        last = self._last.get((topic, producer), -1)
        if n < last:
            self.order_violations += 1
        self._last[(topic, producer)] = max(last, n)
        self._poke()

    def _poke(self) -> None:
        self.changed.set()
        self.changed = trio.Event()

    async def wait_acked(self, count: int) -> None:
        while len(self.acked) < count:
            await self.changed.wait()

    async def wait_all_received(self) -> None:
        while not self.acked <= self.received:
            await self.changed.wait()


async def produce(hosts: str, chroot: str, name: str, topics: list[str], tally: Tally,
                  stop: trio.Event) -> int:
    async with Session(hosts, chroot=chroot, session_timeout=4.0) as session, \
            Producer(session, producer_id=name) as producer:

        async def one(topic: str) -> None:
            n = 0
            while not stop.is_set():
                payload = records.encode(Stamp(name, n, time.time())) + b" " * 200
                await producer.send(topic, payload)
                tally.on_ack((topic, name, n))
                n += 1

        async with trio.open_nursery() as nursery:
            for topic in topics:
                nursery.start_soon(one, topic)
        return producer.retries


async def subscribe(hosts: str, chroot: str, name: str, topics: list[str], tally: Tally,
                    done: trio.Event) -> None:
    async with Session(hosts, chroot=chroot, session_timeout=4.0) as session, \
            Subscriber(session, name, topics) as sub:
        with trio.CancelScope() as scope:
            async def stopper() -> None:
                await done.wait()
                scope.cancel()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(stopper)
                async for msg in sub:
                    stamp = records.decode(msg.payload.rstrip(b" "), Stamp)
                    tally.on_message(msg.id, (msg.topic, stamp.producer, stamp.n),
                                     stamp.sent_at)
                    sub.ack(msg)


async def wait_full_isr(session: Session, topics: list[str], live: set[str]) -> None:
    async def one(topic: str) -> None:
        async for snap in watch_data(session, PATHS.isr(topic)):
            in_sync = set(decode(snap.data, Isr).in_sync)
            if len(in_sync) == 2 and in_sync <= live:
                return

    async with trio.open_nursery() as nursery:
        for topic in topics:
            nursery.start_soon(one, topic)


async def wait_settled(session: Session, topics: list[str]) -> None:
    """Return once every topic is placed on exactly two servers, both in sync (any move
    finished).  Watches the topic's placement and in-sync set, no polling."""
    async def one(topic: str) -> None:
        latest: dict[str, Any] = {}
        changed = trio.Event()

        async def follow(key: str, path: str) -> None:
            nonlocal changed
            async for snap in watch_data(session, path):
                latest[key] = snap.data
                changed.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(follow, "placement", PATHS.placement(topic))
            nursery.start_soon(follow, "isr", PATHS.isr(topic))
            while True:
                await changed.wait()
                changed = trio.Event()
                replicas = decode_replicas(latest.get("placement"))
                in_sync = set(decode(latest.get("isr"), Isr).in_sync)
                if len(replicas) == 2 and set(replicas) <= in_sync:
                    nursery.cancel_scope.cancel()

    async with trio.open_nursery() as nursery:
        for topic in topics:
            nursery.start_soon(one, topic)


async def epochs(session: Session, topics: list[str]) -> dict[str, int]:
    """The current primary epoch (czxid of the primary znode) of each topic."""
    old: dict[str, int] = {}
    for topic in topics:
        stat = await session.exists(PATHS.primary(topic))
        if stat is not None:
            old[topic] = stat.czxid
    return old


async def failover_times(session: Session, old: dict[str, int],
                         killed_at: float) -> list[float]:
    """Per topic: seconds from the kill until a primary znode of a newer epoch exists."""
    topics = list(old)
    times: list[float] = []

    async def one(topic: str) -> None:
        async for snap in watch_data(session, PATHS.primary(topic)):
            if snap.exists and snap.stat is not None and snap.stat.czxid != old.get(topic):
                times.append(time.monotonic() - killed_at)
                return

    async with trio.open_nursery() as nursery:
        for topic in topics:
            nursery.start_soon(one, topic)
    return times


async def stop_busiest_backup(session: Session, cluster: ProcessCluster, topics: list[str],
                              live: set[str], tally: Tally, summary: Summary) -> None:
    """SIGSTOP the backup of the most topics for twice the session timeout, then SIGCONT;
    record the longest ack gap on the topics it backed up and on those it led."""
    placed = await primaries(session, topics)
    placement = {t: decode_replicas((await session.get(PATHS.placement(t)))[0])
                 for t in topics}
    backups = Counter(s for t in topics for s in placement[t] if s != placed.get(t))
    victim, count = backups.most_common(1)[0]
    backed = [t for t in topics if victim in placement[t] and placed.get(t) != victim]
    led = [t for t in topics if placed.get(t) == victim]
    say(f"SIGSTOP {victim} (backup for {count} topics, primary for {len(led)}) for "
        f"{2 * SESSION_TIMEOUT:g} s; lag limit {LAG_LIMIT:.2f} s")
    tally.reset_gaps()
    os.kill(cluster.procs[victim].pid, signal.SIGSTOP)
    paused_at = time.monotonic()
    await trio.sleep(2 * SESSION_TIMEOUT)  # the fault's length, not a wait for a condition
    os.kill(cluster.procs[victim].pid, signal.SIGCONT)
    resumed_at = time.monotonic()
    with trio.fail_after(40):
        await tally.wait_acked_everywhere(topics, resumed_at)
        await wait_settled(session, topics)
    backed_gap = max((tally.max_gap.get(t, 0.0) for t in backed), default=0.0)
    led_gap = max((tally.max_gap.get(t, 0.0) for t in led), default=0.0)
    any_gap = max((tally.max_gap.get(t, 0.0) for t in topics), default=0.0)
    summary.sigstop = Sigstop(
        server=victim, backed_topics=len(backed), led_topics=len(led),
        stopped_s=round(resumed_at - paused_at, 2), lag_limit_s=round(LAG_LIMIT, 2),
        longest_ack_gap_backed_s=round(backed_gap, 3),
        longest_ack_gap_led_s=round(led_gap, 3),
        longest_ack_gap_any_s=round(any_gap, 3),
        target_s=round(LAG_LIMIT + 1, 2),
    )
    say(f"{victim} resumed; longest ack gap: {backed_gap:.2f} s on the topics it backed up "
        f"(target <= {LAG_LIMIT + 1:.2f} s), {led_gap:.2f} s on the topics it led")


async def count_in_sync(session: Session, topics: list[str], server: str) -> int:
    count = 0
    for topic in topics:
        if server in decode((await session.get(PATHS.isr(topic)))[0], Isr).in_sync:
            count += 1
    return count


def zxid(hosts: str) -> int:
    """The server's last zxid (every ZooKeeper write - and session event - moves it)."""
    port = int(hosts.split(",")[0].rsplit(":", 1)[1])
    for line in four_letter(port, "srvr").splitlines():
        if line.startswith("Zxid:"):
            return int(line.split(":")[1].strip(), 16)
    return 0


def say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


async def run_demo(hosts: str, chroot: str, out: Path, topics_count: int,
                   seconds: float) -> Summary:
    topics = [f"topic-{i:03d}" for i in range(topics_count)]
    cluster = ProcessCluster(hosts, chroot, out / "data", out / "logs",
                             session_timeout=SESSION_TIMEOUT)
    summary = Summary(topics_count)
    tally = Tally()
    try:
        async with Session(hosts, chroot=chroot, session_timeout=4.0) as session:
            with trio.fail_after(60):
                for name in ("s1", "s2", "s3"):
                    await cluster.spawn("server", name)
                await cluster.spawn("controller", "c1")
                for name in ("s1", "s2", "s3"):
                    await cluster.wait_joined(session, name)
                await wait_exists(session, PATHS.app.rendezvous)
                await cluster.spawn("controller", "c2")
                say("3 servers and 2 controllers up; creating topics")
                await create_topics(session, topics)
                await wait_placed(session, topics)
                await wait_full_isr(session, topics, {"s1", "s2", "s3"})
                say(f"{topics_count} topics placed, each with an in-sync backup")
            stop, done = trio.Event(), trio.Event()
            async with trio.open_nursery() as nursery:
                for i in range(4):
                    nursery.start_soon(subscribe, hosts, chroot, f"sub{i}", topics[i::4],
                                       tally, done)
                retries: list[int] = []

                async def producer_task(i: int) -> None:
                    retries.append(await produce(hosts, chroot, f"p{i}", topics, tally, stop))

                for i in range(4):
                    nursery.start_soon(producer_task, i)
                started = time.monotonic()
                zxid_before, acked_before = zxid(hosts), len(tally.acked)
                with trio.fail_after(30):
                    await tally.wait_acked(3000)
                say(f"load running: {len(tally.acked)} acknowledged, "
                    f"{len(tally.received)} received")
                placed = await primaries(session, topics)
                victim, led = Counter(placed.values()).most_common(1)[0]
                victim_topics = [t for t, s in placed.items() if s == victim]
                say(f"kill -9 {victim} (primary for {led} topics)")
                old = await epochs(session, victim_topics)
                killed_at = time.monotonic()
                await cluster.kill9(victim)
                with trio.fail_after(30):
                    times = sorted(await failover_times(session, old, killed_at))
                failover = Failover(round(statistics.median(times), 3), round(max(times), 3),
                                    len(times))
                summary.failover_s = failover
                say(f"{len(times)} topics failed over: p50 {failover.p50} s, "
                    f"max {failover.max} s")
                live = {"s1", "s2", "s3"} - {victim}
                with trio.fail_after(30):
                    await wait_server_gone(session, victim)
                    await tally.wait_acked(len(tally.acked) + 2000)
                leader = decode((await session.get(PATHS.app.rendezvous))[0],
                                MasterIdentity).name
                say(f"kill -9 the active controller {leader}; replacement server s4 joins")
                ctl_killed = time.monotonic()
                await cluster.kill9(leader)
                await cluster.spawn("server", "s4")
                live |= {"s4"}
                with trio.fail_after(40):
                    async for snap in watch_data(session, PATHS.app.rendezvous):
                        if snap.exists and decode(snap.data, MasterIdentity).name != leader:
                            break
                    summary.controller_failover_s = round(time.monotonic() - ctl_killed, 3)
                    say(f"standby controller took over after "
                        f"{summary.controller_failover_s} s")
                    await cluster.wait_joined(session, "s4")
                    await wait_full_isr(session, topics, live)
                    say("every topic has two in-sync live replicas again")
                    async for snap in watch_children(session, PATHS.assign_dir("s4")):
                        if snap.children:  # the new controller gave s4 its first replicas
                            break
                    await wait_settled(session, topics)
                    summary.s4_in_sync_topics = await count_in_sync(session, topics, "s4")
                say(f"moves onto s4 finished (make before break): s4 holds an in-sync copy "
                    f"of {summary.s4_in_sync_topics} topics")
                await stop_busiest_backup(session, cluster, topics, live, tally, summary)
                remaining = seconds - (time.monotonic() - started)
                if remaining > 0:
                    await trio.sleep(remaining)  # a bounded run: keep the load going
                stop.set()
                writes = zxid(hosts) - zxid_before
                summary.zk_writes_per_1000_msgs = round(
                    writes * 1000 / max(len(tally.acked) - acked_before, 1), 1)
                say("producers stopped; waiting for subscribers to receive everything")
                with trio.move_on_after(30):
                    while len(retries) < 4:
                        await tally.changed.wait()
                    await tally.wait_all_received()
                done.set()
        lat = sorted(tally.latencies)
        lost = tally.acked - tally.received
        summary = attrs.evolve(
            summary,
            acknowledged=len(tally.acked),
            received=len(tally.received),
            acknowledged_never_received=len(lost),
            order_violations=tally.order_violations,
            duplicates_delivered=tally.duplicates,
            producer_retries=sum(retries),
            latency_ms=Latency(round(lat[len(lat) // 2] * 1000, 1),
                               round(lat[int(len(lat) * 0.99)] * 1000, 1)) if lat else None,
            killed_server=victim,
            killed_controller=leader,
        )
        summary.ok = (len(lost) == 0 and tally.order_violations == 0
                      and len(tally.acked) > 0 and summary.sigstop is not None
                      and summary.sigstop.longest_ack_gap_backed_s <= summary.sigstop.target_s)
        return summary
    finally:
        await cluster.stop_all()


def render_summary(summary: Summary) -> str:
    """The summary as lines, the checked ones marked."""
    failover, sigstop = summary.failover_s, summary.sigstop
    rows = [
        ("messages acknowledged", summary.acknowledged, ""),
        ("messages received", summary.received, ""),
        ("acknowledged but never received", summary.acknowledged_never_received,
         "(must be 0)"),
        ("per-topic order violations", summary.order_violations, "(must be 0)"),
        ("duplicates delivered", summary.duplicates_delivered,
         f"(reported; producer retries: {summary.producer_retries})"),
        (f"failover after kill -9 of {summary.killed_server}",
         f"p50 {failover and failover.p50} s, max {failover and failover.max} s",
         f"({failover and failover.topics} topics)"),
        (f"controller failover after kill -9 of {summary.killed_controller}",
         f"{summary.controller_failover_s} s", ""),
        ("ZooKeeper transactions per 1,000 messages", summary.zk_writes_per_1000_msgs, ""),
        (f"SIGSTOP {sigstop and sigstop.server} {sigstop and sigstop.stopped_s} s: longest "
         "ack gap, topics it backed up", f"{sigstop and sigstop.longest_ack_gap_backed_s} s",
         f"(target <= lag limit + 1 s = {sigstop and sigstop.target_s} s)"),
        ("  ... topics it led (replaced when its session expired)",
         f"{sigstop and sigstop.longest_ack_gap_led_s} s", f"(session {SESSION_TIMEOUT:g} s)"),
        ("  ... any topic", f"{sigstop and sigstop.longest_ack_gap_any_s} s", ""),
        ("elapsed", f"{summary.elapsed_s} s", "(target: under 120 s)"),
    ]
    return "summary:\n" + "\n".join(f"  {name + ':':<52} {value!s:<24} {note}".rstrip()
                                     for name, value, note in rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="demo-broker", description=__doc__.split("\n")[0])
    parser.add_argument("--topics", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=25.0,
                        help="minimum length of the load phase")
    parser.add_argument("--out", default=str(ROOT / "out" / "broker-demo"))
    args = parser.parse_args(argv)
    if args.topics < 4:
        print("demo-broker: error: --topics must be at least 4", file=sys.stderr)
        return 2
    configure_logging(level="warning")
    # the servers sign their replication links with a shared secret (protocol.py); the
    # child processes inherit it
    os.environ.setdefault(protocol.SECRET_ENV, secrets.token_hex(16))
    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    chroot = f"/demo-broker-{uuid.uuid4().hex[:8]}"

    def go(hosts: str) -> Summary:
        return trio.run(run_demo, hosts, chroot, out, args.topics, args.seconds)

    began = time.monotonic()

    try:
        hosts = os.environ.get("FRAMEWORK_ZK_HOSTS")
        if hosts:
            summary = go(hosts)
        else:
            with ZooKeeperEnsemble(1) as zk:
                summary = go(zk.connect_string)
    except KeyboardInterrupt:
        return 130
    except FrameworkError as exc:
        print(f"demo-broker: error: {exc}", file=sys.stderr)
        return 2
    except trio.TooSlowError:
        print(f"demo-broker: FAILED: a phase did not finish in time (logs in {out}/logs)",
              file=sys.stderr)
        return 1
    summary.elapsed_s = round(time.monotonic() - began, 1)
    document = json.dumps(records.unstructure(summary), indent=2)
    (out / "summary.json").write_text(document)
    print(document)
    print(render_summary(summary), flush=True)
    print("demo-broker:", "OK - every acknowledged message was received, in order"
          if summary.ok else "FAILED - see above", flush=True)
    return 0 if summary.ok else 1


if __name__ == "__main__":
    sys.exit(main())
