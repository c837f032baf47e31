"""Exclusive subscribers: one live instance per subscriber name, and position commits that
only its holder can make - a second instance waits or is refused, and a paused (SIGSTOP)
instance that resumes after its session expired never moves a position."""

from __future__ import annotations

import sys
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from pathlib import Path

import pytest
import trio
import trio.testing

from examples.message_broker.client import Message, Producer, Subscriber, SubscriberBusyError
from examples.message_broker.cluster import ROOT, LocalCluster
from examples.message_broker.ctl import create_topics
from examples.message_broker.layout import BrokerPaths, Position, decode
from framework import Session, errors
from framework.testing import Child, spawn
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


def _consume(zk_hosts: str, chroot: str, logs: Path, name: str,
             *extra: str) -> AbstractAsyncContextManager[Child]:
    """``ctl consume q --name s --follow`` as a child: stdout piped, stderr in its log."""
    argv = [sys.executable, "-m", "examples.message_broker.ctl", "--zk", zk_hosts,
            "--chroot", chroot, "consume", "q", "--name", "s", "--follow", "--offsets",
            "--session-timeout", "2", *extra]
    return spawn(argv, name=name, log_dir=logs, pipe_stdout=True, cwd=ROOT,
                 env={"PYTHONPATH": str(ROOT), "FRAMEWORK_LOG_LEVEL": "error"})


async def read_lines(child: Child, count: int) -> list[str]:
    """Read ``child``'s output until it has printed ``count`` lines in all; all of them."""
    assert child.lines is not None
    while len(child.lines.seen) < count:
        await child.lines.next()
    return child.lines.seen


async def test_paused_subscriber_process_resumes_as_a_zombie(
    session: Session, zk_hosts: str, chroot: str, tmp_path: Path
) -> None:
    """Two ``ctl consume --name s`` processes: the first is SIGSTOPped past its session, the
    second takes the name over and reads on; the first, resumed, prints nothing more, exits
    with one line, and its final commit (which would move the position back) is refused."""
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery, AsyncExitStack() as children:
            cluster = LocalCluster(zk_hosts, chroot, tmp_path, nursery)
            await cluster.start_with_topics(session, ["q"])
            async with Producer(session) as producer:
                await producer.send_many("q", [f"m{i}".encode() for i in range(10)])
                # the first never commits while it lives: 10 acks held in memory
                first = await children.enter_async_context(_consume(
                    zk_hosts, chroot, tmp_path, "first", "--commit-interval", "3600"))
                await read_lines(first, 10)
                second = await children.enter_async_context(_consume(
                    zk_hosts, chroot, tmp_path, "second", "--commit-interval", "0.1"))
                first.pause()
                await producer.send_many("q", [f"m{i}".encode() for i in range(10, 20)])
                # the first one's session expires; the second reads from position 0
                await read_lines(second, 20)
                await wait_position(session, "q", "s", 20)
            first.resume()
            assert first.lines is not None and second.lines is not None
            await first.lines.rest()  # its output ends when it exits
            status = await first.wait()
            err = first.log().strip().splitlines()
            print("zombie:", err)
            assert status == 2 and len(err) == 1 and err[0].startswith("broker ctl: error:")
            assert first.lines.seen == [f"{i}\tm{i}" for i in range(10)]  # nothing after resume
            assert await position(session, "q", "s") == 20  # not moved back to 10
            second.kill()  # then every line it printed is read
            await second.lines.rest()
            assert second.lines.seen == [f"{i}\tm{i}" for i in range(20)]
            nursery.cancel_scope.cancel()
