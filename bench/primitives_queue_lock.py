"""Work queue, locks and double barrier: ours vs kazoo's recipes, in the same run.

Run: ``.venv/bin/python bench/primitives_queue_lock.py`` (starts its own standalone ZooKeeper
unless FRAMEWORK_ZK_HOSTS is set).  ``bench/primitives.py`` calls :func:`run`.

* Queue: 1 producer and 4 consumers (each its own session/client), end to end: from the first
  put until the last item is consumed.  Producer puts one item per request, or batched
  (ours ``put_many``, kazoo ``LockingQueue.put_all``; both one multi-op per batch).  kazoo's
  ``Queue.get`` never blocks: its consumers must poll (a 5 ms sleep when empty).  Ours and
  ``LockingQueue`` claim items and delete them after processing; kazoo's ``Queue`` deletes on
  get (at-most-once).
* Lock: acquire/release cycles per second, 1 and 8 clients contending for one lock.
* Double barrier: 20 clients x 50 barriers (enter + leave each), clients spread over 4
  processes (5 each) or all in one process; the paper's Table 3 style.  Reported as
  barriers/s (one barrier = all 20 clients entered and left); the note gives client
  operations/s (enter + leave = 2 per client per barrier).  kazoo's recipe counts its
  ``ready`` node as a participant and deletes it at the start of leave, so across processes
  it can hang (a member that has not yet seen "ready" never will): each run is bounded by a
  timeout and reports how far every process got.

kazoo's recipes block, so they run in threads (or subprocesses), never on the trio thread.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
import uuid
from contextlib import AsyncExitStack
from pathlib import Path

import trio
from kazoo.client import KazooClient
from kazoo.recipe.barrier import DoubleBarrier as KazooDoubleBarrier
from kazoo.recipe.lock import Lock as KazooLock
from kazoo.recipe.queue import LockingQueue, Queue

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("FRAMEWORK_LOG_LEVEL", "error")
sys.path.insert(0, str(ROOT))

from bench.common import Result, print_results, sized, zookeeper  # noqa: E402
from framework import Session, configure_logging  # noqa: E402
from framework.primitives.double_barrier import DoubleBarrier  # noqa: E402
from framework.primitives.lock import Lock  # noqa: E402
from framework.primitives.queue import WorkQueue  # noqa: E402
from framework.testing import Child, python_argv, spawn  # noqa: E402
from framework.zk import wait_exists  # noqa: E402

QUEUE_ITEMS = sized(600, 40)  # --quick: the smaller sizes (see bench.common.quick)
QUEUE_CONSUMERS = 4
LOCK_SECONDS = sized(2.0, 0.3)
BARRIER_CLIENTS = sized(20, 4)
BARRIER_ROUNDS = sized(50, 3)
BARRIER_PROCESSES = sized(4, 2)
BARRIER_TIMEOUT = 15.0
SESSION_TIMEOUT = 10.0


def _kazoo(hosts: str, chroot: str) -> KazooClient:
    client = KazooClient(hosts=f"{hosts}{chroot}", timeout=SESSION_TIMEOUT)
    client.start(timeout=15)
    return client


def _chroot(name: str) -> str:
    return f"/bench-{name}-{uuid.uuid4().hex[:8]}"


async def _prepare(hosts: str, chroot: str) -> None:
    async with Session(hosts) as s:
        await s.ensure_path(chroot)


# ================================================================== queue


async def ours_queue(hosts: str, batched: bool) -> float:
    """Items per second end to end."""
    chroot = _chroot("queue")
    payloads = [b"item-%06d" % i for i in range(QUEUE_ITEMS)]
    consumed = 0
    done = trio.Event()
    async with AsyncExitStack() as stack:
        sessions = [
            await stack.enter_async_context(Session(hosts, chroot=chroot))
            for _ in range(QUEUE_CONSUMERS + 1)
        ]

        async def consume(s: Session) -> None:
            nonlocal consumed
            q = WorkQueue(s, "/q")
            while True:
                async with q.take():
                    pass
                consumed += 1
                if consumed == QUEUE_ITEMS:
                    done.set()

        async with trio.open_nursery() as nursery:
            for s in sessions[1:]:
                nursery.start_soon(consume, s)
            producer = WorkQueue(sessions[0], "/q")
            await producer.put_many([])  # creates the queue's nodes
            start = time.perf_counter()
            if batched:
                for i in range(0, QUEUE_ITEMS, 100):
                    await producer.put_many(payloads[i:i + 100])
            else:
                for data in payloads:
                    await producer.put(data)
            await done.wait()
            elapsed = time.perf_counter() - start
            nursery.cancel_scope.cancel()
        await sessions[0].delete_tree("/q")
    return QUEUE_ITEMS / elapsed


class _KazooTally:
    """Counts the items kazoo's consumer threads took; the first is the warm-up."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.consumed = 0
        self.warm = threading.Event()
        self.done = threading.Event()

    def count(self) -> None:
        with self.lock:
            if not self.warm.is_set():
                self.warm.set()  # the warm-up item: consumers are running
                return
            self.consumed += 1
            if self.consumed == QUEUE_ITEMS:
                self.done.set()


