"""Runtime benchmark, with real processes.

Run: ``.venv/bin/python bench/runtime.py [--json] [--peers | --no-peers] [--quick]``
(``--help``).  ``--json``: the rows as a JSON list of objects with keys workload, unit, peer,
kazoo, ours, ratio, where ``peer`` names what the comparison column (the key ``kazoo``)
measured: ``kazoo``, ``dramatiq``, ``celery`` or ``rq``.

1. Tasks/s end to end: 1 master + 4 worker processes, trivial tasks (submit -> handled ->
   result recorded -> acknowledged), vs kazoo's ``LockingQueue`` drained by 4 consumer
   processes (put -> get -> consume; no result records, so it does less work per task).
2. The cost of one task, from the server's own counters (``mntr`` before and after the run):
   requests received and write transactions committed per task (a multi counts once), and
   the share of the server's write capacity (creates/s with 200 in flight) the run used.
3. Backlog independence: the rate at which 4 x 500 tasks are drained from a backlog of 3,000
   and from one of 100,000 (the rest stays queued), and ``submit_many`` of the 100,000.
4. The latency of one task on an idle system: submit -> its result record is visible (a
   watch on it; the record is written in the transaction that acknowledges the task), and
   until the master's ``wait_idle`` returns, medians of 50; kazoo: ``put`` -> the entry is
   consumed.
5. The ceiling: the requests a task costs ours (item get, claim multi with the running marker,
   ack multi with the result record), made by plain kazoo with no framework and no contention
   (4 processes, each its own quarter of the items, 4 tasks in flight each, callbacks only):
   the most kazoo and this server reach on this machine for that protocol.
   The floor: the round trips of one task (put; list after the watch fired, get, claim
   multi, ack multi) made one after the other by plain kazoo, put -> result record visible.
6. Master failover after kill -9 of the leader: until the standby's address is published,
   vs kazoo's ``Election`` (until the standby's function runs), same session timeout.
7. Peers (:mod:`bench.peers`): rows 1 (4 slots) and 4 against Dramatiq and Celery on
   redis-servers started for the run with persistence none, ``everysec`` and ``always``
   (``--persistence``), and RQ without, the same workload (TASKS trivial tasks, results
   stored, workers already running; idle latency submit -> result readable, median of 50);
   next to them the bare-protocol ceiling at the same processes and slots
   (:mod:`bench.ceiling`: the framework's session alone doing get, claim multi, ack multi
   per task) and CPU milliseconds per task from ``/proc`` (our workers, master and server;
   the ceiling's clients and server); runs interleaved (ours, the ceiling, then each peer,
   ``--runs`` times, default PEER_RUNS), medians of the runs.  The ZooKeeper server runs
   the full JIT (``--zk-jit full``, what a deployment runs; one warm-up run of ours and of
   the ceiling first, not counted); ``--zk-jit c1`` measures the tests' fast-start server.
   ``--json`` rows carry ``peer`` (``dramatiq``, ``celery``, ``rq``, ``ceiling``, ``cpu``)
   and ``persistence``.  Needs the ``bench`` extra and Debian's redis-server (``make
   bench`` installs both); skipped with a note without them.  ``--peers``: only these rows;
   ``--quick``: one run of 100 tasks and 3 latency rounds, Redis without persistence, C1
   (a smoke test).

Every process is started with :func:`framework.testing.spawn`; what a child writes to stderr
(and to stdout, unless the benchmark reads it) goes to ``out/bench-runtime/<name>.log``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from contextlib import AsyncExitStack, asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any, AsyncIterator, Iterator

import attrs
import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import peers  # noqa: E402
from bench.common import Result, print_results, sized  # noqa: E402
from framework import Session, configure_logging  # noqa: E402
from framework.primitives import Rendezvous  # noqa: E402
from framework.testing import Child, Lines, spawn  # noqa: E402
from framework.zk import watch_children  # noqa: E402
from framework.zkserver import ZooKeeperEnsemble, four_letter  # noqa: E402

TASKS = sized(2000, 100)  # --quick: the smaller sizes (see bench.common.quick)
WORKERS = 4
DRAIN_EACH = sized(500, 20)
SMALL_BACKLOG = sized(3_000, 120)  # more than 4 x 500: each worker stops after its 500
LARGE_BACKLOG = sized(100_000, 1_000)
KAZOO_LARGE_EACH = sized(25, 5)
LATENCY_ROUNDS = sized(50, 3)
SESSION_TIMEOUT = 2.0
FAILOVER_ROUNDS = sized(3, 1)
PEER_RUNS = 3
ENV = {"PYTHONPATH": str(ROOT), "FRAMEWORK_LOG_LEVEL": "warning"}
LOGS = ROOT / "out" / "bench-runtime"

KAZOO_CONSUMER = """
import sys, time
from kazoo.client import KazooClient
from kazoo.recipe.queue import LockingQueue
hosts, path = sys.argv[1], sys.argv[2]
c = KazooClient(hosts=hosts); c.start()
q = LockingQueue(c, path)
last = None
while True:
    item = q.get(timeout=1.0)
    if item is None:
        break
    q.consume(); last = time.time()
c.create(path + "-done/c-", str(last or 0).encode(), sequence=True, makepath=True)
c.stop()
"""

KAZOO_DRAINER = """
import sys, time
from kazoo.client import KazooClient
from kazoo.recipe.queue import LockingQueue
hosts, path, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
c = KazooClient(hosts=hosts, timeout=30.0); c.start()
q = LockingQueue(c, path)
first = None
for _ in range(count):
    item = q.get()
    first = first or time.time()
    q.consume()
