"""Use one of the newer recipes from a process of its own, for the kill -9 and SIGSTOP tests.

Usage: ``python recipe_holder.py HOSTS CHROOT MODE [ARG] [--timeout SECONDS]`` with MODE

* ``counter N``: add 1 to ``/counter`` N times from 4 tasks at once (``ADDED`` after each,
  ``DONE`` at the end; ``/alive/<pid>`` is its session's ephemeral node);
* ``semaphore MAX``: hold a lease of ``/sem`` (MAX leases) and run steps;
* ``multilock A,B``: hold the locks at ``/A`` and ``/B`` and run steps;
* ``register NAME``: register an instance of service NAME (address ``127.0.0.1``, port
  the process id) and wait.

Prints, one line each, unbuffered: ``READY`` once it holds (or is registered), then, every
50 ms, ``START <t>``, a trust check, ``EFFECT <t>`` (``t`` is ``time.monotonic()``), and
``ENDED <error type> <reason>`` when the holding ends.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
os.environ.setdefault("FRAMEWORK_LOG_LEVEL", "warning")

import trio

from framework import Session
from framework.errors import OwnershipLost, SessionInterrupted
from framework.primitives import (
    Counter,
    MultiLock,
    Semaphore,
    ServiceDiscovery,
    ServiceInstance,
)

STEP = 0.05


def emit(line: str) -> None:
    os.write(1, (line + "\n").encode())


async def steps(ensure_trusted: Callable[[], None]) -> None:
    emit("READY")
    while True:
        await trio.sleep(STEP)
        emit(f"START {time.monotonic()!r}")
        ensure_trusted()
        emit(f"EFFECT {time.monotonic()!r}")


async def count(session: Session, times: int) -> None:
    """``/alive/<pid>`` (ephemeral: its end shows the session's), then ``READY``, then an
    ``ADDED`` line after each acknowledged increment and ``DONE``."""
    await session.create(f"/alive/{os.getpid()}", ephemeral=True, makepath=True)
    emit("READY")

    async def adder() -> None:
        counter = Counter(session, "/counter")
        for _ in range(times):
            await counter.add(1)
            emit("ADDED")

    async with trio.open_nursery() as nursery:
        for _ in range(4):
            nursery.start_soon(adder)
    emit("DONE")


async def run(args: argparse.Namespace) -> None:
    async with Session(args.hosts, chroot=args.chroot, session_timeout=args.timeout) as session:
        try:
            if args.mode == "counter":
                await count(session, int(args.arg))
            elif args.mode == "semaphore":
                me = str(os.getpid()).encode()
                sem = Semaphore(session, "/sem", int(args.arg), identifier=me)
                async with sem.acquire() as lease:
                    await steps(lambda: session.ensure_trusted(lease.session_id))
            elif args.mode == "multilock":
                paths = ["/" + p for p in args.arg.split(",")]
                async with MultiLock(session, paths).acquire() as holding:
                    sid = holding.holdings[0].session_id
                    await steps(lambda: session.ensure_trusted(sid))
            else:
                instance = ServiceInstance(args.arg, "127.0.0.1", os.getpid())
                async with ServiceDiscovery(session).register(instance):
                    emit("READY")
                    await trio.sleep_forever()
        except (OwnershipLost, SessionInterrupted) as exc:
            emit(f"ENDED {type(exc).__name__} {exc.reason}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("hosts")
    parser.add_argument("chroot")
    parser.add_argument("mode", choices=("counter", "semaphore", "multilock", "register"))
    parser.add_argument("arg")
    parser.add_argument("--timeout", type=float, default=2.0)
    trio.run(run, parser.parse_args())


if __name__ == "__main__":
    main()
