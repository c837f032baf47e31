"""Tree caches: ours (one persistent recursive watch) vs kazoo's ``TreeCache`` (a data and
a child watch on every node) and vs the bare protocol, in one run on one server.

Run: ``.venv/bin/python bench/primitives_cache.py`` (starts its own standalone ZooKeeper
unless FRAMEWORK_ZK_HOSTS is set).  ``bench/primitives.py`` calls :func:`run`.

A tree of NODES nodes (DIRS directories of equal size under one root):

* time to a consistent view: from opening the cache to its initial view complete.  The
  bare row reads the same nodes with no cache: ``get`` and ``children`` of every node,
  pipelined on a :class:`Session` (the reads a cache cannot avoid);
* watches held on the server for that session (4lw ``wchc``: the paths watched);
* churn: CHANGES data writes spread over the leaves, then a marker node; events per
  second applied = CHANGES / (time from the first write until the cache holds the marker).
  The bare row is the writer alone (the rate at which the changes exist at all).

kazoo's cache runs in its own threads; its listener sets a ``threading.Event``.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import uuid
from pathlib import Path

import trio
from kazoo.client import KazooClient
from kazoo.recipe.cache import TreeCache as KazooTreeCache
from kazoo.recipe.cache import TreeEvent

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("FRAMEWORK_LOG_LEVEL", "error")
sys.path.insert(0, str(ROOT))

from bench.common import Result, print_results, sized, zookeeper  # noqa: E402
from framework import Session, configure_logging  # noqa: E402
from framework.primitives import TreeCache  # noqa: E402
from framework.zkserver import watched_paths  # noqa: E402

NODES = sized(10_000, 300)
DIRS = sized(100, 10)
CHANGES = sized(2_000, 100)
IN_FLIGHT = 256


async def _pipelined(session: Session, jobs: list, limit: int = IN_FLIGHT) -> None:
    """Run the coroutine factories in ``jobs`` with at most ``limit`` at once."""
    gate = trio.CapacityLimiter(limit)

    async def one(job) -> None:  # type: ignore[no-untyped-def]
        async with gate:
            await job()

    async with trio.open_nursery() as nursery:
        for job in jobs:
            nursery.start_soon(one, job)


def _leaves(root: str) -> list[str]:
    per_dir = NODES // DIRS - 1
    return [f"{root}/d{d}/n{i}" for d in range(DIRS) for i in range(per_dir)]


async def _build(session: Session, root: str) -> None:
    await session.ensure_path(root)
    await _pipelined(session, [lambda d=d: session.create(f"{root}/d{d}", b"dir")
                               for d in range(DIRS)])
    await _pipelined(session, [lambda p=p: session.create(p, b"0") for p in _leaves(root)])


async def _churn(writer: Session, root: str, marker: str) -> float:
    """CHANGES writes over the leaves, then the marker; the time it took the writer."""
    leaves = _leaves(root)
    started = time.monotonic()
    await _pipelined(writer, [lambda i=i: writer.set(leaves[i * 7919 % len(leaves)], b"%d" % i)
                              for i in range(CHANGES)])
    await writer.create(marker, b"")
    return time.monotonic() - started


async def _ours(hosts: str, root: str) -> tuple[float, int, float]:
    async with Session(hosts) as reader, Session(hosts) as writer:
        started = time.monotonic()
        async with TreeCache(reader, root).running() as view:
            await view.ready.wait()
            loaded = time.monotonic() - started
            assert len(view.nodes) == 1 + DIRS + len(_leaves(root)), len(view.nodes)
            watches = watched_paths(hosts, reader.session_id or 0)
            marker = f"{root}/d0/done-ours"
            async with view.events() as events:
                started = time.monotonic()
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(_churn, writer, root, marker)
                    while view.get(marker) is None:
                        await events.receive()
                applied = CHANGES / (time.monotonic() - started)
        return loaded, watches, applied


def _kazoo(hosts: str, root: str) -> tuple[float, int, float]:
    client = KazooClient(hosts=hosts)
    client.start()
    initialized, marked = threading.Event(), threading.Event()
    marker = f"{root}/d0/done-kazoo"

    def listen(event: TreeEvent) -> None:
        if event.event_type == TreeEvent.INITIALIZED:
            initialized.set()
        elif event.event_type == TreeEvent.NODE_ADDED and event.event_data.path == marker:
            marked.set()

    try:
        cache = KazooTreeCache(client, root)
        cache.listen(listen)
        started = time.monotonic()
        cache.start()
        initialized.wait(600)
        loaded = time.monotonic() - started
        watches = watched_paths(hosts, client.client_id[0])

        async def churn() -> float:
            async with Session(hosts) as writer:
                return await _churn(writer, root, marker)

        started = time.monotonic()
        trio.run(churn)
        marked.wait(600)
        applied = CHANGES / (time.monotonic() - started)
        cache.close()
        return loaded, watches, applied
    finally:
        client.stop()
        client.close()


async def _bare(hosts: str, root: str) -> tuple[float, float]:
    """The reads of a load with no cache, and the writer's own rate."""
    async with Session(hosts) as session:
        started = time.monotonic()
        paths = [root] + [f"{root}/d{d}" for d in range(DIRS)] + _leaves(root)
        jobs = [job for p in paths
                for job in (lambda p=p: session.get(p), lambda p=p: session.children(p))]
        await _pipelined(session, jobs)
        loaded = time.monotonic() - started
        rate = CHANGES / await _churn(session, root, f"{root}/d0/done-bare")
        return loaded, rate


async def run(hosts: str) -> list[Result]:
    root = f"/bench-cache-{uuid.uuid4().hex[:8]}"
    async with Session(hosts) as session:
        await _build(session, root)
    ours_load, ours_watches, ours_rate = await _ours(hosts, root)
    kazoo_load, kazoo_watches, kazoo_rate = await trio.to_thread.run_sync(_kazoo, hosts, root)
    bare_load, bare_rate = await _bare(hosts, root)
    note = f"{NODES:,} nodes"
    return [
        Result("tree cache: time to a consistent view", "s", kazoo_load, ours_load,
               higher_is_better=False,
               note=f"{note}; bare reads {bare_load:.2f} s (ours {ours_load / bare_load:.2f}x)"),
        Result("tree cache: watches held on the server", "paths", kazoo_watches,
               ours_watches, higher_is_better=False, note="4lw wchc, one session"),
        Result("tree cache: changes applied under churn", "events/s", kazoo_rate, ours_rate,
               note=f"{CHANGES:,} writes; the writer alone {bare_rate:,.0f}/s "
                    f"(ours {ours_rate / bare_rate:.2f}x)"),
    ]


def main() -> None:
    configure_logging(level="error")
    with zookeeper() as hosts:
        print_results("tree cache: ours vs kazoo's TreeCache and the bare protocol",
                      trio.run(run, hosts))


if __name__ == "__main__":
    main()
