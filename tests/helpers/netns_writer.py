"""Test helper: a leader that keeps writing, inside a network namespace.

Usage: ``netns_writer.py HOSTS CHROOT SESSION_TIMEOUT``

Leads ``/election`` and, while leading, creates sequential records ``/w/r-`` one after the
other through the term's fenced commit (50 ms apart), printing ``WROTE <czxid> <session id>``
once each is confirmed (the zxid's high 32 bits are the ZooKeeper leader's epoch).  Prints
``RETRY`` after a write whose reply was lost (the connection dropped: the write may or may
not have been applied; a sequential create is simply made again), ``END`` if the term's body
ends and ``LOST <error>`` if leadership is lost.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
os.environ.setdefault("FRAMEWORK_LOG_LEVEL", "error")

import trio

from framework import (
    ConnectionLossError,
    Election,
    LeadershipLost,
    Session,
    SessionInterrupted,
)


async def main(hosts: str, chroot: str, timeout: str) -> None:
    async with Session(hosts, chroot=chroot, session_timeout=float(timeout)) as session:
        await session.ensure_path("/w")
        try:
            async with Election(session, "/election").leadership() as term:
                try:
                    while True:
                        try:
                            [path] = await term.commit(
                                lambda txn: txn.create("/w/r-", sequence=True)
                            )
                        except ConnectionLossError:
                            print("RETRY", flush=True)
                            continue
                        stat = await session.exists(path)
                        assert stat is not None
                        print("WROTE", stat.czxid, session.session_id, flush=True)
                        await trio.sleep(0.05)  # pacing of the load, not a wait
                finally:
                    print("END", flush=True)
        except (LeadershipLost, SessionInterrupted) as exc:
            print("LOST", type(exc).__name__, flush=True)
        await trio.sleep_forever()


if __name__ == "__main__":
    trio.run(main, *sys.argv[1:4])