print("DRAINED", first, time.time(), flush=True)
c.stop()
"""

CEILING_TASKS = sized(10_000, 200)

KAZOO_TASK_OPS = """
def claim_ops(c, base, name, data, version):
    t = c.transaction()
    t.create(base + "/claims/" + name, b"w", ephemeral=True)
    t.set_data(base + "/items/" + name, data, version=version)
    t.create(base + "/running/" + name, b"token", ephemeral=True)
    return t

def ack_ops(c, base, name):
    t = c.transaction()
    t.create(base + "/results/" + name, b"1")
    t.delete(base + "/claims/" + name)
    t.delete(base + "/items/" + name, version=1)
    t.delete(base + "/running/" + name)
    return t
"""

KAZOO_CEILING = KAZOO_TASK_OPS + """
import sys, threading, time
from kazoo.client import KazooClient
hosts, base, index, procs = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
c = KazooClient(hosts=hosts); c.start()
names = iter(sorted(c.get_children(base + "/items"))[index::procs])
lock = threading.Lock(); left = [0]; finished = threading.Event()

def start_next():
    with lock:
        name = next(names, None)
        if name is None:
            return
        left[0] += 1
    item = base + "/items/" + name

    def claim(got):
        data, stat = got.get()
        claim_ops(c, base, name, data, stat.version).commit_async().rawlink(ack)

    def ack(claimed):
        claimed.get()
        ack_ops(c, base, name).commit_async().rawlink(done)

    def done(acked):
        acked.get()
        with lock:
            left[0] -= 1
        start_next()
        with lock:
            if left[0] == 0:
                finished.set()

    c.get_async(item).rawlink(claim)

print("READY", flush=True)
sys.stdin.readline()
first = time.time()
for _ in range(4):
    start_next()
finished.wait()
print("DRAINED", first, time.time(), flush=True)
c.stop()
"""

KAZOO_FLOOR = KAZOO_TASK_OPS + """
import sys, threading
from kazoo.client import KazooClient
hosts, base = sys.argv[1], sys.argv[2]
c = KazooClient(hosts=hosts); c.start()
fired = threading.Event()
print("READY", flush=True)
while True:
    fired.clear()
    names = c.get_children(base + "/items", watch=lambda _event: fired.set())
    for name in names:
        item = base + "/items/" + name
        data, stat = c.get(item)
        claim_ops(c, base, name, data, stat.version).commit()
        ack_ops(c, base, name).commit()
    fired.wait()
"""

KAZOO_LEADER = """
import sys, time
from kazoo.client import KazooClient
hosts, path, name = sys.argv[1], sys.argv[2], sys.argv[3]
c = KazooClient(hosts=hosts, timeout=float(sys.argv[4])); c.start()
def lead():
    c.create(path + "-leader", name.encode(), ephemeral=True)
    time.sleep(3600)
