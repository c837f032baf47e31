"""``ShardSearcher``: an opened shard of the store, and :func:`search_shards`: the best hits
of several shards of one index, scored as one index over the whole corpus would.

Guarantees:

* **Exact global scores.**  With :class:`GlobalStats` (the whole index's term statistics)
  every term query's part of a hit's score is recomputed with the global document
  frequencies and field lengths from tantivy's BM25 explanation; other clauses keep their
  local part, and a query with a boost ``^`` keeps every local score.
* **The best hits of the shards together.**  :func:`search_shards` returns, for each shard,
  its match count and those of its hits that are among the best ``top`` of all the shards
  asked: a hit among the best ``top`` of the whole index is among the best of any set of
  shards holding it, so merging the answers of any grouping of shards (a node's, a
  hedge's) gives the whole index's best ``top``.
* **Exact, not a fixed pool.**  Candidates are re-scored best bound first, across the
  shards, until no candidate left can enter the top (see :func:`search_shards`).
"""

from __future__ import annotations

import heapq
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import tantivy

from examples.katta_like.store import (
    DEFAULT_FIELDS,
    GlobalStats,
    Manifest,
    ShardHit,
    ShardResult,
    ShardStats,
    query_terms,
)

_FIELD_IDS = {1: "title", 2: "body"}  # schema order: url=0, title=1, body=2


class ShardSearcher:
    """An opened shard: answers queries (blocking calls).  Opening raises
    :class:`~examples.katta_like.store.CorruptShard` if the manifest is unreadable,
    ``ValueError``/``OSError`` if tantivy cannot open the directory."""

    #: With global statistics, candidates are fetched this many per requested hit at
    #: first (more, page by page, while one not re-scored could still make the top).
    POOL = 2

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.manifest = Manifest.load(directory)
        self.index = tantivy.Index.open(str(directory))
        self.searcher = self.index.searcher()

    def search(self, query: str, top: int, stats: GlobalStats | None = None) -> ShardResult:
        """This shard alone: its match count and best ``top`` hits (:func:`search_shards`);
        ``ValueError`` on bad syntax.  Without ``stats``, tantivy's search as it is (one
        index: the bench's baseline)."""
        if stats is None:
            parsed = self.index.parse_query(query, list(DEFAULT_FIELDS))
            result = self.searcher.search(parsed, top, count=True)
            return ShardResult(result.count, self._hits(result.hits))
        return search_shards({0: self}, query, top, stats)[0]

    def _hits(self, scored: list[tuple[float, Any]]) -> tuple[ShardHit, ...]:
        hits = []
        for score, address in scored:
            stored = self.searcher.doc(address)
            hits.append(ShardHit(float(score), stored.get_first("url"),
                                 stored.get_first("title") or ""))
        return tuple(hits)

    def _global_order(self, shape: str, stats: GlobalStats
                      ) -> tuple[tantivy.Query, float] | None:
        """For a query (its ``repr``: ``shape``) that is a disjunction of term queries
        over the default fields, each known to ``stats`` if it occurs in this shard: the
        same disjunction with each term query boosted by ``idf_g/idf_l`` (the same
        documents match), and a bound of (global score / its score).  A term's global part
        is ``idf_g/idf_l`` times its local part times a factor between 1 and
        ``avgdl_g/avgdl_l`` (see :meth:`_ratio_bound`), so the bound is the largest such
        factor, padded by 1e-4 for tantivy's 32-bit floats.  ``None`` for another query.
        Re-scoring in this order needs few candidates beyond ``top`` whatever the terms'
        idf ratios (a frequent word's, near 0 locally, made the local order's bound large)."""
        if "Must" in shape or any(n != "1" for n in _SHOULD_MATCH.findall(shape)):
            return None  # not a disjunction (a Should clause alone: min 1 in the parser)
        docs = self.searcher.num_docs
        schema = self.index.schema
        clauses = []
        factor = 1.0
        for _negated, field_id, term in _QUERY_TERM.findall(shape):
            field = _FIELD_IDS.get(int(field_id))
            if field is None:
                return None
            clause = tantivy.Query.term_query(schema, field, term)
            local_n = self.searcher.doc_freq(field, term)
            if local_n:  # else it matches nothing here: its weight does not matter
                global_n = stats.df.get(f"{field}:{term}")
                if global_n is None or not stats.docs:
                    return None
                tokens = self.manifest.tokens.get(field)
                local_avgdl = tokens / docs if tokens and docs else 0.0
                global_avgdl = stats.avgdl.get(field) or local_avgdl
                factor = max(factor, global_avgdl / local_avgdl if local_avgdl else 1.0)
                clause = tantivy.Query.boost_query(
                    clause, _idf(stats.docs, global_n) / _idf(docs, local_n))
            clauses.append((tantivy.Occur.Should, clause))
        if not clauses:
            return None
        return tantivy.Query.boolean_query(clauses), factor * (1 + 1e-4)

    def _ratio_bound(self, shape: str, stats: GlobalStats, pure: bool) -> float:
        """An upper bound of (global score / local score) of any document for the query
        whose ``repr`` is ``shape``: a term's part is (K1+1) idf tf/(tf + k1 (1-b+b dl/avgdl));
        idf_g/idf_l is known, and tf/(tf+K) with another avgdl changes by a factor between
        1 and avgdl_g/avgdl_l (for any tf, dl).  A clause that is not a re-scored term
        query counts 1.  Padded by 1e-4 for tantivy's 32-bit floats."""
        docs = self.searcher.num_docs
        ratios = [] if pure else [1.0]
        for negated, field_id, term in _QUERY_TERM.findall(shape):
            field = _FIELD_IDS.get(int(field_id))
            if negated:
                continue
            if field is None:
                ratios.append(1.0)
                continue
            local_n = self.searcher.doc_freq(field, term)
            global_n = stats.df.get(f"{field}:{term}")
            if not local_n:
                continue  # no document of this shard has it
            if global_n is None or not stats.docs:
                ratios.append(1.0)
                continue
            idf = _idf(stats.docs, global_n) / _idf(docs, local_n)
            tokens = self.manifest.tokens.get(field)
            local_avgdl = tokens / docs if tokens and docs else 0.0
            global_avgdl = stats.avgdl.get(field) or local_avgdl
            lengths = global_avgdl / local_avgdl if local_avgdl else 1.0
            ratios.append(idf * max(1.0, lengths))
        return max(ratios, default=1.0) * (1 + 1e-4)

    def stats(self, query: str) -> ShardStats:
        """This shard's part of the global statistics for ``query`` (see GlobalStats)."""
        return ShardStats(self.searcher.num_docs, self.manifest.tokens,
                          {f"{f}:{t}": self.searcher.doc_freq(f, t)
                           for f, t in query_terms(query)})



