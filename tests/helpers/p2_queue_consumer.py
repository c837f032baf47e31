"""Test helper: take one item from a WorkQueue and hold it until killed.

Usage: p2_queue_consumer.py HOSTS CHROOT QUEUE_PATH
Readiness is visible in ZooKeeper: the claim node of the item it holds.
"""

from __future__ import annotations

import sys

import trio

from framework import Session
from framework.primitives.queue import WorkQueue


async def main(hosts: str, chroot: str, path: str) -> None:
    async with Session(hosts, chroot=chroot, session_timeout=2.0) as session:
        async with WorkQueue(session, path).take() as item:
            print(item.name, flush=True)
            await trio.sleep_forever()


if __name__ == "__main__":
    trio.run(main, *sys.argv[1:4])
