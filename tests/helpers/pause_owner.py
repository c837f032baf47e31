"""Own something in ZooKeeper and run a body of steps, for the process-pause tests.

Usage: ``python pause_owner.py HOSTS CHROOT MODE [--timeout SECONDS] [--unchecked]
[--marker PATH]`` with
MODE one of
``lock``, ``leader``, ``claim`` (takes the one item of ``/q``) or ``shard`` (a push-mode
``Worker`` named ``w`` of app ``pause`` serving what is assigned to it).

Prints, one line each, unbuffered: ``READY`` once the body runs, then what :func:`steps`
says, ``<t>`` being ``time.monotonic()`` (the parent's clock too), and ``ENDED <error type>
<reason>`` once the scope has ended.  The test SIGSTOPs this process and counts the steps
that started after its SIGCONT.  ``STOPPED <t>`` is printed when the body stops (its scope
cancelled).  With ``--marker``, the session first creates ``PATH`` as an ephemeral node, whose
deletion tells another client that the session expired.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
os.environ.setdefault("FRAMEWORK_LOG_LEVEL", "warning")

import trio

from framework import Session, Worker
from framework.errors import OwnershipLost, SessionInterrupted
from framework.primitives import Election, Lock, WorkQueue

#: Seconds a checked step waits: long against one scheduler pass, so a pause almost always
#: lands while the body waits.  An unchecked step waits far less (a busy body).
STEP = 0.05
BUSY_STEP = 0.0002
CHECKED = True


def emit(line: str) -> None:
    os.write(1, (line + "\n").encode())


async def steps(ensure_trusted: Callable[[], None]) -> None:
    """Checked: each step waits, then checks trust before its effect (``START``, ``EFFECT``
    lines).  Unchecked: a busy loop with no check, whose step start times are printed when
    the body ends (``STARTS t ...``, the last 5,000), with a ``START`` line every 50 ms."""
    emit("READY")
    try:
        await _steps(ensure_trusted)
    finally:
        emit(f"STOPPED {time.monotonic()!r}")


async def _steps(ensure_trusted: Callable[[], None]) -> None:
    if CHECKED:
        while True:
            await trio.sleep(STEP)
            emit(f"START {time.monotonic()!r}")
            ensure_trusted()
            emit(f"EFFECT {time.monotonic()!r}")
    starts: deque[float] = deque(maxlen=5000)
    told = 0.0
    try:
        while True:
            await trio.sleep(BUSY_STEP)
            now = time.monotonic()
            starts.append(now)
            if now - told > 0.05:
                emit(f"START {now!r}")
                told = now
    finally:
        emit("STARTS " + " ".join(repr(t) for t in starts))


class ShardOwner(Worker):
    async def serve_shard(self, shard: str, spec: bytes) -> None:
        session = self.session
        assert session is not None
        serving_in = session.session_id
        try:
            await steps(lambda: session.ensure_trusted(serving_in))
        finally:
            emit("ENDED ShardReleased -")  # the worker keeps running: it rejoins later


async def own(args: argparse.Namespace) -> None:
    async with Session(args.hosts, chroot=args.chroot, session_timeout=args.timeout) as session:
        if args.marker:
            await session.create(args.marker, b"", ephemeral=True, makepath=True)
        try:
            if args.mode == "lock":
                async with Lock(session, "/lock").acquire() as holding:
                    await steps(lambda: session.ensure_trusted(holding.session_id))
            elif args.mode == "leader":
                async with Election(session, "/election", b"paused").leadership() as term:
                    await steps(term.ensure_trusted)
            elif args.mode == "claim":
                async with WorkQueue(session, "/q").take():
                    await steps(session.ensure_trusted)
            else:
                await ShardOwner("pause", name="w").run(session)
        except (OwnershipLost, SessionInterrupted) as exc:
            emit(f"ENDED {type(exc).__name__} {exc.reason}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("hosts")
    parser.add_argument("chroot")
    parser.add_argument("mode", choices=("lock", "leader", "claim", "shard"))
    parser.add_argument("--timeout", type=float, default=2.0)
    parser.add_argument("--unchecked", action="store_true")
    parser.add_argument("--marker", default=None)
    args = parser.parse_args()
    global CHECKED
    CHECKED = not args.unchecked
    trio.run(own, args)


if __name__ == "__main__":
    main()