@attrs.define(eq=False)
class _Candidates:
    """One shard's candidates for re-scoring, in the order of ``ordering`` (whose score
    times ``bound`` is at least the global score), fetched page by page."""

    shard: int
    searcher: ShardSearcher
    parsed: tantivy.Query  # the query as asked (explained)
    ordering: tantivy.Query
    bound: float
    pure: bool
    local: bool  # ``ordering`` is ``parsed``: its score is the local score
    limit: int
    count: int = 0
    offset: int = 0
    page: list[tuple[float, Any]] = attrs.Factory(list)
    position: int = 0
    last: bool = False  # the page is the last one

    def head(self) -> tuple[float, Any] | None:
        """The next candidate (its score in ``ordering``, its address), or ``None``."""
        if self.position >= len(self.page):
            if self.last and self.offset:
                return None
            result = self.searcher.searcher.search(self.ordering, self.limit,
                                                   count=not self.offset, offset=self.offset)
            if not self.offset:
                self.count = result.count
            self.page, self.position = result.hits, 0
            self.last = len(self.page) < self.limit
            self.offset += self.limit
            self.limit *= 2
            if not self.page:
                return None
        return self.page[self.position]


def search_shards(shards: Mapping[int, ShardSearcher], query: str, top: int,
                  stats: GlobalStats | None = None) -> dict[int, ShardResult]:
    """Shard -> its match count and those of its hits among the best ``top`` of all
    ``shards`` (best first); ``ValueError`` on bad syntax.

    Without ``stats`` (or for a query with a boost) the scores are each shard's own BM25.
    With ``stats`` every candidate is re-scored (see the module docstring); a shard's
    candidates come in the order of a query whose score times a bound is at least the
    global score - for a disjunction of term queries :meth:`ShardSearcher._global_order`
    (the bound is the field-length factor, about 1), for another query the local order
    with :meth:`ShardSearcher._ratio_bound` - and the candidate with the highest bound of
    all the shards is re-scored next, until the ``top``-th global score is above every
    bound left.  Among equal scores at the cut, the one re-scored first is kept.  The
    query is parsed once, by the first shard: the shards of an index share its schema."""
    if not shards:
        return {}
    plans: list[_Candidates] = []
    local: list[tuple[float, int, int, Any]] = []  # (score, -order, shard, address)
    counts: dict[int, int] = {}
    parsed = next(iter(shards.values())).index.parse_query(query, list(DEFAULT_FIELDS))
    shape = repr(parsed)
    pure = _only_terms(shape)
    for shard, searcher in shards.items():
        if stats is None or "Boost(" in shape:
            result = searcher.searcher.search(parsed, top, count=True)
            counts[shard] = result.count
            for score, address in result.hits:
                local.append((float(score), -len(local), shard, address))
            continue
        order = searcher._global_order(shape, stats) if pure else None
        ordering, bound = order or (parsed, searcher._ratio_bound(shape, stats, pure))
        plans.append(_Candidates(shard, searcher, parsed, ordering, bound, pure,
                                 order is None, max(top * searcher.POOL, 1)))
    if plans:
        assert stats is not None
        best = _rescored(plans, top, stats)
        counts.update((plan.shard, plan.count) for plan in plans)
    else:
        best = heapq.nlargest(top, local)
    chosen: dict[int, list[tuple[float, Any]]] = {shard: [] for shard in shards}
    for score, _, shard, address in sorted(best, reverse=True):
        chosen[shard].append((score, address))
    return {shard: ShardResult(counts[shard], shards[shard]._hits(chosen[shard]))
            for shard in shards}