c.Election(path, name).run(lead)
"""


async def spawn_python(stack: AsyncExitStack, name: str, *args: str, read: bool = False,
                write: bool = False, **env: str) -> Child:
    """``python *args`` as child ``name`` (ENV and ``env`` added to the environment), killed
    when ``stack`` closes; ``read``/``write``: its stdout/stdin piped."""
    return await stack.enter_async_context(spawn(
        [sys.executable, *args], name=name, log_dir=LOGS, pipe_stdout=read, pipe_stdin=write,
        env=ENV | env))


async def framework_run(stack: AsyncExitStack, hosts: str, chroot: str, cls: str, name: str,
                        **env: str) -> Child:
    """``python -m framework run bench.runtime_app:<cls>`` as ``name``, its stdout read."""
    return await spawn_python(stack, name, "-m", "framework", "run",
                              f"bench.runtime_app:{cls}", "--zk", hosts, "--chroot", chroot,
                              "--name", name, "--session-timeout", str(SESSION_TIMEOUT),
                              read=True, **env)


def lines(child: Child) -> Lines:
    assert child.lines is not None, f"{child.name}: its stdout is not read"
    return child.lines


async def output(child: Child) -> str:
    """Everything the child writes to stdout, once it has exited."""
    text = "\n".join(await lines(child).rest())
    await child.wait()
    return text


async def wait_count(session: Session, path: str, count: int) -> None:
    await session.ensure_path(path)
    async for snap in watch_children(session, path):
        if len(snap.children) >= count:
            return


def server_stats(hosts: str) -> dict[str, str]:
    """The ``mntr`` counters of the first server of ``hosts``."""
    host, port = hosts.split(",")[0].rsplit(":", 1)
    return dict(line.split("\t", 1) for line in four_letter(int(port), "mntr", host=host)
                .splitlines() if "\t" in line)


def server_counters(hosts: str) -> tuple[int, int]:
    """(requests received, write transactions committed) so far, from the server's ``mntr``
    (``zk_packets_received``, ``zk_cnt_updatelatency``); the first server of ``hosts``."""
    stats = server_stats(hosts)
    return int(stats["zk_packets_received"]), int(stats["zk_cnt_updatelatency"])


def server_traffic(hosts: str) -> tuple[int, int]:
    """(requests received, bytes received) so far (``mntr``, the first server of ``hosts``)."""
    stats = server_stats(hosts)
    return int(stats["zk_packets_received"]), int(stats["zk_bytes_received_count"])


@attrs.frozen
class Run:
    """One throughput run: tasks/s, and requests and write transactions per task; CPU
    milliseconds per task (``/proc``) of the workers (all of them), the master and the
    ZooKeeper server, where known."""

    rate: float
    requests: float
    writes: float
    worker_cpu: float | None = None
    master_cpu: float | None = None
    server_cpu: float | None = None


#: The ZooKeeper server's pid, when this run started it (its CPU is read from ``/proc``).
SERVER_PID: int | None = None


def cpu_ms_per_task(before: float | None, after: float | None, tasks: int) -> float | None:
    """Milliseconds of CPU per task between two :func:`cpu_seconds` readings."""
    if before is None or after is None:
        return None
    return 1000 * (after - before) / tasks


def workers_cpu(procs: list[Child]) -> float | None:
    """The CPU seconds the processes used so far, summed (``None`` if one is unknown)."""
    readings = [cpu_seconds(proc.pid) for proc in procs]
    return None if None in readings else sum(r for r in readings if r is not None)


def cost(hosts: str, before: tuple[int, int], tasks: int) -> tuple[float, float]:
    after = server_counters(hosts)
    return (after[0] - before[0]) / tasks, (after[1] - before[1]) / tasks


async def start_workers(stack: AsyncExitStack, hosts: str, chroot: str,
                        concurrency: int) -> list[Child]:
    procs = [await framework_run(stack, hosts, chroot, "BenchWorker", f"w{i}",
                                 BENCH_CONCURRENCY=str(concurrency)) for i in range(WORKERS)]
    async with Session(hosts, chroot=chroot) as s:
        await wait_count(s, "/apps/bench/workers", WORKERS)
    return procs


async def ours_throughput(hosts: str, concurrency: int, tasks: int = TASKS) -> Run:
    chroot = f"/bench-rt-{time.time_ns()}"
    async with AsyncExitStack() as stack:
        workers = await start_workers(stack, hosts, chroot, concurrency)
        before = server_counters(hosts)
        cpu_before = workers_cpu(workers), cpu_seconds(SERVER_PID)
        master = await framework_run(stack, hosts, chroot, "BenchMaster", "m",
                                     BENCH_TASKS=str(tasks))
        text = await output(master)
        cpu_after = workers_cpu(workers), cpu_seconds(SERVER_PID)
        elapsed, _, master_cpu = text.split("ELAPSED")[1].split()[:3]
        return Run(tasks / float(elapsed), *cost(hosts, before, tasks),
                   worker_cpu=cpu_ms_per_task(cpu_before[0], cpu_after[0], tasks),
                   master_cpu=1000 * float(master_cpu) / tasks,
                   server_cpu=cpu_ms_per_task(cpu_before[1], cpu_after[1], tasks))


async def drained_rate(procs: list[Child], each: int = 0) -> float:
    """Tasks/s over the processes' ``DRAINED <first> <last>`` lines (each drained ``each``
    tasks, default DRAIN_EACH): from the first task of any to the last task of all."""
    spans = []
    for proc in procs:
        _, first, last = (await lines(proc).next()).split()
        spans.append((float(first), float(last)))
    return len(procs) * (each or DRAIN_EACH) / (max(b for _, b in spans) - min(a for a, _ in spans))


async def ours_backlog(hosts: str, backlog: int) -> tuple[float, float]:
    """(submit_many tasks/s, drain tasks/s) for DRAIN_EACH tasks per worker (4 slots each)
    taken from a queue of ``backlog`` tasks submitted before any worker started."""
    chroot = f"/bench-bl-{time.time_ns()}"
    async with AsyncExitStack() as stack:
        master = await framework_run(stack, hosts, chroot, "BenchMaster", "m",
                                     BENCH_TASKS=str(backlog), BENCH_MODE="backlog")
        submitted = backlog / float((await lines(master).next()).split()[1])
        workers = [await framework_run(stack, hosts, chroot, "BenchWorker", f"w{i}",
                                       BENCH_CONCURRENCY="4", BENCH_STOP_AFTER=str(DRAIN_EACH))
                   for i in range(WORKERS)]
        return submitted, await drained_rate(workers)


async def kazoo_backlog(hosts: str, backlog: int, each: int) -> tuple[float, float]:
    """The same with kazoo's LockingQueue: ``put_all`` in batches of 1,000 (one multi each),
    then 4 consumer processes each draining ``each`` (fewer than ours from a large backlog:
    every get lists the whole queue, so the rate is known well before 500)."""
    async with kazoo_queue(hosts, "kbl", timeout=30.0) as (_client, queue, path):
        start = time.perf_counter()
        for offset in range(0, backlog, 1000):
            batch = [json.dumps({"n": i}).encode()
                     for i in range(offset, min(offset + 1000, backlog))]
            await trio.to_thread.run_sync(queue.put_all, batch)
        submitted = backlog / (time.perf_counter() - start)
        async with AsyncExitStack() as stack:
            procs = [await spawn_python(stack, f"kazoo-drainer-{i}", "-c", KAZOO_DRAINER, hosts,
                                        path, str(each), read=True) for i in range(WORKERS)]
            return submitted, await drained_rate(procs, each)


@attrs.frozen
class Submitted:
    """One submission of a backlog: tasks/s, and requests and bytes the server received per
    task (everything the submitter sent, its start included); ``server_cpu``: CPU seconds
    the server used meanwhile (when the benchmark started it)."""

    rate: float
    requests: float
    bytes: float
    server_cpu: float | None = None


def cpu_seconds(pid: int | None) -> float | None:
    """User and system CPU seconds of process ``pid`` so far (``None``: gone, or no /proc)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, TypeError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextmanager
