"""The shard store: a directory every node can read (stands in for HDFS).

Layout::

    <store>/<index>/shard-00007/          one tantivy index directory per shard
    <store>/<index>/shard-00007/MANIFEST.json   Manifest: index, shard, docs, files, checksum

Guarantees:

* **No half shard is ever visible.**  A shard is built in ``<store>/<index>/.tmp-<uuid>``,
  its manifest written last, and the directory renamed into place (``rename`` is atomic on
  one file system).  A builder killed mid-build leaves only a ``.tmp-`` directory, which
  readers never look at.
* **Publishing is idempotent.**  If the shard is already published (a redelivered build
  task), the new copy is discarded and the published manifest is returned.
* **A corrupt shard is never served.**  :func:`fetch_shard` copies the shard to the node's
  own disk and checks every file against the manifest's SHA-256 before opening it;
  :class:`CorruptShard` says what is wrong.
"""

from __future__ import annotations

import hashlib
import heapq
import json
import math
import os
import re
import shutil
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import attrs
import tantivy

from examples.katta_like.corpus import Doc
from framework import records
from framework.durable import fsync_dir
from framework.errors import FrameworkError

MANIFEST = "MANIFEST.json"
#: The fields searched by default (``url`` is stored and matched exactly, never tokenized).
DEFAULT_FIELDS = ("title", "body")


class CorruptShard(FrameworkError):
    """A shard's files do not match its manifest (or the manifest is missing/unreadable)."""


def schema() -> tantivy.Schema:
    """url (raw, stored), title (text, stored), body (text, not stored)."""
    builder = tantivy.SchemaBuilder()
    builder.add_text_field("url", stored=True, tokenizer_name="raw")
    builder.add_text_field("title", stored=True)
    builder.add_text_field("body", stored=False)
    return builder.build()


def check_query(query: str) -> None:
    """Raise :class:`FrameworkError` (one line) if ``query`` is not valid tantivy syntax."""
    if not isinstance(query, str) or not query.strip():
        raise FrameworkError("empty query")
    try:
        _PARSER.parse_query(query, list(DEFAULT_FIELDS))
    except ValueError as exc:
        raise FrameworkError(f"bad query syntax: {exc}") from None


_PARSER = tantivy.Index(schema())  # in RAM, only used to check syntax

#: tantivy's "default" text analyzer (simple tokenizer, tokens over 40 bytes dropped,
#: lower-cased): used to count field lengths at build time and to find a query's terms.
ANALYZER = (tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.simple())
            .filter(tantivy.Filter.remove_long(40)).filter(tantivy.Filter.lowercase()).build())
_FIELD_IDS = {1: "title", 2: "body"}  # schema order: url=0, title=1, body=2
_OPERATORS = re.compile(r"\b(AND|OR|NOT)\b|\b(url|title|body):")


def query_terms(query: str) -> list[tuple[str, str]]:
    """The ``(field, term)`` pairs a query over the default fields can score (a superset:
    statistics of a term the query does not use are simply never needed)."""
    words = ANALYZER.analyze(_OPERATORS.sub(" ", query))
    return [(f, w) for w in dict.fromkeys(words) for f in DEFAULT_FIELDS]


@attrs.frozen
class ShardStats:
    """One shard's part of the global statistics of a query (the ``/stats`` answer):
    its documents, tokens per field, and document frequency per ``"field:term"``."""

    docs: int
    tokens: dict[str, int]
    df: dict[str, int]


@attrs.frozen
class GlobalStats:
    """Term statistics of a whole index (summed over its shards): total documents, average
    field lengths, document frequencies per ``"field:term"``."""

    docs: int
    avgdl: dict[str, float]
    df: dict[str, int]

    @classmethod
    def merge(cls, parts: list[ShardStats]) -> GlobalStats:
        """Sum the statistics of every shard."""
        docs = sum(p.docs for p in parts)
        tokens: dict[str, int] = {}
        df: dict[str, int] = {}
        for p in parts:
            for f, n in p.tokens.items():
                tokens[f] = tokens.get(f, 0) + n
            for k, n in p.df.items():
                df[k] = df.get(k, 0) + n
        return cls(docs, {f: n / docs if docs else 0.0 for f, n in tokens.items()}, df)


@attrs.frozen
class ShardHit:
    """One hit of a shard's answer."""

    score: float
    url: str
    title: str


