"""Scale of the runtime: many workers in one app, and a million queued tasks.

Run: ``.venv/bin/python bench/scale.py [--workers 200] [--per-process 10] [--queued 1000000]
[--master-large 1000000] [--drain-large 40000]`` (``--json``: the measurements as one JSON
object; ``--quick``: every part at a toy size, about 15 s, a smoke run).  Each part starts
its own standalone ZooKeeper; nothing is asserted, everything is printed.

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
3. **Retention pass cost** (``--skip-retention`` to leave it out).  One app with 10,000 result
   records and 1,000, then 100,000 queued tasks (half of them with an explicit key, so with
   a queued marker): the requests of a retention pass that deletes 1,000 records (count
   limit 9,000) and of one that has nothing to delete, counted at the client; and the
   server's heap per queued task with and without a marker.
4. **The active master's memory** (``--skip-master``).  A master process (retention every
   ``PASS_INTERVAL`` s, at most ``RESULTS_KEPT`` results, up to ``PASS_BATCH`` looked at per
   pass) while ``--master-small`` tasks are queued and 80% of them drained by 4 worker
   processes x 4 slots, then, on a fresh server, ``--master-large`` tasks queued and
   ``--drain-large`` of them drained: the master's RSS after its first pass and after the
   drain (two passes later), from ``/proc/self/status``, and the requests of its passes.

Every process is started with :func:`framework.testing.spawn`; their logs go to
``out/bench-scale/<name>.log``.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import attrs
import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.runtime import server_counters  # noqa: E402
from framework import Session, configure_logging  # noqa: E402
from framework.primitives import Election, WorkQueue  # noqa: E402
from framework.runtime import App, Master, MasterContext, Task, TaskResult, Worker  # noqa: E402
from framework.runtime.app import ensure_result_buckets  # noqa: E402
from framework.runtime.results.result_index import SlotKeeper, mark_queued, write_record  # noqa: E402
from framework.runtime.results.retention import Limit, Retention  # noqa: E402
from framework.testing import Child, python_argv, spawn  # noqa: E402
from framework.zk import watch_children  # noqa: E402
from framework.zkserver import ZooKeeperEnsemble  # noqa: E402

APP = App("scale")
ROUNDS = 30
IDLE_WINDOW = 10.0  # seconds of idle load measured
ENV = {"PYTHONPATH": str(ROOT), "FRAMEWORK_LOG_LEVEL": "warning"}
LOGS = ROOT / "out" / "bench-scale"
PASS_INTERVAL = 2.0  # seconds between the scale master's retention passes
RESULTS_KEPT = 1_000  # its result_retention_count
PASS_BATCH = 20_000  # its retention_batch
DRAIN_WORKERS = 4  # worker processes draining in part 4, 4 slots each


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


async def _start_worker_processes(stack: AsyncExitStack, hosts: str, workers: int,
                                  per_process: int) -> list[Child]:
    procs = []
    for first in range(0, workers, per_process):
        count = min(per_process, workers - first)
        procs.append(await stack.enter_async_context(spawn(
            python_argv(__file__, "--serve", hosts, first, count), name=f"workers-{first}",
            log_dir=LOGS, env=ENV, cwd=ROOT)))
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
        async with AsyncExitStack() as stack:
            procs = await _start_worker_processes(stack, hosts, workers, per_process)
            async with Session(hosts) as session:
                started = time.perf_counter()
                with trio.fail_after(300):
                    await _wait_members(session, APP.workers, workers)
                joined = time.perf_counter() - started
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


async def _jcmd(pid: int, command: str) -> str:
    """What ``jcmd <pid> <command>`` prints."""
    async with spawn(["jcmd", str(pid), command], name="jcmd", pipe_stdout=True) as child:
        assert child.lines is not None
        lines = await child.lines.rest()
        if await child.wait() != 0:
            raise AssertionError(f"jcmd {command} failed: {lines[-3:]}")
    return "\n".join(lines)


async def _heap_used_mb(pid: int) -> float:
    await _jcmd(pid, "GC.run")
    info = await _jcmd(pid, "GC.heap_info")
    # serial/parallel GC: one line per generation; G1: one "garbage-first heap" line
    used = re.findall(r"(?:generation|heap)\s+total \d+K, used (\d+)K", info)
    if not used:
        raise AssertionError(f"cannot read the heap from jcmd: {info[:200]}")
    return sum(int(kb) for kb in used) / 1024


async def queued(count: int) -> dict[str, float]:
    with ZooKeeperEnsemble(1, heap_mb=4096) as zk:
        pid = zk.members[0].process.pid  # type: ignore[union-attr]
        async with Session(zk.connect_string, session_timeout=30.0) as session:
            queue = WorkQueue(session, APP.tasks)
            await queue.size()  # the layout exists before the baseline
            heap_before = await _heap_used_mb(pid)
            started = time.perf_counter()
            chunk = 5000
            for offset in range(0, count, chunk):
                tasks = [Task(f"{offset + i:08d}", {"n": offset + i})
                         for i in range(min(chunk, count - offset))]
                await queue.put_many([t.encode() for t in tasks])
                if offset % 100_000 == 0:
                    print(f"  queued {offset:,} / {count:,}", file=sys.stderr, flush=True)
            submit_s = time.perf_counter() - started
            heap_after = await _heap_used_mb(pid)
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


# ---------------------------------------------------------------- 3. retention pass cost


async def _write_records(session: Session, app: App, count: int) -> None:
    """``count`` result records as workers write them (record and index entry in one multi),
    200 in flight."""
    keeper = SlotKeeper(session, app)
    slot = keeper.current(time.time())
    await keeper.made(slot)
    data = TaskResult("r", True, "w", 1, 0).encode()

    async def write(first: int) -> None:
        for n in range(first, min(first + 50, count)):
            await write_record(session, app, f"r{n:07d}", data, slot)

    for start in range(0, count, 200 * 50):
        async with trio.open_nursery() as nursery:
            for first in range(start, min(start + 200 * 50, count), 50):
                nursery.start_soon(write, first)


async def _counted_pass(session: Session, retention: Retention) -> tuple[int, float, int]:
    """(requests, seconds, records deleted) of one retention pass."""
    original = session._call
    calls = [0]

    async def counted(request: Any) -> Any:
        calls[0] += 1
        return await original(request)

    session._call = counted  # type: ignore[method-assign]
    try:
        started = time.perf_counter()
        deleted = await retention.apply()
        return calls[0], time.perf_counter() - started, deleted["results"]
    finally:
        session._call = original  # type: ignore[method-assign]


async def pass_cost(records: int = 10_000,
                    sizes: tuple[int, ...] = (1_000, 100_000)) -> dict[str, float]:
    report: dict[str, float] = {}
    with ZooKeeperEnsemble(1, heap_mb=2048) as zk:
        pid = zk.members[0].process.pid  # type: ignore[union-attr]
        async with Session(zk.connect_string, session_timeout=30.0) as session:
            for queued in sizes:
                app = App(f"cost{queued}")
                await ensure_result_buckets(session, app)  # as the first worker does
                await _write_records(session, app, records)
                queue = WorkQueue(session, app.tasks, dead_letter=app.dead)
                await queue.size()
                half = queued // 2
                heap = [await _heap_used_mb(pid)]
                for offset in range(0, half, 5000):  # half without a key: no marker
                    await queue.put_many([Task(f"u{n:07d}", n).encode()
                                          for n in range(offset, min(offset + 5000, half))])
                heap.append(await _heap_used_mb(pid))
                for offset in range(0, half, 5000):  # half with an explicit key: a marker
                    keys = [f"k{n:07d}" for n in range(offset, min(offset + 5000, half))]
                    names = await queue.put_many([Task(k, 0, k).encode() for k in keys])
                    await mark_queued(session, app, list(zip(keys, names, strict=True)))
                heap.append(await _heap_used_mb(pid))
                await session.ensure_path(app.masters)
                async with Election(session, app.masters, b"bench").leadership() as term:
                    retention = Retention(session, app, term, queue,
                                          results=Limit(records - 1000), dead=Limit(),
                                          failures=Limit(), batch=1000)
                    busy = await _counted_pass(session, retention)
                    idle = await _counted_pass(session, retention)
                report[f"queued_{queued}_pass_requests"] = busy[0]
                report[f"queued_{queued}_pass_seconds"] = busy[1]
                report[f"queued_{queued}_pass_deleted"] = busy[2]
                report[f"queued_{queued}_idle_pass_requests"] = idle[0]
                if queued == sizes[-1]:
                    report["heap_bytes_per_queued_task"] = (heap[1] - heap[0]) * 2**20 / half
                    report["heap_bytes_per_queued_keyed_task"] = (
                        (heap[2] - heap[1]) * 2**20 / half)
    return report


# ---------------------------------------------------------------- 4. the master's memory


def _rss_kb() -> tuple[int, int]:
    """This process's resident set and its peak, in kB."""
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text()
                  .splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]), int(fields["VmHWM"].split()[0])


