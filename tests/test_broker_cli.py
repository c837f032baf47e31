"""The broker's command line and visibility: ``ctl produce``/``consume`` as real processes,
``ctl list`` as a table, the operator's ``force-leader``, one-line errors for bad input, and
broker servers listed as live workers by ``framework status``."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import trio

from examples.message_broker import ctl
from examples.message_broker.client import Producer, Subscriber
from examples.message_broker.cluster import ROOT, LocalCluster
from examples.message_broker.ctl import create_topics, force_leader
from examples.message_broker.layout import (
    BrokerPaths,
    Isr,
    NodeRecord,
    Position,
    PrimaryRecord,
    decode,
)
from framework import Session, records
from framework.cli.render import render_status
from framework.runtime import App
from framework.runtime.operations import gather_status
from framework.runtime.records import MemberState
from framework.testing import spawn
from framework.zk import watch_data

PATHS = BrokerPaths()


async def run_ctl(zk_hosts: str, chroot: str, *argv: str,
                  stdin: bytes = b"") -> tuple[int, str, str]:
    """``python -m examples.message_broker.ctl ARGV`` as a process: status, stdout, stderr."""
    env = os.environ | {"PYTHONPATH": str(ROOT), "FRAMEWORK_LOG_LEVEL": "error"}
    done = await trio.run_process(
        [sys.executable, "-m", "examples.message_broker.ctl", "--zk", zk_hosts,
         "--chroot", chroot, *argv], stdin=stdin, capture_stdout=True, capture_stderr=True,
        check=False, env=env, cwd=ROOT)
    return done.returncode, done.stdout.decode(), done.stderr.decode()


async def test_produce_consume_and_list_from_the_command_line(
    session: Session, zk_hosts: str, chroot: str, tmp_path: Path
) -> None:
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            cluster = LocalCluster(zk_hosts, chroot, tmp_path, nursery)
            await cluster.start_with_topics(session, ["cli"])
            assert await run_ctl(zk_hosts, chroot, "produce", "cli", "hello") == \
                (0, "", "produced 1 message(s) to cli\n")
            status, _, err = await run_ctl(zk_hosts, chroot, "produce", "cli", "-",
                                           stdin=b"a\nb b\nc\n")
            assert (status, err) == (0, "produced 3 message(s) to cli\n")
            assert await run_ctl(zk_hosts, chroot, "consume", "cli") == \
                (0, "hello\na\nb b\nc\n", "")
            assert await run_ctl(zk_hosts, chroot, "consume", "cli", "--from", "2",
                                 "--offsets") == (0, "2\tb b\n3\tc\n", "")
            # a named reader moves its position; the next run starts there
            assert (await run_ctl(zk_hosts, chroot, "consume", "cli", "--from", "3",
                                  "--name", "tail"))[:2] == (0, "c\n")
            assert decode((await session.get(PATHS.subscriber("cli", "tail")))[0],
                          Position) == Position(4)
            # `consume --follow | head -1`: the reader goes away, the command ends quietly
            async with spawn(  # killed at the end of the block whatever happens
                    [sys.executable, "-m", "examples.message_broker.ctl", "--zk", zk_hosts,
                     "--chroot", chroot, "consume", "cli", "--follow"],
                    name="follow", log_dir=tmp_path, pipe_stdout=True, cwd=ROOT,
                    env={"PYTHONPATH": str(ROOT), "FRAMEWORK_LOG_LEVEL": "error"}) as follow:
                assert follow.lines is not None and follow.stdout is not None
                assert await follow.lines.next() == "hello"
                await follow.stdout.aclose()
                await run_ctl(zk_hosts, chroot, "produce", "cli", "x" * 70_000)  # > a pipe
                assert (await follow.wait(), follow.log()) == (0, "")  # stderr: nothing
            status, table, _ = await run_ctl(zk_hosts, chroot, "list")
            header, row = table.strip().splitlines()
            assert status == 0 and header.split()[:3] == ["TOPIC", "MODE", "PRIMARY"]
            assert row.split()[:2] == ["cli", "refuse"] and "tail@4" in row
            status, doc, _ = await run_ctl(zk_hosts, chroot, "list", "--json")
            (info,) = json.loads(doc)
            assert (info["topic"], info["subscribers"]) == ("cli", {"tail": 4})
            nursery.cancel_scope.cancel()


def test_bad_input_is_one_line(zk_hosts: str, chroot: str,
                               capsys: pytest.CaptureFixture[str]) -> None:
    base = ["--zk", zk_hosts, "--chroot", chroot]
    bad = [
        ["produce", "nosuch", "x"],  # unknown topic
        ["consume", "nosuch"],
        ["consume", "bad/name"],
        ["consume", "nosuch", "--from", "-1"],
        ["force-leader", "nosuch", "s1", "--may-lose", "0"],
        ["force-leader", "nosuch", "s1", "--may-lose", "-1"],
    ]
    for argv in bad:
        assert ctl.main([*base, *argv]) == 2, argv
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == len(bad), err
    assert all(line.startswith("broker ctl: error:") for line in err), err
    assert "unknown topic 'nosuch'" in err[0] and "unknown topic" in err[1]


async def test_force_leader_says_what_it_may_lose(session: Session) -> None:
    """The command refuses while the known loss exceeds ``--may-lose``, else rewrites the
    in-sync record naming the server (conditionally)."""
    await create_topics(session, ["f"])
    await session.create(PATHS.isr("f"), records.encode(Isr(("gone",), "gone", 3, hw=60)),
                         makepath=True)
    await session.ensure_path(PATHS.nodes)
    await session.create(f"{PATHS.nodes}/s9", records.encode(NodeRecord("s9", stranded={"f": 40})),
                         ephemeral=True)
    with pytest.raises(Exception, match="at least 20 acknowledged messages would be lost"):
        await force_leader(session, "f", "s9", 5)
    with pytest.raises(Exception, match="server gone is not live"):
        await force_leader(session, "f", "gone", 100)
    said = await force_leader(session, "f", "s9", 20)
    assert "at least 20 acknowledged messages lost" in said
    record = decode((await session.get(PATHS.isr("f")))[0], Isr)
    assert (record.in_sync, record.forced, record.term) == (("s9",), "s9", 4)


async def wait_isr(session: Session, topic: str, in_sync: set[str]) -> None:
    async for snap in watch_data(session, PATHS.isr(topic)):
        if set(decode(snap.data, Isr).in_sync) == in_sync:
            return


async def test_force_leader_brings_a_stranded_topic_back(
    session: Session, zk_hosts: str, chroot: str, tmp_path: Path
) -> None:
    """Both replicas gone, the in-sync one for good: the other returns with its recovered
    log, and only ``force-leader`` lets it take over; publishing resumes."""
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            cluster = LocalCluster(zk_hosts, chroot, tmp_path, nursery, session_timeout=2.0)
            await cluster.start_with_topics(session, ["g"])
            await wait_isr(session, "g", {"s1", "s2"})
            primary = decode((await session.get(PATHS.primary("g")))[0], PrimaryRecord).server
            backup = ({"s1", "s2"} - {primary}).pop()
            sent = [f"m{i}".encode() for i in range(50)]
            async with Producer(session) as producer:
                await producer.send_many("g", sent)
            cluster.crash(backup)
            await wait_isr(session, "g", {primary})  # the primary went on alone
            cluster.crash(primary)  # and is gone for good
            await cluster.start_server(backup, session)  # back, outside the in-sync set
            async for snap in watch_data(session, f"{PATHS.nodes}/{backup}"):
                if "g" in decode(snap.data, NodeRecord).stranded:
                    break
            said = await force_leader(session, "g", backup, 0)
            assert "at least 0 acknowledged messages lost" in said
            await cluster.start_server("s3", session)  # a new backup to publish with
            async with Producer(session) as producer:
                await producer.send_many("g", [b"after"])
            got: list[bytes] = []
            async with Subscriber(session, None, ["g"]) as sub:
                async for msg in sub:
                    got.append(msg.payload)
                    if msg.payload == b"after":
                        break
            assert got == [*sent, b"after"]
            nursery.cancel_scope.cancel()


async def test_framework_status_lists_broker_servers(
    session: Session, zk_hosts: str, chroot: str, tmp_path: Path
) -> None:
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            cluster = LocalCluster(zk_hosts, chroot, tmp_path, nursery)
            for name in ("s1", "s2"):
                await cluster.start_server(name, session)
            status = await gather_status(session, App("broker"))
            assert set(status.workers) == {"s1", "s2"}
            assert status.workers["s1"].state is MemberState.RUNNING
            assert status.workers["s1"].kind == "broker server"
            assert render_status(status) is not None
            nursery.cancel_scope.cancel()
