"""Test helper: own something from inside a network namespace, with an idle or busy body.

Usage: ``netns_owner.py HOSTS CHROOT KIND LOAD ROLE SESSION_TIMEOUT``

* KIND: ``election`` | ``lock`` | ``claim`` | ``master`` and LOAD: ``idle`` | ``busy`` are
  those of ``tests/test_partition_ownership.py`` (its ``OWNERS`` and bodies are used as
  they are: a busy body keeps requests flowing, which kazoo alone never notices);
* ROLE names the records (``a`` | ``b``).

The body's first action creates ``/records/<ROLE>-start-`` (sequential) through this
process's own session, so the server orders its start.  It then prints ``START <ns>``, and
``END <ns>`` the moment the body ends (``CLOCK_MONOTONIC`` nanoseconds: one clock for every
namespace of the machine).  A process cut off from ZooKeeper cannot tell the server that its
body ended: the test records that for it, on reading ``END``.  An ownership lost is printed
as ``LOST <error>``; the process stays until it is killed.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
os.environ.setdefault("FRAMEWORK_LOG_LEVEL", "error")

import trio

from framework import Session
from tests.test_partition_ownership import LOSSES, OWNERS, busy, idle

LOADS = {"idle": idle, "busy": busy}


def say(word: str, value: object = "") -> None:
    print(f"{word} {value}".rstrip(), flush=True)


async def main(hosts: str, chroot: str, kind: str, load: str, role: str,
               timeout: str) -> None:
    async with Session(hosts, chroot=chroot, session_timeout=float(timeout)) as session:
        started = False

        async def body() -> None:
            nonlocal started
            if started:  # a later term in a new session (after a heal): not the case tested
                await trio.sleep_forever()
            started = True
            await session.create(f"/records/{role}-start-", sequence=True)
            say("START", time.clock_gettime_ns(time.CLOCK_MONOTONIC))
            try:
                await LOADS[load](session)
            finally:
                say("END", time.clock_gettime_ns(time.CLOCK_MONOTONIC))

        try:
            await OWNERS[kind](session, body)
        except LOSSES as exc:
            say("LOST", type(exc).__name__)
        await trio.sleep_forever()


if __name__ == "__main__":
    trio.run(main, *sys.argv[1:7])
