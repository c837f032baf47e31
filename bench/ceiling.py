"""The bare-protocol ceiling: the requests one task costs ours, made by the framework's own
trio session with no framework above it (issue #37's ``ceiling`` row).

Run as a process by :mod:`bench.runtime` (``python -m bench.ceiling HOSTS BASE INDEX PROCS
SLOTS``): it lists ``BASE/items``, takes every ``PROCS``-th item from ``INDEX`` (no
contention between the processes), prints ``READY``, waits for a line on stdin, then drains
its items with ``SLOTS`` tasks in flight, each task: get the item, one claim multi (claim
node, item version bump, running marker), one ack multi (result record, delete claim, item
at its version, marker).  It prints ``DRAINED <first> <last> <cpu seconds>`` (wall-clock
times of the start and of its last task, and the process's CPU over the drain).

Nothing here is the runtime's: no view, no idle line, no lease, no records; it is what the
protocol alone costs this client and server, the bound the runtime is measured against.
"""

from __future__ import annotations

import sys
import time

import trio

from framework import Session


async def _slot(session: Session, base: str, names: list[str]) -> None:
    while names:
        name = names.pop()
        item = f"{base}/items/{name}"
        data, stat = await session.get(item)
        claim = session.transaction()
        claim.create(f"{base}/claims/{name}", b"w", ephemeral=True)
        claim.set(item, data, version=stat.version)
        claim.create(f"{base}/running/{name}", b"token", ephemeral=True)
        await claim.commit()
        ack = session.transaction()
        ack.create(f"{base}/results/{name}", b"1")
        ack.delete(f"{base}/claims/{name}")
        ack.delete(item, version=stat.version + 1)
        ack.delete(f"{base}/running/{name}")
        await ack.commit()


async def drain(hosts: str, base: str, index: int, procs: int, slots: int) -> None:
    async with Session(hosts) as session:
        names = sorted(await session.children(f"{base}/items"))[index::procs]
        names.reverse()  # popped from the end: oldest first
        print("READY", flush=True)
        await trio.to_thread.run_sync(sys.stdin.readline)
        first, cpu = time.time(), time.process_time()
        async with trio.open_nursery() as nursery:
            for _ in range(slots):
                nursery.start_soon(_slot, session, base, names)
        print(f"DRAINED {first:.6f} {time.time():.6f} {time.process_time() - cpu:.6f}",
              flush=True)


if __name__ == "__main__":
    hosts_, base_, index_, procs_, slots_ = sys.argv[1:6]
    trio.run(drain, hosts_, base_, int(index_), int(procs_), int(slots_))