class ScaleMaster(Master):
    """Leads by running retention passes (the work measured), one every ``PASS_INTERVAL``
    s; after each it prints ``PASS <requests> <deleted> <looked at> <seconds> <rss kB>
    <peak kB>``."""

    app_name = APP.name
    retention_interval = None  # its own loop, to count each pass's requests
    result_retention_count = RESULTS_KEPT
    retention_batch = PASS_BATCH

    async def lead(self, ctx: MasterContext) -> None:
        while True:
            requests, seconds, deleted = await _counted_pass(ctx.session, ctx.retention)
            print("PASS", requests, deleted, ctx.retention.results.looked_at,
                  round(seconds, 3), *_rss_kb(), flush=True)
            await trio.sleep(PASS_INTERVAL)


class DrainWorker(Worker):
    """4 slots; stops (drains) after handling ``limit`` tasks."""

    app_name = APP.name
    concurrency = 4

    def __init__(self, limit: int, **kwargs: Any) -> None:
        super().__init__(APP, **kwargs)
        self.limit = limit
        self.handled = 0

    async def handle(self, task: Task) -> int:
        self.handled += 1
        if self.handled == self.limit:
            self.request_stop()
        return 0


@attrs.define
class _Passes:
    """The scale master's PASS lines as they come."""

    seen: list[list[float]] = attrs.Factory(list)
    arrived: trio.Event = attrs.Factory(trio.Event)

    async def read(self, child: Child) -> None:
        assert child.lines is not None
        while True:
            line = await child.lines.next()
            if line.startswith("PASS "):
                self.seen.append([float(v) for v in line.split()[1:]])
                self.arrived.set()
                self.arrived = trio.Event()

    async def wait(self, count: int) -> list[float]:
        """The ``count``-th pass (1-based) once it has ended."""
        while len(self.seen) < count:
            await self.arrived.wait()
        return self.seen[count - 1]


