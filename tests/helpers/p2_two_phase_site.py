"""Test helper: one two-phase-commit site in its own process.

Usage: p2_two_phase_site.py HOSTS CHROOT PATH TXID SITE MODE
MODE "commit" / "abort" votes so; MODE "hang" joins (its alive node is the readiness signal)
and never votes, until it is killed.  Prints the outcome on stdout.
"""

from __future__ import annotations

import sys

import trio

from framework import Session
from framework.primitives.two_phase import TwoPhaseSite


async def main(hosts: str, chroot: str, path: str, txid: str, site: str, mode: str) -> None:
    async with Session(hosts, chroot=chroot, session_timeout=2.0) as session:

        async def vote(payload: bytes) -> bool:
            if mode == "hang":
                await trio.sleep_forever()
            return mode == "commit"

        outcome = await TwoPhaseSite(session, path, site).participate(txid, vote)
        print(outcome.value, flush=True)


if __name__ == "__main__":
    trio.run(main, *sys.argv[1:7])
