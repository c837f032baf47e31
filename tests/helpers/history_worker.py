"""Test helper: a worker process that records its history (framework.testing.history).

Usage: history_worker.py HOSTS CHROOT HISTORY_DIR NAME
Takes items from the queue ``/q`` (recording claim, then ack or ack_lost) and, beside that,
contends for the lock ``/lock`` (recording acquire and release around each body), until
killed.  Prints "ready" once both loops run.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import trio

from framework import ClaimLost, Lock, LockLost, Session, SessionInterrupted, WorkQueue
from framework.errors import ZooKeeperError
from framework.testing.history import Recorder


async def consume(session: Session, history: Recorder) -> None:
    queue = WorkQueue(session, "/q")
    while True:
        key = ""
        try:
            async with queue.take() as item:
                key = item.data.decode()
                history.record("claim", key)
                await trio.sleep(random.uniform(0, 0.01))
            history.record("ack", key)
        except ClaimLost:
            history.record("ack_lost", key)
        except (ZooKeeperError, SessionInterrupted):
            await session.wait_connected()


async def contend(session: Session, history: Recorder) -> None:
    lock = Lock(session, "/lock")
    while True:
        try:
            async with lock.acquire():
                history.record("acquire", "/lock")
                try:
                    await trio.sleep(random.uniform(0, 0.02))
                finally:
                    history.record("release", "/lock")
        except (LockLost, ZooKeeperError, SessionInterrupted):
            await session.wait_connected()
        await trio.sleep(random.uniform(0, 0.01))


async def main(hosts: str, chroot: str, directory: str, name: str) -> None:
    history = Recorder(Path(directory), name)
    async with Session(hosts, chroot=chroot, session_timeout=2.0) as session:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(consume, session, history)
            nursery.start_soon(contend, session, history)
            print("ready", flush=True)


if __name__ == "__main__":
    trio.run(main, *sys.argv[1:5])
