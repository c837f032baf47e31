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
import os
import re
import shutil
import uuid
from collections.abc import Iterable
from pathlib import Path

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
_OPERATORS = re.compile(r"\b(AND|OR|NOT)\b|\b(url|title|body):")


def query_terms(query: str) -> list[tuple[str, str]]:
    """The ``(field, term)`` pairs a query over the default fields can score (a superset:
    statistics of a term the query does not use are simply never needed)."""
    words = ANALYZER.analyze(_OPERATORS.sub(" ", query))
    return [(f, w) for w in dict.fromkeys(words) for f in DEFAULT_FIELDS]


@attrs.frozen
class ShardStats:
    """One shard's part of the global statistics of a query (a node's answer to a statistics call):
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
    """A shard's answer to a query (a node's answer to a search call): how many documents match,
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