def fresh_server() -> Iterator[tuple[str, int | None]]:
    """(hosts, the server's pid): ``FRAMEWORK_ZK_HOSTS`` (pid unknown) or a fresh standalone
    server."""
    hosts = os.environ.get("FRAMEWORK_ZK_HOSTS")
    if hosts:
        yield hosts, None
        return
    with ZooKeeperEnsemble(1) as server:
        yield server.connect_string, server.members[0].process.pid


def with_server_cpu(run: Submitted, pid: int | None, before: float | None) -> Submitted:
    after = cpu_seconds(pid)
    used = None if after is None or before is None else after - before
    return attrs.evolve(run, server_cpu=used)


async def ours_submit(hosts: str, backlog: int) -> Submitted:
    """``submit_many`` of ``backlog`` tasks (5,000 a call) by the bench master, no worker."""
    chroot = f"/bench-sm-{time.time_ns()}"
    async with AsyncExitStack() as stack:
        before = server_traffic(hosts)
        master = await framework_run(stack, hosts, chroot, "BenchMaster", "m",
                                     BENCH_TASKS=str(backlog), BENCH_MODE="backlog")
        seconds = float((await lines(master).next()).split()[1])
        after = server_traffic(hosts)
    return Submitted(backlog / seconds, (after[0] - before[0]) / backlog,
                     (after[1] - before[1]) / backlog)


async def kazoo_submit(hosts: str, backlog: int) -> Submitted:
    """kazoo's ``LockingQueue.put_all`` of ``backlog`` items, 1,000 a call (one multi each),
    as in :func:`kazoo_backlog`."""
    async with kazoo_queue(hosts, "ksm", timeout=30.0) as (_client, queue, _path):
        before = server_traffic(hosts)
        start = time.perf_counter()
        for offset in range(0, backlog, 1000):
            batch = [json.dumps({"n": i}).encode()
                     for i in range(offset, min(offset + 1000, backlog))]
            await trio.to_thread.run_sync(queue.put_all, batch)
        rate = backlog / (time.perf_counter() - start)
        after = server_traffic(hosts)
    return Submitted(rate, (after[0] - before[0]) / backlog, (after[1] - before[1]) / backlog)


def measure_submit(runs: int) -> None:
    """``--submit-many RUNS``: ours and kazoo's submission of LARGE_BACKLOG tasks, alternated
    RUNS times (kazoo first in odd runs, ours first in even ones), each on a fresh server
    (a standalone one's 256 MB heap holds about three such backlogs, and a fuller heap is
    slower); each run and the ranges."""
    got: dict[str, list[Submitted]] = {"kazoo": [], "ours": []}
    for n in range(runs):
        order = (("kazoo", kazoo_submit), ("ours", ours_submit))
        for who, run in order if n % 2 == 0 else order[::-1]:
            with fresh_server() as (hosts, pid):
                before = cpu_seconds(pid)
                last = with_server_cpu(trio.run(run, hosts, LARGE_BACKLOG), pid, before)
            got[who].append(last)
            cpu = "" if last.server_cpu is None else f"; server {last.server_cpu:.2f} CPU s"
            print(f"run {n + 1} {who:5}: {last.rate:9,.0f} tasks/s  {last.requests:.4f} "
                  f"requests and {last.bytes:6.1f} bytes a task{cpu}", flush=True)
    ratios = sorted(o.rate / k.rate for o, k in zip(got["ours"], got["kazoo"], strict=True))
    for who, runs_of in got.items():
        rates = sorted(r.rate for r in runs_of)
        print(f"{who:5}: {rates[0]:,.0f}-{rates[-1]:,.0f} tasks/s "
              f"(median {statistics.median(rates):,.0f})")
    print(f"ours/kazoo, run by run: {ratios[0]:.2f}-{ratios[-1]:.2f} "
          f"(median {statistics.median(ratios):.2f})")


@asynccontextmanager
async def kazoo_client(hosts: str, timeout: float = 10.0) -> AsyncIterator[Any]:
    """A started kazoo client (session ``timeout``, kazoo's default 10 s), stopped and
    closed on exit."""
    from kazoo.client import KazooClient

    client = KazooClient(hosts=hosts, timeout=timeout)
    await trio.to_thread.run_sync(client.start)
    try:
        yield client
    finally:
        client.stop()
        client.close()


@asynccontextmanager
async def kazoo_queue(hosts: str, prefix: str, timeout: float = 10.0
                      ) -> AsyncIterator[tuple[Any, Any, str]]:
    """(client, kazoo's ``LockingQueue``, its path): a fresh ``/<prefix>-<ns>``."""
    from kazoo.recipe.queue import LockingQueue

    path = f"/{prefix}-{time.time_ns()}"
    async with kazoo_client(hosts, timeout) as client:
        yield client, LockingQueue(client, path), path


@asynccontextmanager
async def kazoo_task_layout(hosts: str, prefix: str) -> AsyncIterator[tuple[Any, str]]:
    """A started kazoo client and a fresh ``/<prefix>-<ns>`` with the folders of the
    task protocol (items, claims, running, results); the client is closed on exit."""
    base = f"/{prefix}-{time.time_ns()}"
    async with kazoo_client(hosts) as client:
        for folder in ("items", "claims", "running", "results"):
            await trio.to_thread.run_sync(client.ensure_path, f"{base}/{folder}")
        yield client, base


