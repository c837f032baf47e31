"""Documents to index: a generated deterministic corpus, or the Fetch Service's WARC files.

Every document is ``Doc(url, title, body)``; :func:`shard_of` places it in a shard by a
stable hash of its URL (blake2b, independent of Python's hash seed), so every process agrees.
"""

from __future__ import annotations

import enum
import hashlib
import html
import random
import re
from collections.abc import Iterator
from pathlib import Path

import attrs

from framework.errors import ConfigurationError


@attrs.frozen
class Doc:
    """One document: ``url`` is its identity (and its shard key)."""

    url: str
    title: str
    body: str


def shard_of(url: str, shards: int) -> int:
    """The shard (0..shards-1) that holds ``url``: stable across processes and runs."""
    digest = hashlib.blake2b(url.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % shards


_SYLLABLES = ("ka", "ta", "zu", "ke", "per", "lo", "mi", "sar", "no", "vi", "rex", "da",
              "qu", "bel", "tor", "fin", "gra", "hel", "om", "ys")


def _vocabulary(size: int, rng: random.Random) -> list[str]:
    words: set[str] = set()
    while len(words) < size:
        words.add("".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 3))))
    return sorted(words)


class CorpusSource(enum.Enum):
    """Where a corpus's documents come from."""

    GENERATED = "generated"  # ``docs`` documents generated from ``seed``
    WARC = "warc"  # every response record in a directory of the crawler's WARC files


@attrs.frozen
class CorpusSpec:
    """A corpus: the same spec gives the same documents anywhere.

    ``source`` is :attr:`CorpusSource.GENERATED` (``docs`` documents from ``seed``) or
    :attr:`CorpusSource.WARC` (every response record in the directory ``warc_dir``, HTML
    reduced to text).  Building a spec with a generated size outside 1..1000000, or a WARC
    source without a directory, raises :class:`ConfigurationError`.

    Building (or decoding) a spec never looks at the files: whether ``warc_dir`` exists is
    checked by :meth:`check_available` and by :func:`documents`, so a record naming the
    corpus stays readable once the files are gone.
    """

    source: CorpusSource = CorpusSource.GENERATED
    docs: int = 2000
    seed: int = 11
    warc_dir: str = ""

    def __attrs_post_init__(self) -> None:
        if self.source is CorpusSource.GENERATED and not (1 <= self.docs <= 1_000_000):
            raise ConfigurationError(f"corpus docs must be 1..1000000, not {self.docs}")
        if self.source is CorpusSource.WARC and not self.warc_dir:
            raise ConfigurationError("a WARC corpus needs a directory")

    def check_available(self) -> None:
        """Raise :class:`ConfigurationError` if the documents cannot be read (now)."""
        if self.source is CorpusSource.WARC and not Path(self.warc_dir).is_dir():
            raise ConfigurationError(f"no WARC directory {self.warc_dir!r}")


def documents(spec: CorpusSpec) -> Iterator[Doc]:
    """Every document of the corpus, in a fixed order."""
    spec.check_available()
    if spec.source is CorpusSource.WARC:
        yield from _warc_documents(Path(spec.warc_dir))
        return
    rng = random.Random(spec.seed)
    vocab = _vocabulary(600, rng)
    # Zipf-like word frequencies: a few common words, a long tail of rare ones
    weights = [1.0 / (rank + 1) ** 0.9 for rank in range(len(vocab))]
    for n in range(spec.docs):
        title = " ".join(rng.choices(vocab, weights, k=rng.randint(2, 5)))
        body = " ".join(rng.choices(vocab, weights, k=rng.randint(20, 80)))
        yield Doc(f"http://corpus.example/{spec.seed}/doc/{n}", title, body)


_TAG = re.compile(r"<[^>]+>")
_TITLE = re.compile(r"<title>(.*?)</title>", re.I | re.S)


def _warc_documents(directory: Path) -> Iterator[Doc]:
    from examples.fetch_service.warc import iter_records

    seen: set[str] = set()
    for record in iter_records(directory, with_body=True):
        if record.url in seen or not record.body:  # at-least-once crawl: keep the first
            continue
        seen.add(record.url)
        text = record.body.decode("utf-8", errors="replace")
        match = _TITLE.search(text)
        title = html.unescape(match.group(1).strip()) if match else ""
        body = html.unescape(_TAG.sub(" ", text))
        yield Doc(record.url, title, " ".join(body.split()))


def sample_queries(spec: CorpusSpec, count: int, seed: int = 7) -> list[str]:
    """``count`` queries over the corpus's words (one and two terms, some phrase-free ORs)."""
    rng = random.Random(seed)
    words: list[str] = []
    for n, doc in enumerate(documents(spec)):
        words.extend(doc.title.split())
        if n > 200:
            break
    words = sorted(set(words))
    if not words:
        return ["*"] * count
    queries = []
    for _ in range(count):
        k = rng.choice((1, 1, 2))
        queries.append(" ".join(rng.sample(words, min(k, len(words)))))
    return queries
