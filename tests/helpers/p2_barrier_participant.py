"""Test helper: one double-barrier participant in its own process.

Usage: p2_barrier_participant.py HOSTS CHROOT BARRIER_PATH COUNT NAME MODE
Inside the barrier it creates /entered/NAME (its readiness signal), then with MODE "hold"
waits for /release to exist and leaves (creating /left/NAME afterwards); with MODE "hang" it
stays inside until it is killed.
"""

from __future__ import annotations

import sys

import trio

from framework import Session
from framework.primitives.double_barrier import DoubleBarrier
from framework.zk import wait_exists


async def main(hosts: str, chroot: str, path: str, count: str, name: str, mode: str) -> None:
    async with Session(hosts, chroot=chroot, session_timeout=2.0) as session:
        async with DoubleBarrier(session, path, int(count), name).enter():
            await session.create(f"/entered/{name}", makepath=True)
            if mode == "hang":
                await trio.sleep_forever()
            await wait_exists(session, "/release")
        await session.create(f"/left/{name}", makepath=True)


if __name__ == "__main__":
    trio.run(main, *sys.argv[1:7])
