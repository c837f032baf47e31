"""A query load that checks every answer against one tantivy index over the whole corpus."""

from __future__ import annotations

import time
from pathlib import Path

import attrs
import trio

from examples.katta_like.client import SearchClient
from examples.katta_like.corpus import CorpusSpec, documents
from examples.katta_like.searcher import ShardSearcher
from examples.katta_like.store import ShardStore
from framework import get_logger

log = get_logger("examples.katta_like.load")


@attrs.frozen
class Expected:
    """What one tantivy index over the whole corpus answers to a query."""

    count: int
    urls: list[str]  # its top K
    kth_score: float  # the K-th best score (ties at the cut make several top Ks correct)
    scores: dict[str, float]  # url -> score, for the best 10 * K

    def overlap(self, urls: list[str]) -> float:
        """Fraction of its top K that ``urls`` (a merged top K) contains."""
        return len(set(urls) & set(self.urls)) / len(self.urls) if self.urls else 1.0

    def correct(self, urls: list[str]) -> float:
        """Fraction of ``urls`` that belong in a top K (score at least the K-th, so ties
        broken another way count as correct)."""
        if not urls:
            return 1.0 if not self.urls else 0.0
        return sum(self.scores.get(u, -1.0) >= self.kth_score - 1e-4 for u in urls) / len(urls)


def reference(spec: CorpusSpec, workdir: Path, queries: list[str], top: int
              ) -> dict[str, Expected]:
    """query -> what a single index over the whole corpus answers."""
    store = ShardStore(workdir / "reference")
    store.build_shard("all", 0, documents(spec))
    searcher = ShardSearcher(store.shard_path("all", 0))
    out = {}
    for q in queries:
        answer = searcher.search(q, top * 10)
        hits = answer.hits
        kth = hits[min(top, len(hits)) - 1].score if hits else 0.0
        out[q] = Expected(answer.count, [h.url for h in hits[:top]], kth,
                          {h.url: h.score for h in hits})
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
    correct_sum: float = 0.0
    latencies: list[float] = attrs.Factory(list)
    started: list[float] = attrs.Factory(list)  # time.monotonic() at each query's start
    errors: list[str] = attrs.Factory(list)
    _progress: trio.Event = attrs.Factory(trio.Event)

    async def wait_done(self, count: int) -> None:
        """Wait until ``count`` queries have been sent and have ended (whatever the end)."""
        while self.answered + self.failed + self.partial < count:
            await self._progress.wait()

    def _ended(self) -> None:
        self._progress.set()
        self._progress = trio.Event()

    @property
    def overlap(self) -> float:
        """Mean overlap of the merged top K with the single index's top K."""
        return self.overlap_sum / self.answered if self.answered else 0.0

    @property
    def correct(self) -> float:
        """Mean fraction of merged hits that belong in the single index's top K (ties)."""
        return self.correct_sum / self.answered if self.answered else 0.0

    def worst_between(self, start: float, end: float) -> float:
        """The longest latency of the queries that ran at some point in ``[start, end]``
        (``time.monotonic()`` seconds)."""
        return max((lat for at, lat in zip(self.started, self.latencies, strict=True)
                    if at <= end and at + lat >= start), default=0.0)

    def worst_at(self, start: float, end: float) -> float:
        """When (seconds after ``start``) the query of :meth:`worst_between` began."""
        ran = [(lat, at) for at, lat in zip(self.started, self.latencies, strict=True)
               if at <= end and at + lat >= start]
        return max(ran)[1] - start if ran else 0.0

    def percentile(self, p: float) -> float:
        if not self.latencies:
            return 0.0
        values = sorted(self.latencies)
        return values[min(len(values) - 1, int(p * len(values)))]


async def run_load(client: SearchClient, queries: list[str],
                   expected: dict[str, Expected], stats: LoadStats,
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
            began = time.monotonic()
            try:
                result = await client.search(query, index=index, top=top)
            except Exception as exc:  # counted and reported, never hidden
                stats.failed += 1
                stats._ended()
                stats.errors.append(f"{query!r}: {exc!r}"[:300])
                log.warning("katta.query_failed", query=query, error=repr(exc))
                continue
            stats.latencies.append(time.perf_counter() - started)
            stats.started.append(began)
            stats.retries += result.retries
            if result.partial:
                stats.partial += 1
                stats._ended()
                log.warning("katta.query_partial", query=query, missing=result.missing)
                continue
            stats.answered += 1
            stats._ended()
            want = expected[query]
            if result.count != want.count:
                stats.wrong_counts += 1
            got = [h.url for h in result.hits]
            stats.overlap_sum += want.overlap(got)
            stats.correct_sum += want.correct(got)
            await trio.lowlevel.checkpoint()

    async with trio.open_nursery() as nursery:
        for k in range(concurrency):
            nursery.start_soon(one_client, k)