def _rescored(plans: list[_Candidates], top: int, stats: GlobalStats
              ) -> list[tuple[float, int, int, Any]]:
    """The best ``top`` candidates of ``plans`` with their global scores, as
    ``(score, -order, shard, address)`` (see :func:`search_shards`)."""
    best: list[tuple[float, int, int, Any]] = []  # min-heap
    bounds: list[tuple[float, int, _Candidates]] = []  # max-heap by bound (negated)
    for n, plan in enumerate(plans):
        head = plan.head()
        if head is not None:
            bounds.append((-head[0] * plan.bound, n, plan))
    heapq.heapify(bounds)
    rank = 0
    while bounds:
        negated, n, plan = bounds[0]
        if len(best) >= top and best[0][0] > -negated:
            break  # no candidate left can enter
        score, address = plan.page[plan.position]
        text = plan.parsed.explain(plan.searcher.searcher, address).to_json()
        rank += 1
        entry = (_rescore(text, float(score) if plan.local else None, stats, plan.pure),
                 -rank, plan.shard, address)
        if len(best) < top:
            heapq.heappush(best, entry)
        elif entry > best[0]:
            heapq.heapreplace(best, entry)
        plan.position += 1
        head = plan.head()
        if head is None:
            heapq.heappop(bounds)
        else:
            heapq.heapreplace(bounds, (-head[0] * plan.bound, n, plan))
    return best


def _idf(docs: int, n: int) -> float:
    return math.log(1 + (docs - n + 0.5) / (n + 0.5))


#: The minimum number of Should clauses to match of each boolean query in a ``repr``.
_SHOULD_MATCH = re.compile(r"minimum_number_should_match: (\d+)")
#: A term query in a parsed query's ``repr`` (``MustNot`` ones never score).
_QUERY_TERM = re.compile(r'(MustNot, )?TermQuery\(Term\(field=(\d+), type=Str, "([^"\\]*)"\)\)')
#: What a ``repr`` of a query made of boolean and term queries only holds besides terms.
_BOOLEAN_SHAPE = re.compile(
    r"(?:Query|BooleanQuery|subqueries|Should|Must|MustNot|minimum_number_should_match"
    r"|\d+|[\s(){}\[\]:,])*")
#: The pieces of tantivy's BM25 explanation (its JSON text) a term query's part is
#: recomputed from, in the order tantivy writes them: the part's value, (K1+1), freq, k1, b,
#: dl, avgdl (each a value and the start of its description), then the term.
_PIECE = re.compile(
    r'"value": ([^,\s]+),\s*"description": "(TermQuery|\(K1\+1\)|freq,|k1,|b,|dl,|avgdl,)'
    r'|"Term=Term\(field=(\d+), type=Str, \\"([^"\\]*)\\"\)"')
#: The explanation's own value (the score it explains), at the start of its text.
_TOP_VALUE = re.compile(r'\s*\{\s*"value": ([^,\s]+)')
_TERM_PIECES = ("TermQuery", "(K1+1)", "freq,", "k1,", "b,", "dl,", "avgdl,")


def _only_terms(shape: str) -> bool:
    """Whether a query (its ``repr``) is boolean and term queries only: its score is the
    sum of its term queries' parts."""
    return _BOOLEAN_SHAPE.fullmatch(_QUERY_TERM.sub("", shape)) is not None


def _rescore(text: str, local: float | None, stats: GlobalStats, pure: bool) -> float:
    """A document's score with global statistics, from tantivy's BM25 explanation of its
    ``local`` score (``text``, its JSON: tantivy's format, read where it is parsed, not a
    record of ours; see docs/architecture.md, "Katta-like search"; ``None``: read from the
    explanation).  Each term query's part is recomputed; for a ``pure`` query (terms only)
    the score is their sum, otherwise the other clauses keep their local part (``local``
    minus the term parts)."""
    if local is None and not pure:
        local = _explained(text)
    total, rest, rescored = 0.0, local or 0.0, False
    values: dict[str, float] = {}
    for value, what, field_id, term in _PIECE.findall(text):
        if what:
            if what == "TermQuery":
                values = {}
            values[what] = float(value)
            continue
        field = _FIELD_IDS.get(int(field_id))
        n = stats.df.get(f"{field}:{term}") if field else None
        if field is None or n is None or not stats.docs or len(values) != len(_TERM_PIECES):
            continue  # kept in ``rest``
        part, k1_plus_1, freq, k1, b, dl, local_avgdl = (values[p] for p in _TERM_PIECES)
        avgdl = stats.avgdl.get(field) or local_avgdl
        total += k1_plus_1 * _idf(stats.docs, n) * freq / (freq + k1 * (1 - b + b * dl / avgdl))
        rest -= part
        rescored = True
    if pure:
        rest = 0.0
    if not rescored:
        return local if local is not None else _explained(text)
    return total + rest


def _explained(text: str) -> float:
    """The score an explanation (its JSON text) explains: its first value."""
    top = _TOP_VALUE.match(text)
    return float(top.group(1)) if top else 0.0