def _kazoo_consume_plain(client: KazooClient, tally: _KazooTally) -> None:
    q = Queue(client, "/q")
    while not tally.done.is_set():
        if q.get() is None:
            time.sleep(0.005)  # kazoo's Queue cannot wait for an item: poll
        else:
            tally.count()


def _kazoo_consume_locking(client: KazooClient, tally: _KazooTally) -> None:
    q = LockingQueue(client, "/q")
    while not tally.done.is_set():
        if q.get(timeout=0.5) is not None:
            q.consume()
            tally.count()


def _kazoo_put(producer: Queue | LockingQueue, payloads: list[bytes], batched: bool) -> None:
    if batched:
        for i in range(0, len(payloads), 100):
            producer.put_all(payloads[i:i + 100])
    else:
        for data in payloads:
            producer.put(data)


def kazoo_queue(hosts: str, kind: str, batched: bool) -> float:
    """Items per second end to end, kazoo's ``Queue`` or ``LockingQueue`` in threads."""
    chroot = _chroot("kqueue")
    setup = KazooClient(hosts=hosts)
    setup.start()
    setup.ensure_path(chroot)
    setup.stop()
    setup.close()
    payloads = [b"item-%06d" % i for i in range(QUEUE_ITEMS)]
    clients = [_kazoo(hosts, chroot) for _ in range(QUEUE_CONSUMERS + 1)]
    tally = _KazooTally()
    target = _kazoo_consume_plain if kind == "Queue" else _kazoo_consume_locking
    threads = [threading.Thread(target=target, args=(c, tally), daemon=True)
               for c in clients[1:]]
    producer = (Queue if kind == "Queue" else LockingQueue)(clients[0], "/q")
    producer.put(b"warm-up")
    for t in threads:
        t.start()
    tally.warm.wait(30)
    start = time.perf_counter()
    _kazoo_put(producer, payloads, batched)
    finished = tally.done.wait(60)
    elapsed = time.perf_counter() - start
    for t in threads:
        t.join(5)
    for c in clients:
        c.stop()
        c.close()
    return QUEUE_ITEMS / elapsed if finished else 0.0


# ================================================================== lock


async def ours_lock(hosts: str, clients: int) -> float:
    """Lock cycles per second (all clients together) over LOCK_SECONDS."""
    chroot = _chroot("lock")
    cycles = 0
    async with AsyncExitStack() as stack:
        sessions = [
            await stack.enter_async_context(Session(hosts, chroot=chroot))
            for _ in range(clients)
        ]
        await sessions[0].ensure_path("/lock")

        async def cycle(s: Session) -> None:
            nonlocal cycles
            lock = Lock(s, "/lock")
            while True:
                async with lock.acquire():
                    pass
                cycles += 1

        start = time.perf_counter()
        with trio.move_on_after(LOCK_SECONDS):
            async with trio.open_nursery() as nursery:
                for s in sessions:
                    nursery.start_soon(cycle, s)
        elapsed = time.perf_counter() - start
    return cycles / elapsed


