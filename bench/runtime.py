"""Runtime benchmark, with real processes.

Run: ``.venv/bin/python bench/runtime.py [--json]`` (``--json``: the rows as a JSON list of
objects with keys workload, unit, kazoo, ours, ratio).

1. Tasks/s end to end: 1 master + 4 worker processes, trivial tasks (submit -> handled ->
   result recorded -> acknowledged), vs kazoo's ``LockingQueue`` drained by 4 consumer
   processes (put -> get -> consume; no result records, so it does less work per task).
2. Master failover after kill -9 of the leader: until the standby's address is published,
   vs kazoo's ``Election`` (until the standby's function runs), same session timeout.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import Result, print_results, zookeeper  # noqa: E402
from framework import Session, configure_logging  # noqa: E402
from framework.primitives import Rendezvous  # noqa: E402
from framework.zk import watch_children  # noqa: E402

TASKS = 2000
WORKERS = 4
SESSION_TIMEOUT = 2.0
FAILOVER_ROUNDS = 3
ENV = os.environ | {"PYTHONPATH": str(ROOT), "FRAMEWORK_LOG_LEVEL": "warning"}

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


def run_cmd(*args: str, env: dict[str, str] | None = None,
            stdout: int | None = subprocess.DEVNULL) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, *args], env=env or ENV, stdout=stdout,
                            stderr=subprocess.DEVNULL, text=True)


def framework_run(hosts: str, chroot: str, cls: str, name: str, **env: str) -> subprocess.Popen:
    return run_cmd("-m", "framework", "run", f"bench.runtime_app:{cls}", "--zk", hosts,
                   "--chroot", chroot, "--name", name, "--session-timeout", str(SESSION_TIMEOUT),
                   env=ENV | env, stdout=subprocess.PIPE)


def kill_all(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()


async def wait_count(session: Session, path: str, count: int) -> None:
    await session.ensure_path(path)
    async for snap in watch_children(session, path):
        if len(snap.children) >= count:
            return


async def ours_throughput(hosts: str, concurrency: int) -> float:
    chroot = f"/bench-rt-{time.time_ns()}"
    procs = [framework_run(hosts, chroot, "BenchWorker", f"w{i}",
                           BENCH_CONCURRENCY=str(concurrency)) for i in range(WORKERS)]
    try:
        async with Session(hosts, chroot=chroot) as s:
            await wait_count(s, "/apps/bench/workers", WORKERS)
        master = framework_run(hosts, chroot, "BenchMaster", "m", BENCH_TASKS=str(TASKS))
        procs.append(master)
        out, _ = await trio.to_thread.run_sync(master.communicate)
        elapsed = float(out.split("ELAPSED")[1])
        return TASKS / elapsed
    finally:
        kill_all(procs)


async def kazoo_throughput(hosts: str) -> float:
    from kazoo.client import KazooClient
    from kazoo.recipe.queue import LockingQueue

    path = f"/kbench-{time.time_ns()}"
    client = KazooClient(hosts=hosts)
    await trio.to_thread.run_sync(client.start)
    queue = LockingQueue(client, path)
    procs: list[subprocess.Popen] = []
    try:
        start = time.time()
        for offset in range(0, TASKS, 500):
            batch = [json.dumps({"n": i}).encode() for i in range(offset, min(offset + 500, TASKS))]
            await trio.to_thread.run_sync(queue.put_all, batch)
        procs = [run_cmd("-c", KAZOO_CONSUMER, hosts, path) for _ in range(WORKERS)]
        for p in procs:
            await trio.to_thread.run_sync(p.wait)
        done_dir = f"{path}-done"
        done = [float(client.get(f"{done_dir}/{n}")[0]) for n in client.get_children(done_dir)]
        return TASKS / (max(done) - start)
    finally:
        kill_all(procs)
        client.stop()
        client.close()


async def ours_failover(hosts: str) -> float:
    chroot = f"/bench-fo-{time.time_ns()}"
    procs: list[subprocess.Popen] = []
    try:
        async with Session(hosts, chroot=chroot) as s:
            procs.append(framework_run(hosts, chroot, "BenchMaster", "a"))
            await wait_count(s, "/apps/bench/masters", 1)
            rendezvous = Rendezvous(s, "/apps/bench/rendezvous")
            async for data in rendezvous.watch():
                if data:
                    break
            procs.append(framework_run(hosts, chroot, "BenchMaster", "b"))
            await wait_count(s, "/apps/bench/masters", 2)
            procs[0].kill()
            killed = time.perf_counter()
            async for data in rendezvous.watch():
                if data and json.loads(data)["name"] == "b":
                    return time.perf_counter() - killed
    finally:
        kill_all(procs)
    raise AssertionError("unreachable")


async def kazoo_failover(hosts: str) -> float:
    path = f"/kfo-{time.time_ns()}"
    procs: list[subprocess.Popen] = []
    try:
        async with Session(hosts) as s:
            from framework.zk import wait_exists

            procs.append(run_cmd("-c", KAZOO_LEADER, hosts, path, "a", str(SESSION_TIMEOUT)))
            await wait_exists(s, f"{path}-leader")
            procs.append(run_cmd("-c", KAZOO_LEADER, hosts, path, "b", str(SESSION_TIMEOUT)))
            await wait_count(s, path, 2)
            procs[0].kill()
            killed = time.perf_counter()
            async for snap in _watch_data(s, f"{path}-leader"):
                if snap == b"b":
                    return time.perf_counter() - killed
    finally:
        kill_all(procs)
    raise AssertionError("unreachable")


async def _watch_data(session: Session, path: str):  # type: ignore[no-untyped-def]
    from framework.zk import watch_data

    async for snap in watch_data(session, path):
        yield snap.data


async def measure(hosts: str) -> list[Result]:
    kazoo_tp = await kazoo_throughput(hosts)
    ours_1 = await ours_throughput(hosts, 1)
    ours_4 = await ours_throughput(hosts, 4)
    ours_fo = [await ours_failover(hosts) for _ in range(FAILOVER_ROUNDS)]
    kazoo_fo = [await kazoo_failover(hosts) for _ in range(FAILOVER_ROUNDS)]
    return [
        Result(f"{TASKS} tasks, 1 master + {WORKERS} workers (1 slot each)", "tasks/s",
               kazoo_tp, ours_1, note="kazoo: LockingQueue, 4 consumer processes"),
        Result(f"{TASKS} tasks, 1 master + {WORKERS} workers (4 slots each)", "tasks/s",
               kazoo_tp, ours_4, note="kazoo: LockingQueue, 4 consumer processes"),
        Result("master failover after kill -9", "s", statistics.median(kazoo_fo),
               statistics.median(ours_fo), higher_is_better=False,
               note=f"session timeout {SESSION_TIMEOUT:g}s; median of {FAILOVER_ROUNDS}; "
                    "kazoo: Election"),
    ]


def main() -> None:
    as_json = "--json" in sys.argv[1:]
    configure_logging(level="warning")
    with zookeeper() as hosts:
        results = trio.run(measure, hosts)
    if as_json:  # one object per row: workload, unit, kazoo, ours, ratio
        print(json.dumps([{"workload": r.workload, "unit": r.unit, "kazoo": r.kazoo,
                           "ours": r.ours, "ratio": r.ratio} for r in results], indent=2))
        return
    print_results("master/worker runtime vs kazoo recipes (real processes)", results)


if __name__ == "__main__":
    main()
