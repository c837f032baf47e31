"""Semaphore and counter: ours vs kazoo's recipes and vs the bare protocol, in one run.

Run: ``.venv/bin/python bench/primitives_semaphore_counter.py`` (starts its own standalone
ZooKeeper unless FRAMEWORK_ZK_HOSTS is set).  ``bench/primitives.py`` calls :func:`run`.

* Counter: increments per second (all clients together) over WINDOW seconds, 1 and 8
  clients (each its own session / KazooClient) adding 1 to one counter.  kazoo's ``Counter``
  reads and writes with a version like ours, but retries a write whose reply was lost
  blindly (it may count it twice); ours writes a receipt to settle that case.  The bare row
  is the same protocol without the recipe: ``get`` once, then a conditional ``set`` of the
  value (reading again after ``BadVersion``) on a :class:`Session`, no receipts.
* Semaphore: acquire/release cycles per second, 2 leases, 1 and 8 clients.  kazoo's
  ``Semaphore`` takes a lock node and watches the lease children (every holder's release
  wakes every waiter); ours is sequential-ephemeral contenders (see the recipe).  The bare
  row, 1 client: the requests of an uncontended acquire and release without the recipe
  (protected create of an ephemeral sequential node, a list, a delete).

kazoo's recipes block, so they run in threads, never on the trio thread.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import uuid
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any, Awaitable, Callable

import trio
from kazoo.client import KazooClient

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("FRAMEWORK_LOG_LEVEL", "error")
sys.path.insert(0, str(ROOT))

from bench.common import Result, print_results, zookeeper  # noqa: E402
from framework import Session, configure_logging  # noqa: E402
from framework.errors import BadVersionError  # noqa: E402
from framework.primitives import Counter, Semaphore  # noqa: E402
from framework.zk import create_protected, new_guid  # noqa: E402

WINDOW = 2.0
LEASES = 2
SESSION_TIMEOUT = 10.0


def _chroot(name: str) -> str:
    return f"/bench-{name}-{uuid.uuid4().hex[:8]}"


async def _ours(hosts: str, clients: int, make: Callable[[Session], Callable[[], Awaitable[Any]]]
                ) -> float:
    """Operations per second: each client's session runs ``make(session)()`` in a loop."""
    chroot = _chroot("ours")
    done = 0
    async with AsyncExitStack() as stack:
        sessions = [await stack.enter_async_context(
            Session(hosts, chroot=chroot, session_timeout=SESSION_TIMEOUT))
            for _ in range(clients)]
        steps = [make(s) for s in sessions]
        await steps[0]()  # the recipe's nodes exist before the clock starts

        async def loop(step: Callable[[], Awaitable[Any]]) -> None:
            nonlocal done
            while True:
                await step()
                done += 1

        start = time.perf_counter()
        with trio.move_on_after(WINDOW):
            async with trio.open_nursery() as nursery:
                for step in steps:
                    nursery.start_soon(loop, step)
        elapsed = time.perf_counter() - start
    return done / elapsed