def kazoo_lock(hosts: str, clients: int) -> float:
    chroot = _chroot("klock")
    setup = KazooClient(hosts=hosts)
    setup.start()
    setup.ensure_path(chroot + "/lock")
    setup.stop()
    setup.close()
    kazoo_clients = [_kazoo(hosts, chroot) for _ in range(clients)]
    stop = threading.Event()
    counts = [0] * clients

    def cycle(i: int) -> None:
        lock = KazooLock(kazoo_clients[i], "/lock")
        while not stop.is_set():
            with lock:
                pass
            counts[i] += 1

    threads = [threading.Thread(target=cycle, args=(i,), daemon=True) for i in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    time.sleep(LOCK_SECONDS)  # the measurement window (not a synchronisation)
    stop.set()
    for t in threads:
        t.join(10)
    elapsed = time.perf_counter() - start
    for c in kazoo_clients:
        c.stop()
        c.close()
    return sum(counts) / elapsed


# ================================================================== double barrier


class _Progress:
    """Barriers completed by every client of this process, printed whenever it grows."""

    def __init__(self, clients: int) -> None:
        self.done = [0] * clients
        self.reported = 0
        self.lock = threading.Lock()

    def advance(self, client: int, rounds: int) -> None:
        with self.lock:
            self.done[client] = rounds
            if min(self.done) > self.reported:
                self.reported = min(self.done)
                print(f"progress {self.reported}", flush=True)


async def _ours_barrier_clients(hosts: str, chroot: str, clients: int, tag: str,
                                progress: _Progress) -> None:
    async with AsyncExitStack() as stack:
        sessions = [
            await stack.enter_async_context(Session(hosts, chroot=chroot))
            for _ in range(clients)
        ]
        await sessions[0].create(f"/ready/{tag}", makepath=True)
        await wait_exists(sessions[0], "/go")

        async def client(i: int, s: Session) -> None:
            for r in range(BARRIER_ROUNDS):
                async with DoubleBarrier(s, f"/db/b{r}", BARRIER_CLIENTS, f"{tag}.{i}").enter():
                    pass
                progress.advance(i, r + 1)

        async with trio.open_nursery() as nursery:
            for i, s in enumerate(sessions):
                nursery.start_soon(client, i, s)


def _kazoo_barrier_clients(hosts: str, chroot: str, clients: int, tag: str,
                           progress: _Progress) -> None:
    kazoo_clients = [_kazoo(hosts, chroot) for _ in range(clients)]
    kazoo_clients[0].ensure_path("/ready")
    kazoo_clients[0].create(f"/ready/{tag}")
    go = threading.Event()
    if kazoo_clients[0].exists("/go", watch=lambda event: go.set()):
        go.set()
    go.wait()

    def client(i: int) -> None:
        for r in range(BARRIER_ROUNDS):
            barrier = KazooDoubleBarrier(kazoo_clients[i], f"/db/b{r}", BARRIER_CLIENTS)
            barrier.enter()
            barrier.leave()
            progress.advance(i, r + 1)

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()  # a hung kazoo barrier never returns: the parent kills this process
    for c in kazoo_clients:
        c.stop()
        c.close()


def worker_main(impl: str, hosts: str, chroot: str, clients: int, tag: str) -> None:
    """A barrier worker process: prints progress lines and ``done <unix time>``."""
    configure_logging(level="error")
    progress = _Progress(clients)
    if impl == "ours":
        trio.run(_ours_barrier_clients, hosts, chroot, clients, tag, progress)
    else:
        _kazoo_barrier_clients(hosts, chroot, clients, tag, progress)
    print(f"done {time.time():.6f}", flush=True)


async def _wait_ready(s: Session, count: int) -> None:
    await s.ensure_path("/ready")
    while True:
        fired = trio.Event()
        if len(await s.children("/ready", watch=s.waker(fired))) >= count:
            return
        await fired.wait()


async def barrier_run(hosts: str, impl: str, processes: int) -> tuple[float | None, str]:
    """Barriers per second with the clients spread over ``processes`` worker processes."""
    chroot = _chroot(f"db-{impl}")
    await _prepare(hosts, chroot)
    per_process = BARRIER_CLIENTS // processes
    finished = False

    async def drain(proc: Child) -> None:
        assert proc.lines is not None
        await proc.lines.rest()  # kept in proc.lines.seen

    async with AsyncExitStack() as stack:
        procs = [await stack.enter_async_context(spawn(
            python_argv(__file__, "--barrier-worker", impl, hosts, chroot, per_process, f"w{p}"),
            name=f"barrier-{impl}-w{p}", pipe_stdout=True, cwd=ROOT)) for p in range(processes)]
        async with Session(hosts, chroot=chroot) as s, trio.open_nursery() as nursery:
            for proc in procs:
                nursery.start_soon(drain, proc)
            with trio.fail_after(60):
                await _wait_ready(s, processes)
            start = time.time()
            await s.create("/go")
            with trio.move_on_after(BARRIER_TIMEOUT):
                for proc in procs:
                    await proc.wait()
                finished = True
            for proc in procs:
                proc.kill()
    done_times, reached = [], []
    for proc in procs:
        lines = proc.lines.seen if proc.lines is not None else []
        done_times += [float(line.split()[1]) for line in lines if line.startswith("done ")]
        progress = [int(line.split()[1]) for line in lines if line.startswith("progress ")]
        reached.append(progress[-1] if progress else 0)
    if finished and len(done_times) == processes:
        elapsed = max(done_times) - start
        rate = BARRIER_ROUNDS / elapsed
        ops = BARRIER_CLIENTS * BARRIER_ROUNDS * 2 / elapsed
        return rate, f"{ops:,.0f} client ops/s"
    return None, (f"hung: {min(reached)}/{BARRIER_ROUNDS} barriers done by every process "
                  f"after {BARRIER_TIMEOUT:g} s")


# ================================================================== all


async def run(hosts: str) -> list[Result]:
    """Every workload, ours and kazoo's; kazoo's run in worker threads."""
    results: list[Result] = []
    for batched in (False, True):
        label = "batched x100" if batched else "one put per item"
        ours = await ours_queue(hosts, batched)
        if not batched:
            plain = await trio.to_thread.run_sync(kazoo_queue, hosts, "Queue", False)
            results.append(Result(f"queue 1P/4C, {label}", "items/s", plain, ours,
                                  note="vs kazoo Queue (consumers poll; at-most-once)"))
        locking = await trio.to_thread.run_sync(kazoo_queue, hosts, "LockingQueue", batched)
        results.append(Result(f"queue 1P/4C, {label}", "items/s", locking, ours,
                              note="vs kazoo LockingQueue (claim + consume)"))
    for clients in (1, 8):
        ours = await ours_lock(hosts, clients)
        theirs = await trio.to_thread.run_sync(kazoo_lock, hosts, clients)
        results.append(Result(f"lock, {clients} client{'s' if clients > 1 else ''}",
                              "cycles/s", theirs, ours))
    for processes in (1, BARRIER_PROCESSES):
        ours, ours_note = await barrier_run(hosts, "ours", processes)
        theirs, theirs_note = await barrier_run(hosts, "kazoo", processes)
        results.append(Result(
            f"double barrier {BARRIER_CLIENTS}x{BARRIER_ROUNDS}, {processes} process"
            f"{'es' if processes > 1 else ''}",
            "barriers/s", theirs, ours, note=f"ours: {ours_note}; kazoo: {theirs_note}",
        ))
    return results


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--barrier-worker", nargs=5, metavar=("IMPL", "HOSTS", "CHROOT",
                                                              "CLIENTS", "TAG"))
    args = parser.parse_args()
    if args.barrier_worker:
        impl, hosts, chroot, clients, tag = args.barrier_worker
        worker_main(impl, hosts, chroot, int(clients), tag)
        return
    configure_logging(level="error")
    started = time.perf_counter()
    with zookeeper() as hosts:
        results = trio.run(run, hosts)
    print_results("queue, locks, double barrier: ours vs kazoo recipes", results)
    print(f"total {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
