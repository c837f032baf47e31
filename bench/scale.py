"""Scale of the runtime: many workers in one app, and a million queued tasks.

Run: ``.venv/bin/python bench/scale.py [--workers 200] [--per-process 10] [--queued 1000000]``
(``--json``: the measurements as one JSON object).  Each part starts its own standalone
ZooKeeper; nothing is asserted, everything is printed.

1. **Many workers.**  ``--workers`` Worker objects (one session each, one slot each) in
   processes of ``--per-process``, all of one app, all idle.  Measured from the server's
   ``mntr``: requests and write transactions per second while idle (pings and status
   writes); per submitted task, requests received and packets sent (the watch fan-out: every
   idle worker is woken by each put and lists the bucket again); and the time from submit to
   the handler's start (the result record's ``started_at``), median and worst of
   ``ROUNDS`` single tasks submitted one after another.
2. **A million queued tasks.**  ``--queued`` tasks submitted with ``submit_many`` (the
   master's path) to a server with a 4 GiB heap: the submit rate, the server's heap in use
   after a full GC (``jcmd GC.run`` then ``GC.heap_info``) before and after, so bytes of heap
   per queued task, and the largest listing a consumer or the master makes (the buckets
   list and one bucket), against ZooKeeper's 1 MB reply limit.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.runtime import server_counters  # noqa: E402
from framework import Session, configure_logging  # noqa: E402
from framework.runtime import App, Task, TaskResult, Worker  # noqa: E402
from framework.zk import watch_children  # noqa: E402
from framework.zkserver import ZooKeeperEnsemble  # noqa: E402

APP = App("scale")
ROUNDS = 30
IDLE_WINDOW = 10.0  # seconds of idle load measured
ENV = os.environ | {"PYTHONPATH": str(ROOT), "FRAMEWORK_LOG_LEVEL": "warning"}


class ScaleWorker(Worker):
    """A one-slot worker whose handler returns at once."""

    app_name = APP.name
    concurrency = 1

    async def handle(self, task: Task) -> int:
        return 0


async def _serve_workers(hosts: str, first: int, count: int) -> None:
    """Run ``count`` workers, each with its own session, in this process (the child)."""
    async with trio.open_nursery() as nursery:
        for index in range(first, first + count):
            nursery.start_soon(_one_worker, hosts, f"w{index:04d}")


async def _one_worker(hosts: str, name: str) -> None:
    async with Session(hosts, session_timeout=10.0) as session:
        await ScaleWorker(APP, name=name).run(session)


def _start_worker_processes(hosts: str, workers: int, per_process: int) -> list[subprocess.Popen]:
    procs = []
    for first in range(0, workers, per_process):
        count = min(per_process, workers - first)
        procs.append(subprocess.Popen(
            [sys.executable, __file__, "--serve", hosts, str(first), str(count)],
            env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        ))
    return procs


async def _wait_members(session: Session, path: str, count: int) -> None:
    await session.ensure_path(path)
    async for snap in watch_children(session, path):
        if len(snap.children) >= count:
            return


async def _wait_result(session: Session, task: Task) -> TaskResult:
    path = APP.result_path(task.key)
    parent = path.rsplit("/", 1)[0]
    async for snap in watch_children(session, parent):
        if task.key in snap.children:
            return TaskResult.decode((await session.get(path))[0])
    raise AssertionError("unreachable")


async def many_workers(workers: int, per_process: int) -> dict[str, float]:
    with ZooKeeperEnsemble(1, heap_mb=1024) as zk:
        hosts = zk.connect_string
        procs = _start_worker_processes(hosts, workers, per_process)
        try:
            async with Session(hosts) as session:
                started = time.perf_counter()
                with trio.fail_after(300):
                    await _wait_members(session, APP.workers, workers)
                joined = time.perf_counter() - started
                from framework.primitives import WorkQueue

                queue = WorkQueue(session, APP.tasks)
                await queue.put(Task("warm-up", {}).encode())  # every worker's view is warm
                await _wait_result(session, Task("warm-up", {}))
                before, t0 = server_counters(hosts), time.perf_counter()
                await trio.sleep(IDLE_WINDOW)  # the measurement window itself
                after, t1 = server_counters(hosts), time.perf_counter()
                idle_requests = (after[0] - before[0]) / (t1 - t0)
                idle_writes = (after[1] - before[1]) / (t1 - t0)
                delays = []
                sent_before = _packets_sent(hosts)
                before = server_counters(hosts)
                for n in range(ROUNDS):
                    task = Task(f"t{n}", {"n": n})
                    submitted = time.time()
                    await queue.put(task.encode())
                    result = await _wait_result(session, task)
                    delays.append(result.started_at - submitted)
                after = server_counters(hosts)
                sent = (_packets_sent(hosts) - sent_before) / ROUNDS
        finally:
            for proc in procs:
                proc.kill()
                proc.wait()
    return {
        "workers": workers,
        "processes": len(procs),
        "join_all_s": joined,
        "idle_requests_per_s": idle_requests,
        "idle_writes_per_s": idle_writes,
        "requests_per_task": (after[0] - before[0]) / ROUNDS,
        "writes_per_task": (after[1] - before[1]) / ROUNDS,
        "packets_sent_per_task": sent,
        "put_to_handler_ms_median": statistics.median(delays) * 1000,
        "put_to_handler_ms_max": max(delays) * 1000,
    }


def _packets_sent(hosts: str) -> int:
    from framework.zkserver import four_letter

    host, port = hosts.rsplit(":", 1)
    for line in four_letter(int(port), "mntr", host=host).splitlines():
        if line.startswith("zk_packets_sent\t"):
            return int(line.split("\t")[1])
    raise AssertionError("mntr has no zk_packets_sent")


def _heap_used_mb(pid: int) -> float:
    subprocess.run(["jcmd", str(pid), "GC.run"], capture_output=True, check=True)
    info = subprocess.run(["jcmd", str(pid), "GC.heap_info"], capture_output=True, text=True,
                          check=True).stdout
    # serial/parallel GC: one line per generation; G1: one "garbage-first heap" line
    used = re.findall(r"(?:generation|heap)\s+total \d+K, used (\d+)K", info)
    if not used:
        raise AssertionError(f"cannot read the heap from jcmd: {info[:200]}")
    return sum(int(kb) for kb in used) / 1024


async def queued(count: int) -> dict[str, float]:
    from framework.primitives import WorkQueue

    with ZooKeeperEnsemble(1, heap_mb=4096) as zk:
        pid = zk.members[0].process.pid  # type: ignore[union-attr]
        async with Session(zk.connect_string, session_timeout=30.0) as session:
            queue = WorkQueue(session, APP.tasks)
            await queue.size()  # the layout exists before the baseline
            heap_before = _heap_used_mb(pid)
            started = time.perf_counter()
            chunk = 5000
            for offset in range(0, count, chunk):
                tasks = [Task(f"{offset + i:08d}", {"n": offset + i})
                         for i in range(min(chunk, count - offset))]
                await queue.put_many([t.encode() for t in tasks])
                if offset % 100_000 == 0:
                    print(f"  queued {offset:,} / {count:,}", file=sys.stderr, flush=True)
            submit_s = time.perf_counter() - started
            heap_after = _heap_used_mb(pid)
            buckets = await session.children(queue.items_root)
            largest_bucket = max(
                [len(await session.children(f"{queue.items_root}/{b}")) for b in buckets[:3]]
            )
            sample = await session.children(f"{queue.items_root}/{buckets[0]}")
            bucket_reply = sum(len(n) + 4 for n in sample) + 4
            size = await queue.size()
    return {
        "queued": count,
        "counted": size,
        "submit_per_s": count / submit_s,
        "heap_before_mb": heap_before,
        "heap_after_mb": heap_after,
        "heap_bytes_per_task": (heap_after - heap_before) * 1024 * 1024 / count,
        "buckets": len(buckets),
        "buckets_reply_bytes": sum(len(n) + 4 for n in buckets) + 4,
        "largest_bucket_items": largest_bucket,
        "bucket_reply_bytes": bucket_reply,
    }


def main() -> None:
    if sys.argv[1:2] == ["--serve"]:
        hosts, first, count = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
        configure_logging(level="warning")
        trio.run(_serve_workers, hosts, first, count)
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=200)
    parser.add_argument("--per-process", type=int, default=10)
    parser.add_argument("--queued", type=int, default=1_000_000)
    parser.add_argument("--skip-workers", action="store_true")
    parser.add_argument("--skip-queued", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    configure_logging(level="warning")
    report: dict[str, dict[str, float]] = {}
    if not args.skip_workers:
        report["many_workers"] = trio.run(many_workers, args.workers, args.per_process)
    if not args.skip_queued:
        report["queued"] = trio.run(queued, args.queued)
    if args.json:
        print(json.dumps(report, indent=2))
        return
    for part, values in report.items():
        print(part)
        for key, value in values.items():
            print(f"  {key:28} {value:,.2f}" if isinstance(value, float) else
                  f"  {key:28} {value:,}")


if __name__ == "__main__":
    main()