def _kazoo(hosts: str, clients: int, make: Callable[[KazooClient], Callable[[], Any]]) -> float:
    chroot = _chroot("kazoo")
    setup = KazooClient(hosts=hosts)
    setup.start(timeout=15)
    setup.ensure_path(chroot)
    setup.stop()
    setup.close()
    kazoo_clients = []
    for _ in range(clients):
        client = KazooClient(hosts=f"{hosts}{chroot}", timeout=SESSION_TIMEOUT)
        client.start(timeout=15)
        kazoo_clients.append(client)
    steps = [make(c) for c in kazoo_clients]
    steps[0]()
    stop = threading.Event()
    counts = [0] * clients

    def loop(i: int) -> None:
        while not stop.is_set():
            steps[i]()
            counts[i] += 1

    threads = [threading.Thread(target=loop, args=(i,), daemon=True) for i in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    time.sleep(WINDOW)  # the measurement window (not a synchronisation)
    stop.set()
    for t in threads:
        t.join(30)
    elapsed = time.perf_counter() - start
    for c in kazoo_clients:
        c.stop()
        c.close()
    return sum(counts) / elapsed


# ------------------------------------------------------------------ counter

def ours_counter(s: Session) -> Callable[[], Awaitable[Any]]:
    counter = Counter(s, "/counter")

    async def add() -> None:
        await counter.add(1)

    return add


def bare_counter(s: Session) -> Callable[[], Awaitable[Any]]:
    """Versioned read-modify-write on a Session, no receipts (what the recipe adds to)."""
    state: dict[str, Any] = {}

    async def add() -> None:
        while True:
            if not state:
                try:
                    data, stat = await s.get("/counter")
                except Exception:
                    try:
                        await s.create("/counter", b"0")
                    except Exception:
                        pass
                    continue
                state.update(value=int(data), version=stat.version)
            try:
                stat = await s.set("/counter", str(state["value"] + 1).encode(),
                                   version=state["version"])
            except BadVersionError:
                state.clear()
                continue
            state.update(value=state["value"] + 1, version=stat.version)
            return

    return add


def kazoo_counter(client: KazooClient) -> Callable[[], Any]:
    counter = client.Counter("/counter")

    def add() -> None:
        nonlocal counter
        counter += 1  # kazoo's Counter returns itself from __add__

    return add


# ------------------------------------------------------------------ semaphore

def ours_semaphore(s: Session) -> Callable[[], Awaitable[Any]]:
    sem = Semaphore(s, "/sem", LEASES)

    async def cycle() -> None:
        async with sem.acquire():
            pass

    return cycle


def bare_semaphore(s: Session) -> Callable[[], Awaitable[Any]]:
    async def cycle() -> None:
        node = await create_protected(s, "/sem", "lease-", b"", guid=new_guid())
        await s.children("/sem")
        await s.delete(node)

    return cycle


def kazoo_semaphore(client: KazooClient) -> Callable[[], Any]:
    sem = client.Semaphore("/sem", max_leases=LEASES)

    def cycle() -> None:
        with sem:
            pass

    return cycle


async def run(hosts: str) -> list[Result]:
    results: list[Result] = []
    await _ours(hosts, 8, bare_counter)  # warm the server's JIT: the first row ran slow
    for clients in (1, 8):
        label = f"{clients} client{'s' if clients > 1 else ''}"
        ours = await _ours(hosts, clients, ours_counter)
        theirs = await trio.to_thread.run_sync(_kazoo, hosts, clients, kazoo_counter)
        bare = await _ours(hosts, clients, bare_counter)
        results.append(Result(f"counter +1, {label}", "adds/s", theirs, ours,
                              note="vs kazoo Counter"))
        results.append(Result(f"counter +1, {label}", "adds/s", bare, ours,
                              note="vs the bare protocol (kazoo column: get + set(version))"))
    for clients in (1, 8):
        label = f"{clients} client{'s' if clients > 1 else ''}"
        ours = await _ours(hosts, clients, ours_semaphore)
        theirs = await trio.to_thread.run_sync(_kazoo, hosts, clients, kazoo_semaphore)
        results.append(Result(f"semaphore ({LEASES} leases), {label}", "cycles/s", theirs,
                              ours, note="vs kazoo Semaphore"))
        if clients == 1:
            bare = await _ours(hosts, clients, bare_semaphore)
            results.append(Result(
                f"semaphore ({LEASES} leases), {label}", "cycles/s", bare, ours,
                note="vs the bare protocol (kazoo column: create + list + delete)"))
    return results


def main() -> None:
    configure_logging(level="error")
    started = time.perf_counter()
    with zookeeper() as hosts:
        results = trio.run(run, hosts)
    print_results("semaphore and counter: ours vs kazoo recipes and the bare protocol", results)
    print(f"total {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