async def master_memory(queued: int, drain: int) -> dict[str, float]:
    heap = 4096 if queued > 300_000 else 1024
    with ZooKeeperEnsemble(1, heap_mb=heap) as zk:
        hosts = zk.connect_string
        # the session first: it opens a nursery of its own, which must close after ours
        async with Session(hosts, session_timeout=30.0) as session, AsyncExitStack() as stack, \
                trio.open_nursery() as nursery:
            master = await stack.enter_async_context(spawn(
                python_argv(__file__, "--master", hosts, PASS_INTERVAL),
                name=f"master-{queued}",
                log_dir=LOGS, env=ENV, cwd=ROOT, pipe_stdout=True))
            passes = _Passes()
            nursery.start_soon(passes.read, master)
            with trio.fail_after(120):
                first = await passes.wait(1)
            queue = WorkQueue(session, APP.tasks)
            started = time.perf_counter()
            for offset in range(0, queued, 5000):
                await queue.put_many([Task(f"{n:08d}", n).encode()
                                      for n in range(offset, min(offset + 5000, queued))])
                if offset % 200_000 == 0:
                    print(f"  queued {offset:,} / {queued:,}", file=sys.stderr, flush=True)
            submitted = time.perf_counter() - started
            during = len(passes.seen)
            started = time.perf_counter()
            async with AsyncExitStack() as workers:
                procs = [await workers.enter_async_context(spawn(
                    python_argv(__file__, "--drain", hosts, f"d{i}", drain // DRAIN_WORKERS),
                    name=f"drain-{queued}-{i}", log_dir=LOGS, env=ENV, cwd=ROOT))
                    for i in range(DRAIN_WORKERS)]
                for proc in procs:
                    await proc.wait()
            drained = time.perf_counter() - started
            ended = len(passes.seen)
            last = await passes.wait(ended + 2)  # two whole passes after the drain
            counts = await _results_left(session)
            nursery.cancel_scope.cancel()
    working = passes.seen[during:ended + 2]
    return {
        "queued": queued,
        "drained": drain // DRAIN_WORKERS * DRAIN_WORKERS,
        "submit_s": submitted,
        "drain_per_s": drain / drained,
        "passes": len(passes.seen),
        "rss_first_pass_mb": first[4] / 1024,
        "rss_after_drain_mb": last[4] / 1024,
        "rss_growth_mb": (last[4] - first[4]) / 1024,
        "rss_peak_mb": last[5] / 1024,
        "pass_requests_idle": first[0],
        "pass_requests_max": max(p[0] for p in working),
        "pass_deleted_max": max(p[1] for p in working),
        "pass_seconds_max": max(p[3] for p in working),
        "results_left": counts,
    }


async def _results_left(session: Session) -> int:
    total = 0
    for bucket in APP.result_buckets:
        stat = await session.exists(f"{APP.results}/{bucket}")
        total += stat.numChildren if stat is not None else 0
    return total


async def _run_master(hosts: str) -> None:
    async with Session(hosts, session_timeout=30.0) as session:
        await ScaleMaster(APP, name="scale-master").run(session)


async def _drain(hosts: str, name: str, limit: int) -> None:
    async with Session(hosts, session_timeout=30.0) as session:
        await DrainWorker(limit, name=name).run(session)


def _child(argv: list[str]) -> bool:
    """Run this file's child role named by ``argv`` (``--serve``, ``--master``,
    ``--drain``); False if ``argv`` names none."""
    global PASS_INTERVAL  # a --master child sets it
    role = argv[1:2]
    if role == ["--serve"]:
        configure_logging(level="warning")
        trio.run(_serve_workers, argv[2], int(argv[3]), int(argv[4]))
    elif role == ["--master"]:
        PASS_INTERVAL = float(argv[3])
        configure_logging(level="warning")
        trio.run(_run_master, argv[2])
    elif role == ["--drain"]:
        configure_logging(level="warning")
        trio.run(_drain, argv[2], argv[3], int(argv[4]))
    else:
        return False
    return True


def _arguments() -> argparse.Namespace:
    global IDLE_WINDOW, ROUNDS, PASS_INTERVAL  # --quick sets them
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=200)
    parser.add_argument("--per-process", type=int, default=10)
    parser.add_argument("--queued", type=int, default=1_000_000)
    parser.add_argument("--master-small", type=int, default=10_000)
    parser.add_argument("--master-large", type=int, default=1_000_000)
    parser.add_argument("--drain-large", type=int, default=40_000)
    parser.add_argument("--skip-workers", action="store_true")
    parser.add_argument("--skip-queued", action="store_true")
    parser.add_argument("--skip-retention", action="store_true")
    parser.add_argument("--skip-master", action="store_true")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--quick", action="store_true",
                        help="every part at a toy size, in seconds (the test suite runs it so "
                             "that the bench cannot rot; its numbers mean nothing)")
    args = parser.parse_args()
    if args.quick:
        IDLE_WINDOW, ROUNDS, PASS_INTERVAL = 0.3, 3, 0.2
        args.workers, args.per_process, args.queued = 4, 2, 2_000
        args.master_small, args.master_large, args.drain_large = 200, 400, 80
    return args


def _measure(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    report: dict[str, dict[str, float]] = {}
    if not args.skip_workers:
        report["many_workers"] = trio.run(many_workers, args.workers, args.per_process)
    if not args.skip_queued:
        report["queued"] = trio.run(queued, args.queued)
    if not args.skip_retention:
        report["retention_pass"] = (trio.run(pass_cost, 2_000, (100, 400)) if args.quick
                                    else trio.run(pass_cost))
    if not args.skip_master:
        small = args.master_small
        report["master_small"] = trio.run(master_memory, small, small * 8 // 10)
        report["master_large"] = trio.run(master_memory, args.master_large, args.drain_large)
        report["master_rss_growth_between"] = {
            "mb": report["master_large"]["rss_after_drain_mb"]
            - report["master_small"]["rss_after_drain_mb"]}
    return report


def main() -> None:
    if _child(sys.argv):
        return
    args = _arguments()
    configure_logging(level="warning")
    for old in LOGS.glob("*.log"):  # the children's logs of this run only
        old.unlink()
    report = _measure(args)
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
