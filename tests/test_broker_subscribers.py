"""Exclusive subscribers: one live instance per subscriber name, and position commits that
only its holder can make - a second instance waits or is refused, and a paused (SIGSTOP)
instance that resumes after its session expired never moves a position."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import trio
import trio.testing

from examples.message_broker.client import Message, Producer, Subscriber, SubscriberBusyError
from examples.message_broker.cluster import ROOT, LocalCluster
from examples.message_broker.ctl import create_topics
from examples.message_broker.layout import BrokerPaths, Position, decode
from framework import Session, errors
from framework.testing.faults import expire_session
from framework.zk import watch_data

PATHS = BrokerPaths()


async def position(session: Session, topic: str, name: str) -> int:
    return decode((await session.get(PATHS.subscriber(topic, name)))[0], Position).offset


async def wait_position(session: Session, topic: str, name: str, offset: int) -> None:
    async for snap in watch_data(session, PATHS.subscriber(topic, name)):
        if snap.exists and decode(snap.data, Position).offset == offset:
            return


async def test_second_instance_is_refused_or_waits(session: Session, zk_hosts: str,
                                                   chroot: str) -> None:
    await create_topics(session, ["x"])
    with trio.fail_after(20):
        async with Session(zk_hosts, chroot=chroot) as other:
            holding, leave = trio.Event(), trio.Event()
            entered = trio.Event()

            async def first() -> None:
                async with Subscriber(session, "s", ["x"], commit_interval=3600) as sub:
                    sub.ack(Message("x", 6, "p", 6, b""))
                    holding.set()
                    await leave.wait()  # then commits 7 on its way out, and frees the name

            async def second() -> None:
                async with Subscriber(other, "s", ["x"]) as sub:
                    # it read the position only once the first instance had gone
                    assert sub.committed["x"] == 7
                    entered.set()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(first)
                await holding.wait()
                with pytest.raises(SubscriberBusyError) as refused:
                    async with Subscriber(other, "s", ["x"], exclusive="refuse"):
                        pass
                assert "already live" in str(refused.value) and "\n" not in str(refused.value)
                nursery.start_soon(second)
                await trio.testing.wait_all_tasks_blocked()
                assert not entered.is_set()  # waits while the first instance lives
                leave.set()
                await entered.wait()


async def test_zombie_instance_never_moves_a_position(session: Session, zk_hosts: str,
                                                      chroot: str) -> None:
    await create_topics(session, ["z"])
    with trio.fail_after(30):
        async with Session(zk_hosts, chroot=chroot, session_timeout=2.0) as zombie_session:
            zombie = Subscriber(zombie_session, "s", ["z"], commit_interval=3600)
            with pytest.raises((errors.LockLost, errors.SessionInterrupted)):
                async with zombie:
                    zombie.ack(Message("z", 41, "p", 41, b""))  # acked, not yet committed
                    await expire_session(zombie_session)
                    await trio.sleep_forever()  # cancelled: the name was lost
            assert await position(session, "z", "s") == 0  # its exit commit was refused
            async with Subscriber(session, "s", ["z"], commit_interval=3600) as live:
                live.ack(Message("z", 9, "p", 9, b""))
                await live.commit()
                assert await position(session, "z", "s") == 10
                await zombie.commit()  # a late commit of the old instance: refused
                assert await position(session, "z", "s") == 10


def _consume(zk_hosts: str, chroot: str, *extra: str) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "examples.message_broker.ctl", "--zk", zk_hosts,
            "--chroot", chroot, "consume", "q", "--name", "s", "--follow", "--offsets",
            "--session-timeout", "2", *extra]
    env = os.environ | {"PYTHONPATH": str(ROOT), "FRAMEWORK_LOG_LEVEL": "error"}
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                            cwd=ROOT)


class Lines:
    """A child's stdout lines as they arrive (read in a thread)."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        self.lines: list[str] = []
        self._changed = trio.Event()

    async def read(self) -> None:
        assert self.proc.stdout is not None
        while True:
            line = await trio.to_thread.run_sync(self.proc.stdout.readline,
                                                 abandon_on_cancel=True)
            if not line:
                return
            self.lines.append(line.decode().rstrip("\n"))
            self._changed.set()
            self._changed = trio.Event()

    async def until(self, count: int) -> None:
        while len(self.lines) < count:
            await self._changed.wait()


async def test_paused_subscriber_process_resumes_as_a_zombie(
    session: Session, zk_hosts: str, chroot: str, tmp_path: Path
) -> None:
    """Two ``ctl consume --name s`` processes: the first is SIGSTOPped past its session, the
    second takes the name over and reads on; the first, resumed, prints nothing more, exits
    with one line, and its final commit (which would move the position back) is refused."""
    procs: list[subprocess.Popen[bytes]] = []
    try:
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                cluster = LocalCluster(zk_hosts, chroot, tmp_path, nursery)
                await cluster.start_with_topics(session, ["q"])
                async with Producer(session) as producer:
                    await producer.send_many("q", [f"m{i}".encode() for i in range(10)])
                    # the first never commits while it lives: 10 acks held in memory
                    first = Lines(_consume(zk_hosts, chroot, "--commit-interval", "3600"))
                    procs.append(first.proc)
                    nursery.start_soon(first.read)
                    await first.until(10)
                    second = Lines(_consume(zk_hosts, chroot, "--commit-interval", "0.1"))
                    procs.append(second.proc)
                    nursery.start_soon(second.read)
                    first.proc.send_signal(signal.SIGSTOP)
                    await producer.send_many("q", [f"m{i}".encode() for i in range(10, 20)])
                    # the first one's session expires; the second reads from position 0
                    await second.until(20)
                    await wait_position(session, "q", "s", 20)
                first.proc.send_signal(signal.SIGCONT)
                status = await trio.to_thread.run_sync(first.proc.wait, abandon_on_cancel=True)
                assert first.proc.stderr is not None
                err = first.proc.stderr.read().decode().strip().splitlines()
                print("zombie:", err)
                assert status == 2 and len(err) == 1 and err[0].startswith("broker ctl: error:")
                assert first.lines == [f"{i}\tm{i}" for i in range(10)]  # nothing after resume
                assert second.lines == [f"{i}\tm{i}" for i in range(20)]
                assert await position(session, "q", "s") == 20  # not moved back to 10
                nursery.cancel_scope.cancel()
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
            proc.wait()
