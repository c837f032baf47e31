"""The shard store: where built shards are published for every node to copy (stands in for
HDFS).  It is named by a URL (:func:`framework.open_store`): ``file:///path`` or a bare path
for a directory every host mounts at the same path, ``s3://bucket/prefix`` for an
S3-compatible object store (AWS S3, MinIO, Ceph RGW...; endpoint and credentials from the
``AWS_*`` environment variables).

Layout (keys in the store)::

    <index>/shard-00007/MANIFEST.json           the published shard: its Manifest (index,
                                                shard, docs, files, checksum, build), last
    <index>/shard-00007/<build>/<file>          the build's tantivy files (and a copy of
                                                the manifest, so a file store's build
                                                directory opens as it is)

Guarantees:

* **No half shard is ever visible.**  A shard is built in a local temporary directory, its
  files uploaded under a build name of their own (each object written atomically), and
  only then the shard's ``MANIFEST.json`` is written (atomically): readers go by the
  manifest, so they see the whole shard or none.  A builder killed mid-build or mid-upload
  leaves a local ``.katta-build-*`` directory, or build files no manifest names.
* **Publishing is idempotent.**  If the shard is already published (a redelivered build
  task), the new copy is discarded and the published manifest is returned.  Two builders
  racing each upload under their own build name, so whichever manifest lands last names a
  whole, consistent build.
* **A corrupt shard is never served.**  :func:`fetch_shard` copies the shard to the node's
  own disk and checks every file against the manifest's SHA-256 before opening it;
  :class:`CorruptShard` says what is wrong.  A store that cannot be reached raises
  :class:`framework.StoreUnavailable` (an ``OSError``), in one line.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
import uuid
from collections.abc import Iterable
from pathlib import Path

import attrs
import tantivy

from examples.katta_like.corpus import Doc
from framework import BlobMissing, BlobStore, open_store, records
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
    build: str = ""  # where its files are in the store: <index>/shard-NNNNN/<build>/

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
    """The shard store at ``root`` (a store URL or a path; see the module doc).  Every method
    blocks: call it from a worker thread."""

    root: str = attrs.field(converter=os.fspath)
    blobs: BlobStore = attrs.field(init=False, eq=False, repr=False)

    @blobs.default
    def _open(self) -> BlobStore:
        return open_store(self.root)

    @staticmethod
    def shard_key(index: str, shard: int) -> str:
        return f"{index}/{shard_dir_name(shard)}"

    def manifest(self, index: str, shard: int) -> Manifest | None:
        """The published manifest of a shard, ``None`` if it is not published;
        :class:`CorruptShard` if it is not a manifest."""
        key = f"{self.shard_key(index, shard)}/{MANIFEST}"
        try:
            data = self.blobs.get(key)
        except BlobMissing:
            return None
        try:
            return records.decode(data, Manifest)
        except records.CorruptRecord as exc:
            raise CorruptShard(f"{self.root}/{key}: unreadable manifest ({exc})") from None

    def shard_path(self, index: str, shard: int) -> Path:
        """The local directory of a published shard's files (a file store only: its build
        directory, with a copy of the manifest; where the shard would be if unpublished)."""
        path = getattr(self.blobs, "path", None)
        if path is None:
            raise FrameworkError(f"the shard store {self.root} is not a directory")
        where = path(self.shard_key(index, shard))
        manifest = self.manifest(index, shard)
        return where / manifest.build if manifest is not None and manifest.build else where

    def build_shard(self, index: str, shard: int, docs: Iterable[Doc],
                    heap_bytes: int = 30_000_000, scratch: str | None = None) -> Manifest:
        """Index ``docs`` into shard ``shard`` of ``index`` (in a temporary directory under
        ``scratch``, default the system's) and publish it atomically; the published
        manifest (an earlier one if the shard was published already)."""
        published = self.manifest(index, shard)
        if published is not None:
            return published
        temp = Path(tempfile.mkdtemp(prefix=".katta-build-", dir=scratch))
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
            build = f"b-{uuid.uuid4().hex[:12]}"
            manifest = Manifest(index, shard, count, files, _checksum(files), tokens, build)
            return self._publish(manifest, temp)
        finally:
            shutil.rmtree(temp, ignore_errors=True)

    def _publish(self, manifest: Manifest, directory: Path) -> Manifest:
        """Upload a built shard's files under its build name, then its manifest."""
        key = self.shard_key(manifest.index, manifest.shard)
        for name in manifest.files:
            self.blobs.put_file(f"{key}/{manifest.build}/{name}", directory / name)
        encoded = records.encode(manifest)
        self.blobs.put(f"{key}/{manifest.build}/{MANIFEST}", encoded)
        published = self.manifest(manifest.index, manifest.shard)
        if published is not None:  # published meanwhile by another builder: keep theirs
            self.blobs.delete_prefix(f"{key}/{manifest.build}")
            return published
        self.blobs.put(f"{key}/{MANIFEST}", encoded)
        return manifest

    def remove_index(self, index: str) -> None:
        """Delete every shard of ``index`` from the store."""
        self.blobs.delete_prefix(index)


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
    manifest = store.manifest(index, shard)
    if manifest is None:
        raise CorruptShard(f"shard {shard} of index {index!r} is not in the store {store.root}")
    key = store.shard_key(index, shard)
    source = f"{key}/{manifest.build}" if manifest.build else key
    target = local_root / index / shard_dir_name(shard)
    temp = local_root / index / f".tmp-{uuid.uuid4().hex}"
    temp.mkdir(parents=True)
    try:
        for name in manifest.files:
            try:
                store.blobs.get_file(f"{source}/{name}", temp / name)
            except BlobMissing:
                raise CorruptShard(f"{store.root}/{source}: {name} is missing") from None
        (temp / MANIFEST).write_bytes(records.encode(manifest))
        verify(temp)
        shutil.rmtree(target, ignore_errors=True)
        os.rename(temp, target)
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise
    return target
