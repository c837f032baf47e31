"""Pure functions of the crawl: per-host batches, the records fetchers return, statistics.

Nothing here talks to ZooKeeper or the network, so it is deterministic: a master that takes
over and plans a level again from the same inputs gets the same batches, in the same order,
with the same task ids.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from itertools import zip_longest
from typing import Any

from examples.fetch_service.fetch import FetchOutcome
from examples.fetch_service.links import host_key
from examples.fetch_service.state import Batch, LevelPlan

__all__ = [
    "batch_record",
    "found_links",
    "level_stats",
    "make_batches",
    "redirect_hops",
    "total_stats",
]

#: Error examples kept per level (the counts by kind are complete).
SAMPLES_PER_LEVEL = 20


def make_batches(urls: Iterable[str], batch_size: int, *, id_prefix: str) -> tuple[Batch, ...]:
    """Split ``urls`` into batches of at most ``batch_size`` URLs of one host each.

    Hosts take turns in the result (first batch of every host, then the second...), so
    fetchers that take batches in queue order work on different hosts at once instead of
    queueing behind one host's politeness lock.  Batch ids are ``{id_prefix}-NNNNN``.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    by_host: dict[str, list[str]] = {}
    for url in sorted(set(urls)):
        by_host.setdefault(host_key(url), []).append(url)
    chunks = [
        [(host, group[i : i + batch_size]) for i in range(0, len(group), batch_size)]
        for host, group in sorted(by_host.items())
    ]
    ordered = [c for turn in zip_longest(*chunks) for c in turn if c is not None]
    return tuple(
        Batch(f"{id_prefix}-{n:05d}", host, group) for n, (host, group) in enumerate(ordered)
    )


def outcome_record(outcome: FetchOutcome) -> dict[str, Any]:
    """What a fetcher reports about one URL (small; never the body)."""
    record: dict[str, Any] = {"url": outcome.url, "status": outcome.status,
                              "responses": outcome.responses, "bytes": outcome.bytes}
    if outcome.redirects:
        record["hops"] = list(outcome.redirects)
    if outcome.error is not None:
        record["kind"] = outcome.error_kind
        record["error"] = outcome.error
    return record


def batch_record(depth: int, worker: str, outcomes: Sequence[FetchOutcome],
                 links: Sequence[str]) -> dict[str, Any]:
    """A fetcher's result for one batch: an outcome per URL and the new links it found."""
    return {"depth": depth, "worker": worker,
            "outcomes": [outcome_record(o) for o in outcomes], "links": list(links)}


def _records(results: Mapping[str, Any]) -> Iterable[dict[str, Any]]:
    for value in results.values():
        if isinstance(value, dict):
            yield from value.get("outcomes", ())


def redirect_hops(results: Mapping[str, Any]) -> set[str]:
    """Every URL that redirect chains of these batch results went through (beyond their
    first): they were requested, so they count as seen at the batch's depth."""
    return {hop for record in _records(results) for hop in record.get("hops", ())}


def found_links(results: Mapping[str, Any]) -> set[str]:
    return {link for value in results.values() if isinstance(value, dict)
            for link in value.get("links", ())}


def level_stats(plan: LevelPlan, results: Mapping[str, Any],
                failures: Mapping[str, str]) -> dict[str, Any]:
    """Statistics of a finished level.

    ``results``: batch id -> the fetcher's record, for batches that succeeded; ``failures``:
    batch id -> why the batch itself failed (its URLs count as ``task_failed`` errors).
    """
    errors: Counter[str] = Counter()
    samples: list[dict[str, Any]] = []
    ok = responses = size = 0
    for record in _records(results):
        responses += record.get("responses", 0)
        size += record.get("bytes", 0)
        if "error" in record:
            errors[record.get("kind") or "unknown"] += 1
            samples.append({"url": record["url"], "kind": record.get("kind"),
                            "error": record["error"]})
        else:
            ok += 1
    for batch in plan.batches:
        if batch.id in failures:
            errors["task_failed"] += len(batch.urls)
            samples.extend({"url": url, "kind": "task_failed", "error": failures[batch.id]}
                           for url in batch.urls)
    for invalid in plan.invalid:
        errors["invalid_url"] += 1
        samples.append({"url": invalid["url"], "kind": "invalid_url", "error": invalid["error"]})
    samples.sort(key=lambda s: (s["kind"] or "", s["url"]))
    return {"level": plan.level, "urls": plan.urls + len(plan.invalid), "ok": ok,
            "responses": responses, "bytes": size, "errors": dict(sorted(errors.items())),
            "samples": samples[:SAMPLES_PER_LEVEL], "failed_batches": len(failures),
            "cut": plan.cut}


def total_stats(levels: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Sum of per-level statistics (for the final report)."""
    errors: Counter[str] = Counter()
    samples: list[dict[str, Any]] = []
    totals = {"urls": 0, "ok": 0, "responses": 0, "bytes": 0, "failed_batches": 0, "cut": 0}
    for stats in levels:
        for key in totals:
            totals[key] += stats.get(key, 0)
        errors.update(stats.get("errors", {}))
        samples.extend(stats.get("samples", ()))
    return totals | {"errors": dict(sorted(errors.items())), "samples": samples[:100],
                     "levels": len(levels)}
