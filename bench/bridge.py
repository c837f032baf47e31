"""The session against plain kazoo: the same get/create workloads through ``Session`` (the
trio-native protocol driver, :mod:`framework.zk.connection`) and through ``KazooClient``.

Run: ``.venv/bin/python bench/bridge.py`` (starts its own ZooKeeper unless FRAMEWORK_ZK_HOSTS;
``--quick``: a smoke run at toy sizes).
Sequential latency (one request at a time) and throughput with 200 requests in flight
(200 trio tasks for the session; a 200-deep window of ``*_async`` calls for kazoo).
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import trio
from kazoo.client import KazooClient

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import Result, median, print_results, sized, zookeeper
from framework import Session, configure_logging

SEQUENTIAL_OPS = sized(500, 20)  # --quick: the smaller sizes (see bench.common.quick)
CONCURRENT_OPS = sized(6000, 400)
CONCURRENCY = 200
ROUNDS = sized(3, 1)


# ------------------------------------------------------------------ plain kazoo


def kazoo_sequential(client: KazooClient, op: str, n: int) -> float:
    """Mean µs per request, one blocking request at a time."""
    start = time.perf_counter()
    for _ in range(n):
        if op == "get":
            client.get("/bench/node")
        else:
            client.create("/bench/seq/n-", b"x", sequence=True)
    return (time.perf_counter() - start) / n * 1e6


def kazoo_window(client: KazooClient, op: str, n: int, depth: int) -> float:
    """Requests per second with ``depth`` requests kept in flight."""
    slots = threading.Semaphore(depth)

    def release(_result: object) -> None:
        slots.release()

    start = time.perf_counter()
    for _ in range(n):
        slots.acquire()
        if op == "get":
            result = client.get_async("/bench/node")
        else:
            result = client.create_async("/bench/con/n-", b"x", sequence=True)
        result.rawlink(release)
    for _ in range(depth):
        slots.acquire()
    return n / (time.perf_counter() - start)


# ------------------------------------------------------------------ the session


async def ours_sequential(session: Session, op: str, n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        if op == "get":
            await session.get("/bench/node")
        else:
            await session.create("/bench/seq/n-", b"x", sequence=True)
    return (time.perf_counter() - start) / n * 1e6


async def ours_concurrent(session: Session, op: str, n: int, tasks: int) -> float:
    per_task = n // tasks

    async def worker() -> None:
        for _ in range(per_task):
            if op == "get":
                await session.get("/bench/node")
            else:
                await session.create("/bench/con/n-", b"x", sequence=True)

    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(tasks):
            nursery.start_soon(worker)
    return per_task * tasks / (time.perf_counter() - start)


async def measure(hosts: str) -> list[Result]:
    client = KazooClient(hosts=hosts)
    await trio.to_thread.run_sync(client.start)
    client.ensure_path("/bench/seq")
    client.ensure_path("/bench/con")
    client.create("/bench/node", b"v" * 100)
    results = []
    try:
        async with Session(hosts) as session:
            for op in ("get", "create"):
                k_lat, o_lat, k_tp, o_tp = [], [], [], []
                for _ in range(ROUNDS):
                    k_lat.append(await trio.to_thread.run_sync(
                        kazoo_sequential, client, op, SEQUENTIAL_OPS))
                    o_lat.append(await ours_sequential(session, op, SEQUENTIAL_OPS))
                    k_tp.append(await trio.to_thread.run_sync(
                        kazoo_window, client, op, CONCURRENT_OPS, CONCURRENCY))
                    o_tp.append(await ours_concurrent(session, op, CONCURRENT_OPS, CONCURRENCY))
                results.append(Result(f"{op}: sequential latency", "µs/op", median(k_lat),
                                      median(o_lat), higher_is_better=False,
                                      note="kazoo: blocking call"))
                results.append(Result(f"{op}: {CONCURRENCY} in flight", "ops/s", median(k_tp),
                                      median(o_tp),
                                      note=f"kazoo: *_async, {CONCURRENCY}-deep window"))
    finally:
        await trio.to_thread.run_sync(client.delete, "/bench", -1, True)
        await trio.to_thread.run_sync(client.stop)
        client.close()
    return results


def main() -> None:
    configure_logging(level="warning")
    with zookeeper() as hosts:
        results = trio.run(measure, hosts)
    print_results(f"Session vs plain kazoo (median of {ROUNDS} rounds)", results)


if __name__ == "__main__":
    main()