async def kazoo_ceiling(hosts: str) -> float:
    """Tasks/s of KAZOO_CEILING over CEILING_TASKS items (put beforehand, not timed)."""
    async with kazoo_task_layout(hosts, "kceil") as (client, base), AsyncExitStack() as stack:
        for offset in range(0, CEILING_TASKS, 500):
            put = client.transaction()
            for n in range(offset, min(offset + 500, CEILING_TASKS)):
                task = json.dumps({"id": f"t{n}", "key": f"k{n}"}).encode()
                put.create(f"{base}/items/i-", task, sequence=True)
            await trio.to_thread.run_sync(put.commit)
        procs = [await spawn_python(stack, f"kazoo-ceiling-{i}", "-c", KAZOO_CEILING, hosts,
                                    base, str(i), str(WORKERS), read=True, write=True)
                 for i in range(WORKERS)]
        for proc in procs:  # every process connected and listed before any starts
            await lines(proc).next()
        for proc in procs:
            assert proc.stdin is not None
            await proc.stdin.send_all(b"go\n")
        return await drained_rate(procs, CEILING_TASKS // WORKERS)


async def trio_ceiling(hosts: str, slots: int = 4, tasks: int = CEILING_TASKS) -> Run:
    """The bare-protocol ceiling (:mod:`bench.ceiling`): ``tasks`` items put beforehand (not
    timed), drained by WORKERS processes of the framework's bare session with ``slots``
    tasks in flight each; tasks/s, requests and writes per task, and the CPU per task of
    the clients (``worker_cpu``) and of the server."""
    async with kazoo_task_layout(hosts, "tceil") as (client, base), AsyncExitStack() as stack:
        for offset in range(0, tasks, 500):
            put = client.transaction()
            for n in range(offset, min(offset + 500, tasks)):
                task = json.dumps({"id": f"t{n}", "key": f"k{n}"}).encode()
                put.create(f"{base}/items/i-", task, sequence=True)
            await trio.to_thread.run_sync(put.commit)
        procs = [await spawn_python(stack, f"ceiling-{i}", "-m", "bench.ceiling", hosts, base,
                                    str(i), str(WORKERS), str(slots), read=True, write=True)
                 for i in range(WORKERS)]
        for proc in procs:  # every process connected and listed before any starts
            await lines(proc).next()
        before, server_before = server_counters(hosts), cpu_seconds(SERVER_PID)
        for proc in procs:
            assert proc.stdin is not None
            await proc.stdin.send_all(b"go\n")
        spans = [(await lines(proc).next()).split()[1:] for proc in procs]
        server_after = cpu_seconds(SERVER_PID)
        elapsed = max(float(b) for _, b, _ in spans) - min(float(a) for a, _, _ in spans)
        return Run(tasks / elapsed, *cost(hosts, before, tasks),
                   worker_cpu=1000 * sum(float(c) for _, _, c in spans) / tasks,
                   server_cpu=cpu_ms_per_task(server_before, server_after, tasks))


async def server_write_rate(hosts: str) -> float:
    """Creates/s the server commits from one client keeping 200 in flight (its write
    capacity on this machine, the physical limit a task's write transactions share)."""
    from bench.bridge import ours_concurrent

    async with Session(hosts) as session:
        await session.ensure_path("/bench/con")
        await ours_concurrent(session, "create", 1000, 200)  # warm-up
        return await ours_concurrent(session, "create", 4000, 200)


async def ours_latency(hosts: str, rounds: int = LATENCY_ROUNDS) -> tuple[float, float]:
    """Medians of (submit -> result visible, submit -> ``wait_idle`` returned)."""
    chroot = f"/bench-lat-{time.time_ns()}"
    async with AsyncExitStack() as stack:
        await start_workers(stack, hosts, chroot, 4)
        master = await framework_run(stack, hosts, chroot, "BenchMaster", "m",
                                     BENCH_TASKS=str(rounds), BENCH_MODE="latency")
        out = await output(master)
        rows = [line.split()[1:] for line in out.splitlines() if line.startswith("LATENCY")]
        return (statistics.median(float(visible) for visible, _ in rows),
                statistics.median(float(idle) for _, idle in rows))


async def kazoo_latency(hosts: str) -> float:
    async with kazoo_queue(hosts, "klat") as (_client, queue, path):
        await trio.to_thread.run_sync(queue.put, b"warm-up")
        samples = []
        async with AsyncExitStack() as stack, Session(hosts) as s:
            for i in range(WORKERS):
                await spawn_python(stack, f"kazoo-consumer-{i}", "-c", KAZOO_CONSUMER, hosts,
                                   path)
            for n in range(LATENCY_ROUNDS):
                async for snap in watch_children(s, f"{path}/entries"):
                    if not snap.children:
                        break
                start = time.perf_counter()
                await trio.to_thread.run_sync(queue.put, str(n).encode())
                async for snap in watch_children(s, f"{path}/entries"):
                    if not snap.children:
                        break
                samples.append(time.perf_counter() - start)
        return statistics.median(samples)


async def kazoo_floor_latency(hosts: str) -> float:
    """Median seconds from a put to its result record, KAZOO_FLOOR consuming: the round
    trips of our task path (list after the watch fired, get, claim multi, ack multi), one
    after the other by plain kazoo, no framework; the lowest latency this path can have."""
    from framework.zk import wait_exists

    async with kazoo_task_layout(hosts, "kfloor") as (_client, base), AsyncExitStack() as stack:
        floor = await spawn_python(stack, "kazoo-floor", "-c", KAZOO_FLOOR, hosts, base,
                                   read=True)
        await lines(floor).next()
        samples = []
        async with Session(hosts) as s:
            for n in range(LATENCY_ROUNDS + 1):  # the first one warms up
                start = time.perf_counter()
                name = await s.create(f"{base}/items/i-", json.dumps({"n": n}).encode(),
                                      sequence=True)
                await wait_exists(s, f"{base}/results/{name.rsplit('/', 1)[1]}")
                samples.append(time.perf_counter() - start)
        return statistics.median(samples[1:])


async def kazoo_throughput(hosts: str) -> Run:
    async with kazoo_queue(hosts, "kbench") as (client, queue, path):
        before = server_counters(hosts)
        start = time.time()
        for offset in range(0, TASKS, 500):
            batch = [json.dumps({"n": i}).encode() for i in range(offset, min(offset + 500, TASKS))]
            await trio.to_thread.run_sync(queue.put_all, batch)
        async with AsyncExitStack() as stack:
            procs = [await spawn_python(stack, f"kazoo-consumer-{i}", "-c", KAZOO_CONSUMER,
                                        hosts, path) for i in range(WORKERS)]
            for proc in procs:
                await proc.wait()
        done_dir = f"{path}-done"
        done = [float(client.get(f"{done_dir}/{n}")[0]) for n in client.get_children(done_dir)]
        return Run(TASKS / (max(done) - start), *cost(hosts, before, TASKS))


async def ours_failover(hosts: str) -> float:
    chroot = f"/bench-fo-{time.time_ns()}"
    async with AsyncExitStack() as stack, Session(hosts, chroot=chroot) as s:
        first = await framework_run(stack, hosts, chroot, "BenchMaster", "a")
        await wait_count(s, "/apps/bench/masters", 1)
        rendezvous = Rendezvous(s, "/apps/bench/rendezvous")
        async for data in rendezvous.watch():
            if data:
                break
        await framework_run(stack, hosts, chroot, "BenchMaster", "b")
        await wait_count(s, "/apps/bench/masters", 2)
        first.kill()
        killed = time.perf_counter()
        async for data in rendezvous.watch():
            if data and json.loads(data)["name"] == "b":
                return time.perf_counter() - killed
    raise AssertionError("unreachable")


async def kazoo_failover(hosts: str) -> float:
    from framework.zk import wait_exists

    path = f"/kfo-{time.time_ns()}"
    async with AsyncExitStack() as stack, Session(hosts) as s:
        first = await spawn_python(stack, "kazoo-leader-a", "-c", KAZOO_LEADER, hosts, path,
                                   "a", str(SESSION_TIMEOUT))
        await wait_exists(s, f"{path}-leader")
        await spawn_python(stack, "kazoo-leader-b", "-c", KAZOO_LEADER, hosts, path, "b",
                           str(SESSION_TIMEOUT))
        await wait_count(s, path, 2)
        first.kill()
        killed = time.perf_counter()
        async for snap in _watch_data(s, f"{path}-leader"):
            if snap == b"b":
                return time.perf_counter() - killed
    raise AssertionError("unreachable")


async def _watch_data(session: Session, path: str):  # type: ignore[no-untyped-def]
    from framework.zk import watch_data

    async for snap in watch_data(session, path):
        yield snap.data


async def measure(hosts: str) -> list[Result]:
    kazoo_tp = await kazoo_throughput(hosts)
    ours_1 = await ours_throughput(hosts, 1)
    ours_4 = await ours_throughput(hosts, 4)
    ceiling = await kazoo_ceiling(hosts)
    small = {"kazoo": await kazoo_backlog(hosts, SMALL_BACKLOG, DRAIN_EACH),
             "ours": await ours_backlog(hosts, SMALL_BACKLOG)}
    large = {"kazoo": await kazoo_backlog(hosts, LARGE_BACKLOG, KAZOO_LARGE_EACH),
             "ours": await ours_backlog(hosts, LARGE_BACKLOG)}
    latency = {"kazoo": await kazoo_latency(hosts), "ours": await ours_latency(hosts),
               "floor": await kazoo_floor_latency(hosts)}
    capacity = await server_write_rate(hosts)
    ours_fo = [await ours_failover(hosts) for _ in range(FAILOVER_ROUNDS)]
    kazoo_fo = [await kazoo_failover(hosts) for _ in range(FAILOVER_ROUNDS)]
    lq = "kazoo: LockingQueue, 4 consumer processes"
    drained = f"{WORKERS} x {DRAIN_EACH} tasks drained"
    return [
        Result(f"{TASKS} tasks, 1 master + {WORKERS} workers (1 slot each)", "tasks/s",
               kazoo_tp.rate, ours_1.rate, note=lq),
        Result(f"{TASKS} tasks, 1 master + {WORKERS} workers (4 slots each)", "tasks/s",
               kazoo_tp.rate, ours_4.rate, note=lq),
        Result("  the same requests per task with no framework (the ceiling)", "tasks/s",
               ceiling, ours_4.rate,
               note=f"plain kazoo: get, claim multi, ack multi per task; {WORKERS} processes x "
                    f"4 in flight, {CEILING_TASKS:,} tasks, no contention; ratio = ours/ceiling"),
        Result("  ZooKeeper requests per task (4 slots)", "requests", kazoo_tp.requests,
               ours_4.requests, higher_is_better=False,
               note="mntr zk_packets_received; ours records a result, kazoo does not"),
        Result("  write transactions per task (4 slots)", "txns", kazoo_tp.writes,
               ours_4.writes, higher_is_better=False, note="mntr zk_cnt_updatelatency"),
        Result("  share of the server's write capacity used (4 slots)", "%",
               100 * kazoo_tp.rate * kazoo_tp.writes / capacity,
               100 * ours_4.rate * ours_4.writes / capacity,
               note=f"tasks/s x txns per task / {capacity:,.0f} creates/s (200 in flight)"),
        Result(f"{drained} from a {SMALL_BACKLOG:,}-task backlog", "tasks/s",
               small["kazoo"][1], small["ours"][1], note=lq),
        Result(f"{drained} from a {LARGE_BACKLOG:,}-task backlog", "tasks/s",
               large["kazoo"][1], large["ours"][1],
               note=f"kazoo ({WORKERS} x {KAZOO_LARGE_EACH}): every get lists every entry"),
        Result(f"submit {LARGE_BACKLOG:,} tasks", "tasks/s", large["kazoo"][0],
               large["ours"][0], note="ours: submit_many, 5,000 a call; kazoo: put_all, 1,000"),
        Result("one task on an idle system: submit -> result visible", "ms",
               latency["kazoo"] * 1000, latency["ours"][0] * 1000, higher_is_better=False,
               note=f"median of {LATENCY_ROUNDS}; ours: a watch on the result record (written "
                    "with the ack); kazoo: put -> the entry is consumed"),
        Result("  the same round trips in a row with no framework (the floor)", "ms",
               latency["floor"] * 1000, latency["ours"][0] * 1000, higher_is_better=False,
               note="plain kazoo: put; list after the watch fired, get, claim multi, ack "
                    "multi; ratio = ours/floor"),
        Result("  same, until the master's wait_idle returns", "ms", latency["kazoo"] * 1000,
               latency["ours"][1] * 1000, higher_is_better=False,
               note="also proves the queue empty and nothing running"),
        Result("master failover after kill -9", "s", statistics.median(kazoo_fo),
               statistics.median(ours_fo), higher_is_better=False,
               note=f"session timeout {SESSION_TIMEOUT:g}s; median of {FAILOVER_ROUNDS}; "
                    "kazoo: Election"),
    ]


def _median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


async def measure_peers(hosts: str, runs: int, tasks: int, rounds: int,
                        persistence: tuple[str, ...] = peers.PERSISTENCE,
                        warm_up: bool = False) -> list[peers.PeerRow]:
    """Rows for each peer and Redis ``persistence``: tasks/s and idle latency, ours (4
    workers x 4 slots) next to the peer's; the bare-protocol ceiling at the same processes
    and slots; CPU per task of ours (workers, master, server) next to the ceiling's
    (client, server).  ``runs`` runs interleaved (ours, the ceiling, then each peer on
    each Redis in turn; RQ only without persistence), medians.  ``warm_up``: one run of
    ours and one of the ceiling first, not counted (a server with the full JIT compiles
    the paths each exercises during its first runs)."""
    ours: list[Run] = []
    latency: list[float] = []
    ceiling: list[Run] = []
    theirs: dict[tuple[str, str], list[peers.PeerRun]] = {
        (peer, p): [] for p in persistence for peer in peers.PEERS
        if peer != "rq" or p == "none"}
    async with AsyncExitStack() as stack:
        urls = {p: await stack.enter_async_context(peers.redis_server(LOGS, p))
                for p in persistence}
        if warm_up:
            await ours_throughput(hosts, 4, tasks)
            await trio_ceiling(hosts, 4, max(tasks, CEILING_TASKS))
        for _ in range(runs):
            ours.append(await ours_throughput(hosts, 4, tasks))
            latency.append((await ours_latency(hosts, rounds))[0])
            ceiling.append(await trio_ceiling(hosts, 4, max(tasks, CEILING_TASKS)))
            for peer, p in theirs:
                theirs[peer, p].append(await peers.run_peer(peer, urls[p], tasks, rounds, LOGS))
    how = f"median of {runs} interleaved run{'s' * (runs > 1)}"
    rate = statistics.median(r.rate for r in ours)
    rows = []
    for (peer, p), got in theirs.items():
        label = peers.SETUPS[peer].label
        rows += [
            peers.PeerRow(peer, p, Result(
                f"{tasks:,} tasks (ours: 4 workers x 4 slots)", "tasks/s",
                statistics.median(r.rate for r in got), rate,
                note=f"{label}; redis persistence {p}; {how}; ratio = ours/peer")),
            peers.PeerRow(peer, p, Result(
                "  one task on an idle system: submit -> result visible", "ms",
                1000 * statistics.median(r.latency for r in got),
                1000 * statistics.median(latency), higher_is_better=False,
                note=f"each run the median of {rounds}; redis persistence {p}; {how}")),
        ]
    bare = "bare trio session: get, claim multi, ack multi per task"
    rows += [
        peers.PeerRow("ceiling", None, Result(
            "the same requests per task with no framework (the ceiling)", "tasks/s",
            statistics.median(r.rate for r in ceiling), rate,
            note=f"{bare}; {WORKERS} processes x 4 in flight; {how}; ratio = ours/ceiling")),
        peers.PeerRow("cpu", None, Result(
            "  worker CPU per task (ceiling: its client's)", "ms",
            _median([r.worker_cpu for r in ceiling]), _median([r.worker_cpu for r in ours]),
            higher_is_better=False, note=f"/proc, all {WORKERS} processes; {how}")),
        peers.PeerRow("cpu", None, Result(
            "  ZooKeeper server CPU per task", "ms",
            _median([r.server_cpu for r in ceiling]), _median([r.server_cpu for r in ours]),
            higher_is_better=False, note=f"/proc of the server this bench started; {how}")),
        peers.PeerRow("cpu", None, Result(
            "  master CPU per task", "ms", None, _median([r.master_cpu for r in ours]),
            higher_is_better=False, note=f"submit_many 500 a call, then wait_idle; {how}")),
        peers.PeerRow("cpu", None, Result(
            "  ZooKeeper requests / write transactions per task", "requests",
            _median([r.requests for r in ceiling]), _median([r.requests for r in ours]),
            higher_is_better=False,
            note=f"mntr; writes: ceiling {_median([r.writes for r in ceiling]):.2f}, "
                 f"ours {_median([r.writes for r in ours]):.2f}")),
    ]
    return rows


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="The runtime benchmark: ours vs kazoo's recipes and vs Dramatiq, Celery "
                    "and RQ on Redis (real processes; see the module's docstring).")
    parser.add_argument("--json", action="store_true",
                        help="print the rows as JSON objects (workload, unit, peer, kazoo, "
                             "ours, ratio; peer names what the kazoo column measured)")
    only = parser.add_mutually_exclusive_group()
    only.add_argument("--peers", action="store_true",
                      help="only the rows against Dramatiq, Celery and RQ")
    only.add_argument("--no-peers", action="store_true",
                      help="skip the rows against Dramatiq, Celery and RQ")
    only.add_argument("--submit-many", type=int, metavar="RUNS", default=0,
                      help=f"only submit_many of {LARGE_BACKLOG:,} vs kazoo's put_all, "
                           "alternated RUNS times (each run and the ranges)")
    parser.add_argument("--runs", type=int, default=PEER_RUNS,
                        help=f"interleaved runs of the rows against the peers (default "
                             f"{PEER_RUNS})")
    parser.add_argument("--persistence", default=",".join(peers.PERSISTENCE),
                        help="the Redis persistence settings the peers run with, comma "
                             "separated (default: all of none, everysec, always)")
    parser.add_argument("--zk-jit", choices=("c1", "full"), default=None,
                        help="the ZooKeeper JVM's JIT (FRAMEWORK_ZK_JIT): full (C1 and C2, "
                             "what a deployment runs; the default, with a warm-up run of "
                             "ours and of the ceiling before the rows against the peers) "
                             "or c1 (the launcher's default for tests, a fast start; the "
                             "default with --quick)")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run: every size shrunk to seconds of work (peers: one "
                             "run of 100 tasks and 3 latency rounds)")
    return parser.parse_args()


