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

    #: With global statistics, this many local candidates per requested hit are re-scored.
    POOL = 3

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.manifest = Manifest.load(directory)
        self.index = tantivy.Index.open(str(directory))
        self.searcher = self.index.searcher()

    def search(self, query: str, top: int, stats: GlobalStats | None = None) -> ShardResult:
        """The documents matching ``query`` and the best ``top`` of them; ``ValueError`` on
        bad syntax.

        Without ``stats`` the scores are this shard's own BM25.  With ``stats`` (the whole
        index's, see :class:`GlobalStats`) the best ``POOL * top`` local candidates are
        re-scored with the global document frequencies and field lengths - the score one
        index over the whole corpus would give (term queries; other clauses keep their
        local score) - and the best ``top`` of them returned.
        """
        parsed = self.index.parse_query(query, list(DEFAULT_FIELDS))
        want = top * self.POOL if stats is not None else top
        result = self.searcher.search(parsed, want, count=True)
        scored = []
        for score, address in result.hits:
            if stats is not None:
                explanation = json.loads(parsed.explain(self.searcher, address).to_json())
                score = _rescore(explanation, stats)
            scored.append((score, address))
        scored.sort(key=lambda h: -h[0])
        hits = []
        for score, address in scored[:top]:
            stored = self.searcher.doc(address)
            hits.append(ShardHit(score, stored.get_first("url"),
                                 stored.get_first("title") or ""))
        return ShardResult(result.count, tuple(hits))

    def stats(self, query: str) -> ShardStats:
        """This shard's part of the global statistics for ``query`` (see GlobalStats)."""
        return ShardStats(self.searcher.num_docs, self.manifest.tokens,
                          {f"{f}:{t}": self.searcher.doc_freq(f, t)
                           for f, t in query_terms(query)})


def _rescore(node: dict[str, Any], stats: GlobalStats) -> float:
    """Recompute a tantivy BM25 explanation with global statistics.  ``node`` is
    tantivy's explanation JSON (its format, read where it is parsed, not a record of
    ours: see docs/architecture.md, "Katta-like search")."""
    description = node.get("description", "")
    details = node.get("details") or []
    if description.startswith("TermQuery") and node.get("context"):
        match = re.search(r'field=(\d+), type=Str, "(.*)"\)', node["context"][0])
        values = {d["description"]: d for d in details}
        idf_node = next((d for d in details if d["description"].startswith("idf")), None)
        tf_node = next((d for d in details if d["description"].startswith("freq /")), None)
        field = _FIELD_IDS.get(int(match.group(1))) if match else None
        if match is None or idf_node is None or tf_node is None or field is None:
            return float(node["value"])
        n = stats.df.get(f"{field}:{match.group(2)}")
        if n is None or not stats.docs:
            return float(node["value"])
        idf = math.log(1 + (stats.docs - n + 0.5) / (n + 0.5))
        tf = {d["description"].split(",")[0]: d["value"] for d in tf_node["details"]}
        avgdl = stats.avgdl.get(field) or tf["avgdl"]
        freq, k1, b, dl = tf["freq"], tf["k1"], tf["b"], tf["dl"]
        norm = freq / (freq + k1 * (1 - b + b * dl / avgdl))
        k1_plus_1 = values.get("(K1+1)", {"value": k1 + 1})["value"]
        return float(k1_plus_1 * idf * norm)
    if "sum of" in description and details:
        return sum(_rescore(d, stats) for d in details)
    return float(node["value"])
