"""Hold leadership in a separate process until killed (for kill -9 tests and benchmarks).

Usage: ``python p1_election_holder.py HOSTS CHROOT PATH IDENTIFIER [--impl ours|kazoo]
[--timeout SECONDS] [--records PATH]``.

Prints ``LEADING <token>`` on stdout once it leads, then holds leadership forever.  With
``--records`` (ours only), first writes ``{records}/start-<token>`` through a fenced
transaction, as server-side evidence of when this term began.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
os.environ.setdefault("FRAMEWORK_LOG_LEVEL", "warning")


async def hold_ours(args: argparse.Namespace) -> None:
    import trio

    from framework import Session
    from framework.primitives.election import Election

    async with Session(args.hosts, chroot=args.chroot, session_timeout=args.timeout) as session:
        election = Election(session, args.path, args.identifier.encode())
        async with election.leadership() as term:
            if args.records:
                record = f"{args.records}/start-{term.token:020d}"
                await term.commit(lambda txn: txn.create(record, args.identifier.encode()))
            print(f"LEADING {term.token}", flush=True)
            await trio.sleep_forever()


def hold_kazoo(args: argparse.Namespace) -> None:
    from kazoo.client import KazooClient
    from kazoo.recipe.election import Election

    client = KazooClient(hosts=args.hosts, timeout=args.timeout)
    client.start()
    election = Election(client, f"{args.chroot}{args.path}", args.identifier)

    def lead() -> None:
        print("LEADING 0", flush=True)
        threading.Event().wait()

    election.run(lead)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("hosts")
    parser.add_argument("chroot")
    parser.add_argument("path")
    parser.add_argument("identifier")
    parser.add_argument("--impl", choices=("ours", "kazoo"), default="ours")
    parser.add_argument("--timeout", type=float, default=2.0)
    parser.add_argument("--records", default=None)
    args = parser.parse_args()
    if args.impl == "kazoo":
        hold_kazoo(args)
    else:
        import trio

        trio.run(hold_ours, args)


if __name__ == "__main__":
    main()
