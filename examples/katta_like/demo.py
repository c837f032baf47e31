"""``make demo-katta``: build an index as a job, serve it replicated, search it under load
while a node is killed with ``kill -9``, another frozen with SIGSTOP, the active master
killed with ``kill -9``, and a new node joins.

1. ZooKeeper: embedded standalone server (or ``$FRAMEWORK_ZK_HOSTS`` in a fresh chroot);
2. corpus: ``out/warc`` if the crawl demo ran, otherwise a generated deterministic corpus;
3. 2 masters and 4 search nodes (``python -m framework run``), each its own process;
4. index ``docs-v1``: 8 shards x 2 replicas, built as a job by the nodes, then deployed;
   alias ``docs`` -> ``docs-v1``;
5. a query load runs throughout (each answer checked against one tantivy index over the
   whole corpus) while the demo kills one node (kill -9), waits until every shard has 2
   serving replicas again, freezes another node (SIGSTOP) until its shards are
   re-replicated and resumes it (SIGCONT), kills the active master (kill -9), and starts a
   fifth node;
6. summary: queries sent / answered / failed / partial, hit counts vs the single index,
   ranking overlap, recovery times, the slowest query during each fault.  Exit status 0
   only when every check holds.

Output in ``out/katta/``: ``logs/`` (every process), ``store/`` (the shard store),
``nodes/`` (the nodes' local copies), ``summary.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import sys
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import trio

from examples.katta_like.client import SearchClient
from examples.katta_like.cluster import Cluster, active_master, wait_new_master, wait_serving
from examples.katta_like.corpus import CorpusSource, CorpusSpec, sample_queries
from examples.katta_like.ctl import (
    add_index,
    gather_status,
    set_alias,
    wait_balanced,
    wait_replicated,
    wait_state,
)
from examples.katta_like.layout import IndexRecord, IndexState
from examples.katta_like.load import LoadStats, reference, run_load
from framework import FrameworkError, Session, ZooKeeperEnsemble, configure_logging, records
from framework.cli import run_command

#: The slowest query allowed while a node is killed or frozen (the client hedges).
WORST_MS = 250.0


class DemoFailed(FrameworkError):
    """The demo could not go on (the message says why)."""


@contextlib.asynccontextmanager
async def zookeeper() -> AsyncIterator[tuple[str, str | None]]:
    hosts = os.environ.get("FRAMEWORK_ZK_HOSTS")
    if hosts:
        chroot = f"/katta-demo-{uuid.uuid4().hex[:8]}"
        print(f"ZooKeeper: {hosts} (chroot {chroot})", flush=True)
        try:
            yield hosts, chroot
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(10):
                async with Session(hosts) as session:
                    with contextlib.suppress(FrameworkError):
                        await session.delete_tree(chroot)
        return
    server = ZooKeeperEnsemble(1)
    server.start()
    try:
        print(f"ZooKeeper: embedded standalone server at {server.connect_string}", flush=True)
        yield server.connect_string, None
    finally:
        server.stop()


def say(start: float, text: str) -> None:
    print(f"[{time.monotonic() - start:6.1f}s] {text}", flush=True)


async def bounded(what: str, seconds: float, work: Any) -> Any:
    with trio.move_on_after(seconds):
        return await work
    raise DemoFailed(f"{what} did not happen within {seconds:g}s (see out/katta/logs/)")


async def demo(args: argparse.Namespace) -> dict[str, Any]:
    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    t0 = time.monotonic()
    warc = Path("out/warc")
    if not args.generated and warc.is_dir() and any(warc.glob("*.warc*")):
        corpus = CorpusSpec(CorpusSource.WARC, warc_dir=str(warc.resolve()))
    else:
        corpus = CorpusSpec(CorpusSource.GENERATED, docs=args.docs, seed=11)
    queries = sample_queries(corpus, args.queries)
    summary: dict[str, Any] = {"corpus": records.unstructure(corpus), "shards": args.shards,
                               "replication": 2}
    async with zookeeper() as (hosts, chroot):
        async with Cluster(hosts, chroot, out, session_timeout=args.session_timeout) as cluster:
            for m in ("master-1", "master-2"):
                await cluster.start_master(m)
            nodes = [f"node-{i}" for i in range(1, 5)]
            for n in nodes:
                await cluster.start_node(n)
            say(t0, "started 2 masters and 4 search nodes")
            expected = await trio.to_thread.run_sync(
                reference, corpus, out, list(dict.fromkeys(queries)), 10)
            say(t0, f"reference: one tantivy index over the corpus ({corpus.source.value}), "
                    f"{len(set(queries))} distinct queries")
            async with Session(hosts, chroot=chroot) as session:
                record = IndexRecord("docs-v1", args.shards, 2, str((out / "store").resolve()),
                                     corpus)
                built = time.monotonic()
                await add_index(session, record)
                state = await bounded("index build", 60, wait_state(
                    session, "docs-v1", (IndexState.DEPLOYED, IndexState.ERROR)))
                if state.state is IndexState.ERROR:
                    raise DemoFailed(f"index build failed: {state.error}")
                await bounded("deployment", 30, wait_replicated(session, "docs-v1", 2))
                summary["build_and_deploy_s"] = round(time.monotonic() - built, 2)
                await set_alias(session, "docs", "docs-v1")
                say(t0, f"index docs-v1 built as a job and deployed: {args.shards} shards x 2 "
                        f"replicas in {summary['build_and_deploy_s']}s; alias docs -> docs-v1")
                stats = LoadStats()
                stop = trio.Event()
                windows: dict[str, tuple[float, float]] = {}  # fault -> (start, recovered)
                async with SearchClient.open(session, shard_timeout=1.0,
                                             scoring=args.scoring) as client, \
                        trio.open_nursery() as nursery:
                    nursery.start_soon(run_load, client, queries, expected, stats, stop)
                    await bounded("first queries", 20, stats.wait_done(50))
                    say(t0, f"query load running ({stats.sent} sent)")
                    calm = time.monotonic()
                    await trio.sleep(2.0)  # a window with no fault, to compare with
                    windows["no fault (2 s before the first)"] = (calm, time.monotonic())
                    # 1. kill -9 a search node
                    victim = "node-2"
                    await cluster.kill9(victim)
                    killed = time.monotonic()
                    say(t0, f"kill -9 {victim}")
                    await bounded("re-replication", 60, wait_replicated(
                        session, "docs-v1", 2, exclude={victim}))
                    summary["node_kill_to_full_replication_s"] = round(
                        time.monotonic() - killed, 2)
                    say(t0, "every shard has 2 serving replicas again after "
                            f"{summary['node_kill_to_full_replication_s']}s")
                    windows["kill -9 of a node"] = (killed, time.monotonic())
                    # 2. freeze a search node (SIGSTOP): its session expires, its shards
                    # are re-replicated; then it resumes (SIGCONT) with a new session
                    frozen = "node-3"
                    cluster.procs[frozen].pause()
                    stopped = time.monotonic()
                    say(t0, f"SIGSTOP {frozen}")
                    await bounded("re-replication", 60, wait_replicated(
                        session, "docs-v1", 2, exclude={victim, frozen}))
                    summary["node_freeze_to_full_replication_s"] = round(
                        time.monotonic() - stopped, 2)
                    cluster.procs[frozen].resume()
                    say(t0, "every shard has 2 serving replicas again after "
                            f"{summary['node_freeze_to_full_replication_s']}s; "
                            f"SIGCONT {frozen}")
                    await bounded(f"{frozen} serving again", 60,
                                  wait_serving(session, frozen))
                    windows["SIGSTOP of a node"] = (stopped, time.monotonic())
                    # 2. kill -9 the active master, then a new node joins
                    leader = await active_master(session)
                    await cluster.kill9(leader or "master-1")
                    killed = time.monotonic()
                    say(t0, f"kill -9 the active master {leader}")
                    await cluster.start_node("node-5")
                    say(t0, "node-5 joins")
                    successor = await bounded("master failover", 60,
                                              wait_new_master(session, leader))
                    summary["master_failover_s"] = round(time.monotonic() - killed, 2)
                    say(t0, f"{successor} leads after {summary['master_failover_s']}s")
                    await bounded("node-5 serving", 60, wait_serving(session, "node-5"))
                    plan = await bounded("rebalance", 60, wait_balanced(session, "docs-v1"))
                    summary["master_kill_to_rebalanced_s"] = round(time.monotonic() - killed, 2)
                    windows["kill -9 of the master"] = (killed, time.monotonic())
                    on_new = sum("node-5" in nodes for nodes in plan.values())
                    summary["replicas_on_new_node"] = on_new
                    say(t0, f"rebalanced: node-5 serves {on_new} shards, every shard has 2 "
                            "serving replicas, loads within one "
                            f"({summary['master_kill_to_rebalanced_s']}s after the kill)")
                    await bounded("more queries", 20, stats.wait_done(stats.sent + 50))
                    stop.set()
                status = await gather_status(session)
    summary |= {
        "queries_sent": stats.sent, "answered": stats.answered, "failed": stats.failed,
        "partial": stats.partial, "hit_count_mismatches": stats.wrong_counts,
        "replica_retries": stats.retries,
        "scoring": args.scoring,
        "ranking_overlap_at_10": round(stats.overlap, 4),
        "top10_correct_with_ties": round(stats.correct, 4),
        "latency_p50_ms": round(stats.percentile(0.5) * 1000, 2),
        "latency_p99_ms": round(stats.percentile(0.99) * 1000, 2),
        "worst_query_ms_per_fault": {
            fault: round(stats.worst_between(start, end) * 1000, 1)
            for fault, (start, end) in windows.items()},
        "worst_query_ms_first_second_of_fault": {
            fault: round(stats.worst_between(start, min(end, start + 1.0)) * 1000, 1)
            for fault, (start, end) in windows.items()},
        "worst_query_began_s_after_fault": {
            fault: round(stats.worst_at(start, end), 2)
            for fault, (start, end) in windows.items()},
        "under_replicated_at_end": list(status.under_replicated),
        "errors": stats.errors[:5],
        "seconds": round(time.monotonic() - t0, 1),
    }
    checks = {
        "no failed query": stats.failed == 0,
        "no partial result": stats.partial == 0,
        "hit counts equal the single index": stats.wrong_counts == 0 and stats.answered > 0,
        "every query answered": stats.answered == stats.sent,
        "merged top 10 correct vs one index (global scoring)":
            args.scoring != "global" or stats.correct >= 0.999,
        "fully replicated at the end": not status.under_replicated,
        "the new node took a fair share": summary.get("replicas_on_new_node", 0) >= 3,
        f"slowest query under a node kill or freeze < {WORST_MS:g} ms": all(
            summary["worst_query_ms_per_fault"].get(f, math.inf) < WORST_MS
            for f in ("kill -9 of a node", "SIGSTOP of a node")),
    }
    summary["checks"] = checks
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="demo-katta", description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="out/katta")
    parser.add_argument("--docs", type=int, default=5000, help="generated corpus size")
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--session-timeout", type=float, default=4.0)
    parser.add_argument("--scoring", choices=("global", "local"), default="global",
                        help="global term statistics (Katta's way) or each shard's own")
    parser.add_argument("--generated", action="store_true",
                        help="use the generated corpus even when out/warc exists")
    args = parser.parse_args(argv)
    configure_logging(level=os.environ.get("FRAMEWORK_LOG_LEVEL") or "warning")

    def go(args: argparse.Namespace) -> int:
        summary = trio.run(demo, args)
        print(json.dumps({k: v for k, v in summary.items() if k != "corpus"}, indent=2))
        ok = all(summary["checks"].values())
        print("slowest query per fault (whole window / first second / began after):")
        for fault, worst in summary["worst_query_ms_per_fault"].items():
            print(f"  {fault}: {worst:g} ms / "
                  f"{summary['worst_query_ms_first_second_of_fault'][fault]:g} ms / "
                  f"{summary['worst_query_began_s_after_fault'][fault]:g} s")
        for name, passed in summary["checks"].items():
            print(f"  [{'ok' if passed else 'FAILED'}] {name}")
        print("demo-katta: " + ("all checks hold" if ok else "SOME CHECKS FAILED"))
        return 0 if ok else 1

    return run_command("demo-katta", go, args)


if __name__ == "__main__":
    sys.exit(main())
