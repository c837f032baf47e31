"""A query load that checks every answer against one tantivy index over the whole corpus."""

from __future__ import annotations

import time
from pathlib import Path

import attrs
import trio

from examples.katta_like.client import SearchClient
from examples.katta_like.corpus import CorpusSpec, documents
from examples.katta_like.store import ShardSearcher, ShardStore
from framework import get_logger

log = get_logger("examples.katta_like.load")


def reference(spec: CorpusSpec, workdir: Path, queries: list[str], top: int
              ) -> dict[str, tuple[int, list[str]]]:
    """query -> (hit count, top-k urls) on a single index over the whole corpus."""
    store = ShardStore(workdir / "reference")
    store.build_shard("all", 0, documents(spec))
    searcher = ShardSearcher(store.shard_path("all", 0))
    out = {}
    for q in queries:
        answer = searcher.search(q, top)
        out[q] = (answer["count"], [url for _, url, _ in answer["hits"]])
    return out


@attrs.define
class LoadStats:
    sent: int = 0
    answered: int = 0
    failed: int = 0
    partial: int = 0
    wrong_counts: int = 0
    retries: int = 0
    overlap_sum: float = 0.0
    latencies: list[float] = attrs.Factory(list)
    errors: list[str] = attrs.Factory(list)

    @property
    def overlap(self) -> float:
        return self.overlap_sum / self.answered if self.answered else 0.0

    def percentile(self, p: float) -> float:
        if not self.latencies:
            return 0.0
        values = sorted(self.latencies)
        return values[min(len(values) - 1, int(p * len(values)))]


async def run_load(client: SearchClient, queries: list[str],
                   expected: dict[str, tuple[int, list[str]]], stats: LoadStats,
                   stop: trio.Event, *, index: str = "docs", top: int = 10,
                   concurrency: int = 2) -> None:
    """Send queries (``concurrency`` at a time) until ``stop`` is set, checking each."""

    async def one_client(offset: int) -> None:
        n = offset
        while not stop.is_set():
            query = queries[n % len(queries)]
            n += concurrency
            stats.sent += 1
            started = time.perf_counter()
            try:
                result = await client.search(query, index=index, top=top)
            except Exception as exc:  # counted and reported, never hidden
                stats.failed += 1
                stats.errors.append(f"{query!r}: {exc!r}"[:300])
                log.warning("katta.query_failed", query=query, error=repr(exc))
                continue
            stats.latencies.append(time.perf_counter() - started)
            stats.retries += result.retries
            if result.partial:
                stats.partial += 1
                log.warning("katta.query_partial", query=query, missing=result.missing)
                continue
            stats.answered += 1
            count, urls = expected[query]
            if result.count != count:
                stats.wrong_counts += 1
            got = [h.url for h in result.hits]
            stats.overlap_sum += (len(set(got) & set(urls)) / len(urls)) if urls else 1.0
            await trio.lowlevel.checkpoint()

    async with trio.open_nursery() as nursery:
        for k in range(concurrency):
            nursery.start_soon(one_client, k)