@attrs.frozen
class ShardResult:
    """A shard's answer to a query (the ``/search`` answer): how many documents match,
    and its best hits, best first."""

    count: int
    hits: tuple[ShardHit, ...] = ()


@attrs.frozen
class Manifest:
    """``MANIFEST.json`` of a published shard (written last, see the module docstring)."""

    index: str
    shard: int
    docs: int
    files: dict[str, str]  # relative name -> sha256
    checksum: str  # sha256 over the sorted (name, sha256) pairs
    tokens: dict[str, int] = attrs.Factory(dict)  # field -> tokens in the shard (for avgdl)

    @classmethod
    def load(cls, directory: Path) -> Manifest:
        """The manifest of ``directory``; :class:`CorruptShard` if it is missing or not a
        manifest."""
        try:
            return records.decode((directory / MANIFEST).read_bytes(), cls)
        except (OSError, records.CorruptRecord) as exc:
            raise CorruptShard(f"{directory}: unreadable manifest ({exc})") from None


def shard_dir_name(shard: int) -> str:
    return f"shard-{shard:05d}"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as stream:
        while chunk := stream.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _digest_files(directory: Path) -> dict[str, str]:
    return {p.name: _sha256(p) for p in sorted(directory.iterdir())
            if p.is_file() and p.name != MANIFEST and not p.name.startswith(".")}


def _checksum(files: dict[str, str]) -> str:
    return hashlib.sha256(json.dumps(sorted(files.items())).encode()).hexdigest()


@attrs.frozen
class ShardStore:
    """A shard store rooted at ``root`` (created on demand)."""

    root: Path = attrs.field(converter=Path)

    def shard_path(self, index: str, shard: int) -> Path:
        return self.root / index / shard_dir_name(shard)

    def manifest(self, index: str, shard: int) -> Manifest | None:
        path = self.shard_path(index, shard)
        return Manifest.load(path) if path.is_dir() else None

    def build_shard(self, index: str, shard: int, docs: Iterable[Doc],
                    heap_bytes: int = 30_000_000) -> Manifest:
        """Index ``docs`` into shard ``shard`` of ``index`` and publish it atomically."""
        final = self.shard_path(index, shard)
        if final.is_dir():
            return Manifest.load(final)
        final.parent.mkdir(parents=True, exist_ok=True)
        temp = final.parent / f".tmp-{uuid.uuid4().hex}"
        temp.mkdir()
        try:
            ix = tantivy.Index(schema(), path=str(temp))
            writer = ix.writer(heap_bytes, 1)
            count = 0
            tokens = {"title": 0, "body": 0}
            for doc in docs:
                writer.add_document(tantivy.Document(url=doc.url, title=doc.title,
                                                     body=doc.body))
                tokens["title"] += len(ANALYZER.analyze(doc.title))
                tokens["body"] += len(ANALYZER.analyze(doc.body))
                count += 1
            writer.commit()
            writer.wait_merging_threads()
            del writer, ix
            (temp / ".tantivy-writer.lock").unlink(missing_ok=True)
            (temp / ".tantivy-meta.lock").unlink(missing_ok=True)
            files = _digest_files(temp)
            manifest = Manifest(index, shard, count, files, _checksum(files), tokens)
            (temp / MANIFEST).write_bytes(records.encode(manifest))
            fsync_dir(temp)
            try:
                os.rename(temp, final)
            except OSError:  # published meanwhile by another builder: keep theirs
                if final.is_dir():
                    shutil.rmtree(temp, ignore_errors=True)
                    return Manifest.load(final)
                raise
            fsync_dir(final.parent)
            return manifest
        except BaseException:
            shutil.rmtree(temp, ignore_errors=True)
            raise

    def remove_index(self, index: str) -> None:
        shutil.rmtree(self.root / index, ignore_errors=True)




def verify(directory: Path) -> Manifest:
    """Check every file of a shard directory against its manifest; return the manifest."""
    manifest = Manifest.load(directory)
    files = _digest_files(directory)
    if files != manifest.files or _checksum(files) != manifest.checksum:
        bad = sorted(n for n in set(files) | set(manifest.files)
                     if files.get(n) != manifest.files.get(n))
        raise CorruptShard(f"{directory}: checksum mismatch in {', '.join(bad) or 'manifest'}")
    return manifest