async def measure_all(hosts: str, args: argparse.Namespace
                      ) -> tuple[list[Result], list[peers.PeerRow]]:
    ours = [] if args.peers else await measure(hosts)
    if args.no_peers:
        return ours, []
    persistence = tuple(p for p in args.persistence.split(",") if p)
    unknown = set(persistence) - set(peers.PERSISTENCE)
    if unknown:
        raise SystemExit(f"--persistence: unknown {', '.join(sorted(unknown))} (choose from "
                         f"{', '.join(peers.PERSISTENCE)})")
    if args.quick:
        return ours, await measure_peers(hosts, 1, TASKS, LATENCY_ROUNDS, ("none",))
    return ours, await measure_peers(hosts, args.runs, TASKS, LATENCY_ROUNDS, persistence,
                                     warm_up=args.zk_jit == "full")


def main() -> None:
    args = parse_args()
    if args.submit_many:
        configure_logging(level="warning")
        measure_submit(args.submit_many)
        return
    why_not = None if args.no_peers else peers.missing()
    if why_not and args.peers:
        raise SystemExit(f"--peers: {why_not}")
    if why_not:
        print(f"the rows against Dramatiq, Celery and RQ are skipped: {why_not}",
              file=sys.stderr)
        args.no_peers = True
    configure_logging(level="warning")
    for old in LOGS.glob("*.log"):  # the children's logs of this run only
        old.unlink()
    global SERVER_PID
    if args.zk_jit is None:  # a deployment's JIT, unless this is a smoke run
        args.zk_jit = "c1" if args.quick else "full"
    os.environ["FRAMEWORK_ZK_JIT"] = args.zk_jit
    with fresh_server() as (hosts, SERVER_PID):
        results, peer_rows = trio.run(measure_all, hosts, args)
    if args.json:  # one object per row: workload, unit, peer, persistence, kazoo, ours, ratio
        rows = [peers.PeerRow("kazoo", None, r) for r in results] + peer_rows
        print(json.dumps([{"workload": row.result.workload, "unit": row.result.unit,
                           "peer": row.peer, "persistence": row.persistence,
                           "kazoo": row.result.kazoo, "ours": row.result.ours,
                           "ratio": row.result.ratio} for row in rows], indent=2))
        return
    if results:
        print_results("master/worker runtime vs kazoo recipes (real processes)", results)
    if peer_rows:
        peers.print_peer_results("ours vs Dramatiq, Celery and RQ on Redis (same workload, real "
                           "processes)", peer_rows)


if __name__ == "__main__":
    main()
