"""Katta-like search benchmark: scatter-gather over 8 replicated shards against one index.

    .venv/bin/python bench/katta.py [--json] [--docs N] [--queries N] [--rounds N]
                                    [--concurrency N]

Runs 1 master and 4 search nodes as real processes (``framework run``) on a fresh standalone
ZooKeeper (or ``$FRAMEWORK_ZK_HOSTS``, in a fresh chroot), builds a generated corpus into
8 shards x 2 replicas as a job, then measures:

* queries/s and p50/p99 latency of scatter-gather (one call per node carrying its shards,
  msgpack frames on a persistent TCP connection per node; top 10 merged) at ``--concurrency``
  queries in flight (default 4) with global term statistics (cold: a new client, a
  statistics round for each query with a term it has not seen; warm: every term's
  statistics cached) and with per-shard scoring, against the same queries on one tantivy
  index in this process; with and without the client's hedged requests (what hedging costs
  when nothing fails);
* CPU time per query of the search nodes (all four, from ``/proc``) and of this process (the
  client; for the baseline, the in-process searches): unlike latency, it does not grow with
  what the neighbours on this shared machine run;
* index build time as a job (4 nodes) against one in-process build of the whole corpus;
* shard deploy time (copy from the store, verify the checksum, open, announce: from the
  index's ``deploying`` state until every shard has 2 serving replicas);
* time from kill -9 of a node until every shard has 2 serving replicas again (session
  timeout 4 s, node grace 1 s), and from kill -9 of the master to a new leader (2 masters).

Each row: workload, unit, baseline (one in-process index, where there is one), ours, ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import attrs
import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import zookeeper
from examples.katta_like.client import SearchClient
from examples.katta_like.cluster import Cluster, active_master, wait_new_master
from examples.katta_like.corpus import CorpusSpec, documents, sample_queries
from examples.katta_like.ctl import add_index, wait_replicated
from examples.katta_like.layout import IndexRecord, KattaPaths
from examples.katta_like.searcher import ShardSearcher
from examples.katta_like.store import ShardStore
from framework import Session, configure_logging
from framework.runtime import App
from framework.zk import watch_children, watch_data


@attrs.frozen
class Row:
    workload: str
    unit: str
    baseline: float | None
    ours: float | None

    @property
    def ratio(self) -> float | None:
        if not self.baseline or self.ours is None:
            return None
        return round(self.ours / self.baseline, 3)

    def to_json(self) -> dict[str, Any]:
        return attrs.asdict(self) | {"ratio": self.ratio}


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(p * len(values)))] if values else 0.0


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds used so far by the processes ``pids`` (``/proc``)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / tick


def baseline_queries(spec: CorpusSpec, workdir: Path, queries: list[str]
                     ) -> tuple[float, float, list[float], float]:
    """(build seconds, queries/s, latencies, CPU seconds per query) on one in-process
    tantivy index."""
    started = time.perf_counter()
    store = ShardStore(workdir / "single")
    store.build_shard("all", 0, documents(spec))
    build = time.perf_counter() - started
    searcher = ShardSearcher(store.shard_path("all", 0))
    latencies = []
    started, cpu = time.perf_counter(), time.thread_time()
    for q in queries:
        t = time.perf_counter()
        searcher.search(q, 10)
        latencies.append(time.perf_counter() - t)
    cpu = (time.thread_time() - cpu) / len(queries)
    return build, len(queries) / (time.perf_counter() - started), latencies, cpu


async def scatter(client: SearchClient, queries: list[str], concurrency: int
                  ) -> tuple[float, list[float], int]:
    """(queries/s, latencies, partial-or-failed) for ``queries`` at ``concurrency``."""
    latencies: list[float] = []
    bad = [0]
    todo = iter(queries)

    async def worker() -> None:
        for q in todo:
            t = time.perf_counter()
            result = await client.search(q, index="docs", top=10)
            latencies.append(time.perf_counter() - t)
            bad[0] += result.partial

    started = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(concurrency):
            nursery.start_soon(worker)
    return len(queries) / (time.perf_counter() - started), latencies, bad[0]


async def states_seen(session: Session, path: str, seen: dict[str, float]) -> None:
    async for snap in watch_data(session, path):
        if snap.data:
            seen.setdefault(json.loads(snap.data)["state"], time.perf_counter())


async def bench(args: argparse.Namespace, hosts: str) -> list[Row]:
    rows: list[Row] = []
    workdir = Path(tempfile.mkdtemp(prefix="katta-bench-"))
    spec = CorpusSpec(docs=args.docs, seed=3)
    queries = list(dict.fromkeys(sample_queries(spec, args.queries * 3)))[:args.queries]
    build1, qps1, lat1, cpu1 = await trio.to_thread.run_sync(baseline_queries, spec, workdir,
                                                             queries)
    chroot = f"/katta-bench-{uuid.uuid4().hex[:8]}"
    async with Cluster(hosts, chroot, workdir) as cluster:
        await cluster.start_master("m1")
        await cluster.start_master("m2")
        for n in range(1, 5):
            await cluster.start_node(f"n{n}")
        async with Session(hosts, chroot=chroot) as session:
            seen: dict[str, float] = {}
            paths = KattaPaths(App("katta"))
            async with trio.open_nursery() as nursery:
                nursery.start_soon(states_seen, session, paths.index("docs"), seen)
                await session.ensure_path(paths.indexes)
                async for snap in watch_children(session, App("katta").workers):
                    if len(snap.children) == 4:  # every node up: time the job, not imports
                        break
                while await active_master(session) is None:
                    await wait_new_master(session, None)
                started = time.perf_counter()
                await add_index(session, IndexRecord("docs", 8, 2, str(workdir / "store"),
                                                     spec))
                await wait_replicated(session, "docs", 2)
                replicated = time.perf_counter()
                nursery.cancel_scope.cancel()
            rows.append(Row("index build (8 shards, job on 4 nodes)", "s", round(build1, 3),
                            round(seen["deploying"] - started, 3)))
            rows.append(Row("shard deploy: copy+verify+open+announce, 16 replicas", "s", None,
                            round(replicated - seen["deploying"], 3)))
            # the configurations take turns, ``--rounds`` times, so a neighbour's burst of
            # CPU on this shared machine does not land on one of them only; medians reported
            # "no hedging": the client waits for each request (up to its shard timeout)
            # before asking another replica - what hedging costs when nothing fails
            configs = (("global stats, cold", "global", False, True),
                       ("global stats, cached", "global", True, True),
                       ("global stats, cached, no hedging", "global", True, False),
                       ("per-shard scoring", "local", False, True),
                       ("per-shard scoring, no hedging", "local", False, False))
            measured: dict[str, list[tuple[float, list[float], float, float]]] = {
                c[0]: [] for c in configs}
            nodes = [cluster.procs[f"n{n}"].pid for n in range(1, 5)]
            for _ in range(args.rounds):
                for label, scoring, warm, hedge in configs:
                    async with SearchClient.open(session, scoring=scoring) as client:
                        if not hedge:
                            client.hedge_floor = client.hedge_max = client.shard_timeout
                        await client.wait_routable("docs", 2)
                        if warm:
                            await scatter(client, queries, args.concurrency)
                        node_cpu, own_cpu = cpu_seconds(nodes), time.process_time()
                        qps, lat, bad = await scatter(client, queries, args.concurrency)
                        node_cpu = (cpu_seconds(nodes) - node_cpu) / len(queries)
                        own_cpu = (time.process_time() - own_cpu) / len(queries)
                    if bad:
                        print(f"warning: {bad} partial results ({label})", file=sys.stderr)
                    measured[label].append((qps, lat, node_cpu, own_cpu))
            for label, runs in measured.items():
                qps = statistics.median(r[0] for r in runs)
                p50 = statistics.median(pct(r[1], .5) for r in runs)
                p99 = statistics.median(pct(r[1], .99) for r in runs)
                rows.append(Row(f"queries/s, 8 shards ({label}) vs one index", "q/s",
                                round(qps1, 1), round(qps, 1)))
                rows.append(Row(f"latency p50 ({label})", "ms", round(pct(lat1, .5) * 1e3, 3),
                                round(p50 * 1e3, 3)))
                rows.append(Row(f"latency p99 ({label})", "ms", round(pct(lat1, .99) * 1e3, 3),
                                round(p99 * 1e3, 3)))
                rows.append(Row(f"CPU per query, nodes ({label})", "ms", None,
                                round(statistics.median(r[2] for r in runs) * 1e3, 3)))
                rows.append(Row(f"CPU per query, client ({label})", "ms", round(cpu1 * 1e3, 3),
                                round(statistics.median(r[3] for r in runs) * 1e3, 3)))
            await cluster.kill9("n2")
            killed = time.perf_counter()
            await wait_replicated(session, "docs", 2, exclude={"n2"})
            rows.append(Row("node kill -9 -> every shard 2 serving replicas", "s", None,
                            round(time.perf_counter() - killed, 3)))
            leader = await active_master(session)
            await cluster.kill9(leader or "m1")
            killed = time.perf_counter()
            await wait_new_master(session, leader)
            rows.append(Row("master kill -9 -> new leader", "s", None,
                            round(time.perf_counter() - killed, 3)))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--docs", type=int, default=5000)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=4)
    args = parser.parse_args()
    configure_logging(level="warning")
    with zookeeper() as hosts:
        rows = trio.run(bench, args, hosts)
    if args.json:
        print(json.dumps([r.to_json() for r in rows], indent=2))
    else:
        print(f"{'workload':58} {'unit':>4} {'baseline':>10} {'ours':>10} {'ratio':>8}")
        for r in rows:
            print(f"{r.workload:58} {r.unit:>4} {r.baseline if r.baseline is not None else '-':>10}"
                  f" {r.ours if r.ours is not None else '-':>10} "
                  f"{r.ratio if r.ratio is not None else '-':>8}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
