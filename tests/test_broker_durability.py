"""Durable broker logs: recovery from segments (checksums, torn tails) and the double failure
(kill -9 of both replicas of a topic, in either order, then a restart) with real processes
against the real ZooKeeper: nothing acknowledged is lost and publishing resumes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import trio

from examples.message_broker.client import Producer, Subscriber
from examples.message_broker.cluster import ProcessCluster, primaries, wait_server_gone
from examples.message_broker.ctl import create_topics, wait_placed
from examples.message_broker.layout import (
    BrokerPaths,
    Isr,
    PrimaryRecord,
    decode,
    decode_replicas,
)
from examples.message_broker.log import Record, TopicLog, encode_records
from framework import Session
from framework.zk import watch_data

TIMEOUT = 2.0  # broker processes' session timeout


# ---------------------------------------------------------------- the log on its own


def _records(n: int, start: int = 0) -> list[Record]:
    return [Record("p", i, f"m{i}".encode() * 10) for i in range(start, start + n)]


def test_log_recovers_its_records_and_copy(tmp_path: Path) -> None:
    log = TopicLog(tmp_path / "t", fsync="always", segment_bytes=100)
    for start in range(0, 25, 5):  # a segment rolls over between appends
        log.append(_records(5, start))
    log.mark_primary(3)
    copy = log.copy
    log.close()
    again = TopicLog(tmp_path / "t", fsync="always", segment_bytes=100)
    assert again.records == _records(25)
    assert (again.copy, again.primary_term, again.cut_bytes) == (copy, 3, 0)
    assert again.last_seq == {"p": 24}
    assert len(list((tmp_path / "t").glob("*.seg"))) > 1  # several segments were read
    again.append(_records(5, 25))
    again.close()
    assert TopicLog(tmp_path / "t").records == _records(30)


def test_log_cuts_a_torn_tail_and_a_corrupt_record(tmp_path: Path) -> None:
    log = TopicLog(tmp_path / "t", fsync="always")
    log.append(_records(20))
    log.close()
    (segment,) = (tmp_path / "t").glob("*.seg")
    with open(segment, "ab") as out:  # a record cut short by a crash in the middle of it
        out.write(b"\x00\x00\x01\x00\x12\x34")
    torn = TopicLog(tmp_path / "t")
    assert torn.records == _records(20) and torn.cut_bytes == 6
    torn.append(_records(1, 20))  # appends carry on after the cut
    torn.close()
    assert TopicLog(tmp_path / "t").records == _records(21)
    # flip one byte inside record 10: it fails its checksum and is cut with all after it
    blob = bytearray(segment.read_bytes())
    at = len(encode_records(_records(10)))
    blob[at + 12] ^= 0xFF
    segment.write_bytes(bytes(blob))
    corrupt = TopicLog(tmp_path / "t")
    assert corrupt.records == _records(10)
    assert corrupt.cut_bytes == len(blob) - at


def test_reset_starts_a_new_copy_and_keeps_the_directory(tmp_path: Path) -> None:
    log = TopicLog(tmp_path / "t")
    log.append(_records(3))
    old = log.copy
    log.reset()
    assert log.end == 0 and log.copy != old and (tmp_path / "t").is_dir()
    log.close()
    again = TopicLog(tmp_path / "t")
    assert again.end == 0 and again.copy == log.copy


def test_a_corrupt_meta_file_makes_a_copy_of_its_own(
    tmp_path: Path, captured_logs: list[dict[str, object]]
) -> None:
    """``meta.json`` that is not a record: logged, and the log gets a new token (it can never
    pass for the copy ZooKeeper counted in sync); its records stay."""
    log = TopicLog(tmp_path / "t")
    log.append(_records(3))
    old = log.copy
    log.close()
    (tmp_path / "t" / "meta.json").write_bytes(b'{"copy": 17')
    again = TopicLog(tmp_path / "t")
    assert again.copy not in ("", old) and again.records == _records(3)
    assert "broker.log_meta_corrupt" in [e["event"] for e in captured_logs]


def test_log_of_another_topic_incarnation_is_not_taken(tmp_path: Path) -> None:
    """A log is bound to the topic incarnation it was written for: reopened for the same one
    it is kept, for a topic of the same name created again (or another cluster) it starts
    afresh."""
    log = TopicLog(tmp_path / "t")
    log.bind("one")
    log.append(_records(5))
    log.close()
    same = TopicLog(tmp_path / "t")
    same.bind("one")
    assert same.records == _records(5)
    same.close()
    other = TopicLog(tmp_path / "t")
    copy = other.copy
    other.bind("two")
    assert other.end == 0 and other.copy != copy and other.topic_id == "two"
    other.close()
    assert TopicLog(tmp_path / "t").topic_id == "two"


# ---------------------------------------------------------------- the double failure


class Load:
    """Several concurrent senders on one topic; records every acknowledged payload."""

    def __init__(self) -> None:
        self.acked: set[bytes] = set()
        self._progress = trio.Event()

    async def run(self, producer: Producer, topic: str, lane: int) -> None:
        n = 0
        while True:
            payload = f"{lane}:{n}".encode()
            await producer.send(topic, payload)
            self.acked.add(payload)
            n += 1
            self._progress.set()
            self._progress = trio.Event()

    async def until(self, total: int) -> None:
        while len(self.acked) < total:
            await self._progress.wait()


async def read_back(session: Session, topic: str, want: set[bytes]) -> list[bytes]:
    """Everything a fresh reader reads from offset 0, in order, until ``want`` is covered."""
    got: list[bytes] = []
    seen: set[bytes] = set()
    async with Subscriber(session, None, [topic]) as sub:
        async for msg in sub:
            got.append(msg.payload)
            seen.add(msg.payload)
            if want <= seen:
                break
    return got


async def wait_isr(session: Session, topic: str, in_sync: set[str]) -> None:
    async for snap in watch_data(session, BrokerPaths().isr(topic)):
        if set(decode(snap.data, Isr).in_sync) == in_sync:
            return


async def wait_primary(session: Session, topic: str, server: str) -> None:
    async for snap in watch_data(session, BrokerPaths().primary(topic)):
        if snap.exists and decode(snap.data, PrimaryRecord).server == server:
            return


@pytest.mark.parametrize("order", ["backup_first", "primary_first", "both_at_once",
                                   "primary_first_one_copy"])
async def test_double_failure_loses_no_acknowledged_message(
    session: Session, zk_hosts: str, chroot: str, tmp_path: Path, order: str
) -> None:
    """``primary_first_one_copy``: a ``one_copy`` topic, whose surviving backup takes over and
    acknowledges alone before it is killed too: those one-copy acknowledgements survive."""
    topic = "d"
    cluster = ProcessCluster(zk_hosts, chroot, tmp_path / "data", tmp_path / "logs",
                             session_timeout=TIMEOUT)
    durable = {"BROKER_FSYNC": "always"}
    try:
        with trio.fail_after(60):
            for name in ("s1", "s2"):
                await cluster.spawn("server", name, env=durable)
            await cluster.spawn("controller", "c1")
            for name in ("s1", "s2"):
                await cluster.wait_joined(session, name)
            mode = "one_copy" if order.endswith("one_copy") else "refuse"
            await create_topics(session, [topic], mode=mode)
            await wait_placed(session, [topic])
            await wait_isr(session, topic, {"s1", "s2"})
            primary = (await primaries(session, [topic]))[topic]
            backup = ({"s1", "s2"} - {primary}).pop()
            load = Load()
            async with Producer(session, ack_timeout=2.0) as producer, \
                    trio.open_nursery() as nursery:
                for lane in range(4):
                    nursery.start_soon(load.run, producer, topic, lane)
                await load.until(200)
                if order == "backup_first":
                    await cluster.kill9(backup)
                    await wait_isr(session, topic, {primary})  # the primary went on alone
                    await cluster.kill9(primary)
                elif order.startswith("primary_first"):
                    await cluster.kill9(primary)
                    await wait_primary(session, topic, backup)  # the backup took over
                    if mode == "one_copy":
                        await load.until(len(load.acked) + 100)  # acknowledged with one copy
                    await cluster.kill9(backup)
                else:  # both still in the in-sync set: either may take over
                    await cluster.kill9(primary)
                    await cluster.kill9(backup)
                before = len(load.acked)
                for name in ("s1", "s2"):  # both come back under their names
                    await cluster.spawn("server", name, env=durable)
                await load.until(before + 100)  # publishing resumed
                nursery.cancel_scope.cancel()
            got = await read_back(session, topic, load.acked)
            lost = load.acked - set(got)
            print(f"double failure ({order}): acknowledged {len(load.acked)}, "
                  f"acknowledged before the kills {before}, lost {len(lost)}, "
                  f"read back {len(got)}, duplicates {len(got) - len(set(got))}")
            assert not lost
            assert len(got) == len(set(got))  # retries across the restart appended nothing twice
    finally:
        await cluster.stop_all()


async def test_restart_of_the_only_in_sync_replica_recovers_its_log(
    session: Session, zk_hosts: str, chroot: str, tmp_path: Path
) -> None:
    """A one_copy topic whose backup is gone: the primary alone holds the acknowledged
    records; after its kill -9 and restart it takes over with its recovered log."""
    topic = "solo"
    cluster = ProcessCluster(zk_hosts, chroot, tmp_path / "data", tmp_path / "logs",
                             session_timeout=TIMEOUT)
    durable = {"BROKER_FSYNC": "always"}
    try:
        with trio.fail_after(40):
            await cluster.spawn("server", "s1", env=durable)
            await cluster.spawn("controller", "c1")
            await cluster.wait_joined(session, "s1")
            await create_topics(session, [topic], mode="one_copy")
            await wait_placed(session, [topic])
            sent = {f"m{i}".encode() for i in range(50)}
            async with Producer(session) as producer:
                for payload in sorted(sent):
                    await producer.send(topic, payload)
            await cluster.kill9("s1")
            await wait_server_gone(session, "s1")
            await cluster.spawn("server", "s1", env=durable)
            assert set(await read_back(session, topic, sent)) >= sent
            data = tmp_path / "data" / "s1" / topic
            assert any(p.suffix == ".seg" for p in data.iterdir()), os.listdir(data)
    finally:
        await cluster.stop_all()


async def test_double_failure_with_a_spare_server_waits_for_its_in_sync_replica(
    session: Session, zk_hosts: str, chroot: str, tmp_path: Path
) -> None:
    """Primary killed, its backup took over and was killed too, with a third server live:
    the controller keeps the topic on the last in-sync replica (only its log proves every
    acknowledged record) instead of moving it to the spare; the old primary returns first
    and cannot take over; once the last primary returns, publishing resumes, nothing lost."""
    topic = "w"
    cluster = ProcessCluster(zk_hosts, chroot, tmp_path / "data", tmp_path / "logs",
                             session_timeout=TIMEOUT)
    durable = {"BROKER_FSYNC": "always"}
    servers = {"s1", "s2", "s3"}
    try:
        with trio.fail_after(60):
            for name in sorted(servers):
                await cluster.spawn("server", name, env=durable)
            await cluster.spawn("controller", "c1")
            for name in sorted(servers):
                await cluster.wait_joined(session, name)
            await create_topics(session, [topic])
            await wait_placed(session, [topic])
            placed = decode_replicas((await session.get(BrokerPaths().placement(topic)))[0])
            await wait_isr(session, topic, set(placed))
            primary = (await primaries(session, [topic]))[topic]
            backup = (set(placed) - {primary}).pop()
            load = Load()
            async with Producer(session, ack_timeout=2.0) as producer, \
                    trio.open_nursery() as nursery:
                for lane in range(4):
                    nursery.start_soon(load.run, producer, topic, lane)
                await load.until(300)
                await cluster.kill9(primary)
                await wait_primary(session, topic, backup)
                await cluster.kill9(backup)
                await wait_server_gone(session, backup)
                before = len(load.acked)
                await cluster.spawn("server", primary, env=durable)  # not the last primary
                await cluster.wait_joined(session, primary)
                # a sync point: once a topic created now has a primary, the controller has
                # reconciled with the old primary back (and the spare) - yet ``w`` must stay
                # placed on the last primary, or it could never be served again
                await create_topics(session, ["probe"])
                await wait_placed(session, ["probe"])
                assert backup in decode_replicas(
                    (await session.get(BrokerPaths().placement(topic)))[0])
                await cluster.spawn("server", backup, env=durable)
                await load.until(before + 200)
                nursery.cancel_scope.cancel()
            got = await read_back(session, topic, load.acked)
            print(f"double failure with a spare: acknowledged {len(load.acked)}, "
                  f"lost {len(load.acked - set(got))}")
            assert load.acked <= set(got) and len(got) == len(set(got))
    finally:
        await cluster.stop_all()


async def test_a_new_cluster_on_old_data_does_not_serve_old_records(
    session: Session, zk_hosts: str, chroot: str, tmp_path: Path
) -> None:
    """Servers keep their logs across restarts, but a log belongs to one topic incarnation:
    a new cluster (another chroot) on the same data directories creating a topic of the same
    name starts it empty."""
    from examples.message_broker.cluster import LocalCluster

    with trio.fail_after(40):
        for run, root in enumerate((chroot, f"{chroot}/again")):
            async with Session(zk_hosts, chroot=root) as zk, trio.open_nursery() as nursery:
                cluster = LocalCluster(zk_hosts, root, tmp_path, nursery)
                for name in ("s1", "s2"):
                    await cluster.start_server(name, zk)
                await cluster.start_controller("c1")
                await create_topics(zk, ["same"])
                await wait_placed(zk, ["same"])
                async with Producer(zk) as producer:
                    await producer.send_many("same", [f"run{run}-{i}".encode() for i in range(3)])
                got = await read_back(zk, "same", {f"run{run}-2".encode()})
                assert got == [f"run{run}-{i}".encode() for i in range(3)]
                nursery.cancel_scope.cancel()
