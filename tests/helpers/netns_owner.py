"""Test helper: own something from inside a network namespace, with a busy body.

Usage: netns_owner.py HOSTS CHROOT KIND SESSION_TIMEOUT   (KIND: election | master | claim)
Prints ``START <ns>`` when its body starts and ``END <ns>`` the moment the body ends (ns:
CLOCK_MONOTONIC nanoseconds, one clock for every namespace of the machine).  The body keeps
sending reads, the case kazoo alone never notices when the network is cut.
"""

from __future__ import annotations

import sys
import time

import trio

from framework import Election, Session, WorkQueue
from framework.runtime import Master, MasterContext


def stamp(what: str) -> None:
    print(f"{what} {time.clock_gettime_ns(time.CLOCK_MONOTONIC)}", flush=True)


async def body(session: Session) -> None:
    stamp("START")
    try:
        async def reader() -> None:
            while True:
                try:
                    await session.exists("/")
                except Exception:
                    pass
                await trio.sleep(0.2)

        async with trio.open_nursery() as nursery:
            for _ in range(4):
                nursery.start_soon(reader)
    finally:
        stamp("END")


async def main(hosts: str, chroot: str, kind: str, timeout: str) -> None:
    async with Session(hosts, chroot=chroot, session_timeout=float(timeout)) as session:
        try:
            if kind == "election":
                async with Election(session, "/election").leadership():
                    await body(session)
            elif kind == "claim":
                async with WorkQueue(session, "/queue").take():
                    await body(session)
            else:
                class Leader(Master):
                    async def lead(self, ctx: MasterContext) -> None:
                        await body(session)

                await Leader("netns", name="inside").run(session)
        except Exception as exc:
            print(f"LOST {type(exc).__name__}", flush=True)
        await trio.sleep_forever()


if __name__ == "__main__":
    trio.run(main, *sys.argv[1:5])