def reuse_local(store: ShardStore, index: str, shard: int, local_root: Path) -> bool:
    """Whether the local copy of a shard (kept from an earlier serving, say a pause or a
    restart of the node) can be served again: every file matches its manifest and the
    manifest is the store's.  A copy that does not is deleted (then fetch it again)."""
    target = local_root / index / shard_dir_name(shard)
    if not target.is_dir():
        return False
    try:
        source = store.manifest(index, shard)
        if source is not None and verify(target).checksum == source.checksum:
            return True
    except CorruptShard:
        pass
    shutil.rmtree(target, ignore_errors=True)
    return False


def fetch_shard(store: ShardStore, index: str, shard: int, local_root: Path) -> Path:
    """Copy a shard from the store to ``local_root`` (aside, verified, then renamed)."""
    source = store.shard_path(index, shard)
    if not source.is_dir():
        raise CorruptShard(f"shard {shard} of index {index!r} is not in the store {store.root}")
    target = local_root / index / shard_dir_name(shard)
    temp = local_root / index / f".tmp-{uuid.uuid4().hex}"
    temp.parent.mkdir(parents=True, exist_ok=True)
    try:
        shutil.copytree(source, temp)
        verify(temp)
        shutil.rmtree(target, ignore_errors=True)
        os.rename(temp, target)
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise
    return target


class ShardSearcher:
    """An opened shard: answers queries (blocking calls).  Opening raises
    :class:`CorruptShard` if the manifest is unreadable, ``ValueError``/``OSError`` if
    tantivy cannot open the directory."""

    #: With global statistics, local candidates are fetched this many per requested hit at
    #: first (more, page by page, while one not re-scored could still make the top).
    POOL = 2

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.manifest = Manifest.load(directory)
        self.index = tantivy.Index.open(str(directory))
        self.searcher = self.index.searcher()

    def search(self, query: str, top: int, stats: GlobalStats | None = None) -> ShardResult:
        """The documents matching ``query`` and the best ``top`` of them; ``ValueError`` on
        bad syntax.

        Without ``stats`` the scores are this shard's own BM25.  With ``stats`` (the whole
        index's, see :class:`GlobalStats`) every term query's part of a candidate's score is
        re-scored with the global document frequencies and field lengths - the score one
        index over the whole corpus would give (other clauses keep their local score; a
        query with a boost ``^`` keeps every local score) - and the best ``top`` returned.
        Candidates are re-scored in the order of a query whose score bounds the global
        one, until none left could reach the ``top``: a candidate whose score in that order
        times the bound is below the ``top``-th global score cannot enter (exact, not a
        fixed pool).  For a disjunction of term queries that order is
        :meth:`_global_order`'s (the bound is the field-length factor, about 1), for
        another query the local order with :meth:`_ratio_bound`.
        """
        parsed = self.index.parse_query(query, list(DEFAULT_FIELDS))
        shape = repr(parsed)
        if stats is None or "Boost(" in shape:
            result = self.searcher.search(parsed, top, count=True)
            return ShardResult(result.count, self._hits(result.hits))
        pure = _only_terms(shape)
        order = self._global_order(shape, stats) if pure else None
        ordering, bound = order or (parsed, self._ratio_bound(shape, stats, pure))
        best: list[tuple[float, int, Any]] = []  # min-heap of (global score, -rank, address)
        count, offset, limit, rank = 0, 0, max(top * self.POOL, 1), 0
        while True:
            result = self.searcher.search(ordering, limit, count=not offset, offset=offset)
            if not offset:
                count = result.count
            for local, address in result.hits:
                if len(best) >= top and best[0][0] > local * bound:
                    return ShardResult(count, self._ranked(best))
                text = parsed.explain(self.searcher, address).to_json()
                score = _rescore(text, None if order else float(local), stats, pure)
                rank += 1
                entry = (score, -rank, address)
                if len(best) < top:
                    heapq.heappush(best, entry)
                elif entry > best[0]:
                    heapq.heapreplace(best, entry)
            if len(result.hits) < limit:
                return ShardResult(count, self._ranked(best))
            offset += limit
            limit *= 2

    def _ranked(self, best: list[tuple[float, int, Any]]) -> tuple[ShardHit, ...]:
        """Best first; equal scores in the order they were re-scored."""
        ordered = sorted(best, reverse=True)
        return self._hits([(score, address) for score, _, address in ordered])

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
