"""The ``katta`` command and the shard store: clear one-line errors, status, and no half
shard ever visible after a builder is killed with kill -9."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio

from examples.katta_like.corpus import CorpusSource, CorpusSpec, documents
from examples.katta_like.ctl import main
from examples.katta_like.store import MANIFEST, Manifest, ShardStore, verify
from framework.testing import python_argv, spawn


def katta(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_user_mistakes_are_one_line(zk_hosts: str, chroot: str,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    where = ("--zk", zk_hosts, "--chroot", chroot, "--timeout", "20")
    code, _, err = katta(capsys, "search", "hello", "--index", "nope", *where)
    assert code == 2 and err.strip().count("\n") == 0
    assert "no index or alias named 'nope'" in err
    code, _, err = katta(capsys, "search", "title:(", *where)
    assert code == 2 and err.startswith("katta: error: bad query syntax")
    code, _, err = katta(capsys, "index", "bad name!", *where)
    assert code == 2 and "invalid index name" in err
    code, _, err = katta(capsys, "index", "x", "--warc", "/nonexistent", *where)
    assert code == 2 and "no WARC directory" in err
    code, _, err = katta(capsys, "alias", "docs", "missing", *where)
    assert code == 2 and "no index named 'missing'" in err
    code, _, err = katta(capsys, "remove", "missing", *where)
    assert code == 2 and "no index named 'missing'" in err
    with pytest.raises(SystemExit):  # argparse: usage + one line, status 2
        main(["index", "x", "--shards", "0", *where])
    assert "must be 1 or more" in capsys.readouterr().err
    code, out, _ = katta(capsys, "status", "--json", *where)
    assert code == 0 and json.loads(out)["indexes"] == {}


async def test_no_half_shard_after_kill9_of_a_builder(tmp_path: Path) -> None:
    store = ShardStore(tmp_path / "store")
    child = """
import sys
from examples.katta_like.corpus import CorpusSource, CorpusSpec, documents
from examples.katta_like.store import ShardStore
def docs():
    for n, d in enumerate(documents(CorpusSpec(docs=100000))):
        if n == 2000:
            print("building", flush=True)
            sys.stdin.readline()  # wait here, mid-build, until killed
        yield d
ShardStore(sys.argv[1]).build_shard("docs", 0, docs())
"""
    async with spawn(python_argv("-c", child, store.root), name="builder", pipe_stdin=True,
                     pipe_stdout=True, cwd=Path(__file__).resolve().parents[1]) as builder:
        assert builder.lines is not None
        with trio.fail_after(60):
            assert (await builder.lines.next()).strip() == "building"
            builder.kill()
            await builder.wait()
    assert not store.shard_path("docs", 0).exists()  # only a .tmp- directory may remain
    assert store.manifest("docs", 0) is None
    manifest = store.build_shard("docs", 0, documents(CorpusSpec(docs=50)))
    assert manifest.docs == 50 and verify(store.shard_path("docs", 0)) == manifest
    # publishing again (a redelivered task) keeps the published shard
    assert store.build_shard("docs", 0, documents(CorpusSpec(docs=10))).docs == 50
    on_disk = (store.shard_path("docs", 0) / MANIFEST).read_bytes()
    assert Manifest.load(store.shard_path("docs", 0)).docs == 50
    assert json.loads(on_disk)["docs"] == 50  # the manifest is JSON for other readers too


def test_warc_corpus_from_the_crawler(tmp_path: Path) -> None:
    """The Fetch Service's WARC output is a corpus: HTML reduced to title and text, one
    document per URL (a duplicate record from at-least-once crawling is indexed once)."""
    import datetime as dt

    from examples.fetch_service.fetch import RawResponse
    from examples.fetch_service.warc import WarcWriter
    from examples.katta_like.corpus import shard_of

    pages = {f"http://site.test/p{n}": f"<html><title>Page {n}</title><body><p>alpha "
             f"{'beta ' * n}&amp; gamma</p></body></html>" for n in range(6)}
    with WarcWriter(tmp_path / "warc") as writer:
        for url, html in [*pages.items(), ("http://site.test/p1", pages["http://site.test/p1"])]:
            writer.write(RawResponse(url, 200, "OK", "HTTP/1.1",
                                     (("Content-Type", "text/html"),), html.encode(),
                                     dt.datetime.now(dt.UTC)))
    docs = list(documents(CorpusSpec(CorpusSource.WARC, warc_dir=str(tmp_path / "warc"))))
    assert sorted(d.url for d in docs) == sorted(pages)
    p3 = next(d for d in docs if d.url.endswith("p3"))
    assert p3.title == "Page 3" and p3.body.startswith("Page 3 alpha beta beta beta & gamma")
    store = ShardStore(tmp_path / "store")
    total = sum(store.build_shard("w", s, (d for d in docs if shard_of(d.url, 2) == s)).docs
                for s in range(2))
    assert total == len(pages)


def test_global_statistics_give_the_single_index_ranking(tmp_path: Path) -> None:
    """Scatter-gather with summed statistics ranks like one index over the whole corpus."""
    from examples.katta_like.corpus import sample_queries, shard_of
    from examples.katta_like.load import reference
    from examples.katta_like.searcher import ShardSearcher
    from examples.katta_like.store import GlobalStats

    spec = CorpusSpec(docs=800, seed=9)
    docs = list(documents(spec))
    store = ShardStore(tmp_path / "store")
    shards = []
    for s in range(4):
        store.build_shard("d", s, (d for d in docs if shard_of(d.url, 4) == s))
        shards.append(ShardSearcher(store.shard_path("d", s)))
    queries = list(dict.fromkeys(sample_queries(spec, 30)))
    expected = reference(spec, tmp_path, queries, 10)
    for query in queries:
        stats = GlobalStats.merge([sh.stats(query) for sh in shards])
        answers = [sh.search(query, 10, stats) for sh in shards]
        merged = sorted((h for a in answers for h in a.hits), key=lambda h: -h.score)[:10]
        want = expected[query]
        assert sum(a.count for a in answers) == want.count
        assert want.correct([hit.url for hit in merged]) == 1.0, query
        if merged:
            assert abs(merged[0].score - want.scores[want.urls[0]]) < 1e-4


def test_global_rescoring_is_exact_whatever_the_first_page(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A shard re-scores candidates until none left could enter its top (not a fixed pool):
    with shards whose statistics differ much (one holds every document with a frequent
    word, so its local order is not the global one) every merged hit has the single
    index's score, for term queries of every shape, and the answer is the same when the
    candidates come in pages of 1, 2, 4... (a bound that stopped too early fails here),
    and when the shards are searched together (one node's call: each shard's count, and
    only its hits among the best of them all)."""
    from collections import Counter

    from examples.katta_like.corpus import shard_of
    from examples.katta_like.load import reference
    from examples.katta_like.searcher import ShardSearcher, search_shards
    from examples.katta_like.store import GlobalStats

    spec = CorpusSpec(docs=600, seed=5)
    docs = list(documents(spec))
    frequent = Counter(w for d in docs for w in set(d.body.split()))
    words = [w for w, _ in frequent.most_common(30)][10:]
    store = ShardStore(tmp_path / "store")
    shards = []
    for s in range(3):
        store.build_shard("d", s, (d for d in docs if s == (
            0 if words[0] in d.body.split() else 1 + shard_of(d.url, 2))))
        shards.append(ShardSearcher(store.shard_path("d", s)))
    queries = [*words[:6], *(f"{words[0]} {w}" for w in words[1:]),
               f"{words[2]} AND ({words[3]} OR {words[4]})",
               f"title:{words[5]} body:{words[0]}", f"{words[1]} -{words[0]}"]
    expected = reference(spec, tmp_path, queries, 10)

    def merged(query: str) -> list[tuple[str, float]]:
        stats = GlobalStats.merge([sh.stats(query) for sh in shards])
        answers = [sh.search(query, 10, stats) for sh in shards]
        together = search_shards(dict(enumerate(shards)), query, 10, stats)
        assert [a.count for a in answers] == [together[s].count for s in range(3)]
        assert sum(len(a.hits) for a in together.values()) <= 10
        hits = [h for a in answers for h in a.hits]
        best = [(h.url, h.score) for h in sorted(hits, key=lambda h: (-h.score, h.url))[:10]]
        hits = sorted((h for a in together.values() for h in a.hits), key=lambda h: -h.score)
        assert [h.score for h in hits] == [score for _, score in best]
        cut = best[-1][1] if best else 0.0  # equal scores at the cut: either may be kept
        assert {h.url for h in hits if h.score > cut} == {u for u, sc in best if sc > cut}
        return best

    first = {query: merged(query) for query in queries}
    for query, hits in first.items():
        want = expected[query]
        assert hits and want.correct([url for url, _ in hits]) == 1.0, query
        for url, score in hits:
            assert abs(score - want.scores[url]) < 1e-4, (query, url)
    monkeypatch.setattr(ShardSearcher, "POOL", 0)  # pages of 1, 2, 4, ... candidates
    assert {query: merged(query) for query in queries} == first


def test_global_rescoring_is_exact_when_field_lengths_differ(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A disjunction is re-scored in the order of its terms boosted by idf_g/idf_l; what
    is left between that order and the global one is the field lengths.  With one shard
    of short documents and one of long ones (average lengths 10x apart) every merged top
    10 is the single index's, in pages of 1, 2, 4..., the shards searched apart or together
    (a bound of 0.9 instead of the field-length factor fails here)."""
    import random

    from examples.katta_like.corpus import Doc
    from examples.katta_like.searcher import ShardSearcher, search_shards
    from examples.katta_like.store import GlobalStats

    monkeypatch.setattr(ShardSearcher, "POOL", 0)
    for seed in range(10):
        rng = random.Random(seed)
        filler = [f"w{i}" for i in range(50)]

        def doc(n: int, length: int, tf: int, rng: random.Random = rng,
                filler: list[str] = filler) -> Doc:
            words = [rng.choice(filler) for _ in range(max(0, length - tf))] + ["x"] * tf
            rng.shuffle(words)
            return Doc(f"u{n:04d}", "t", " ".join(words))

        short = [doc(n, rng.randint(1, 30), rng.randint(1, 3)) for n in range(100)]
        long = [doc(1000 + n, rng.randint(20, 300), rng.randint(1, 10)) for n in range(100)]
        store = ShardStore(tmp_path / str(seed))
        store.build_shard("d", 0, short)
        store.build_shard("d", 1, long)
        store.build_shard("all", 0, short + long)
        one = ShardSearcher(store.shard_path("all", 0))
        shards = [ShardSearcher(store.shard_path("d", s)) for s in (0, 1)]
        for query in ("x", "x w1", "w2 w3 x"):
            want = [(h.url, h.score) for h in one.search(query, 10).hits]
            stats = GlobalStats.merge([sh.stats(query) for sh in shards])
            hits = sorted((h for sh in shards for h in sh.search(query, 10, stats).hits),
                          key=lambda h: (-h.score, h.url))[:10]
            assert [h.url for h in hits] == [url for url, _ in want], (seed, query)
            for hit, (_, score) in zip(hits, want, strict=True):
                assert abs(hit.score - score) < 1e-4, (seed, query, hit.url)
            together = search_shards(dict(enumerate(shards)), query, 10, stats)
            both = sorted((h for a in together.values() for h in a.hits), key=lambda h: -h.score)
            assert [h.score for h in both] == [h.score for h in hits], (seed, query)


def test_bad_settings_of_the_processes_are_one_line(
        zk_hosts: str, chroot: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """`framework run` of a master or node with a bad KATTA_* setting: one line, status 2."""
    from framework.cli import main as framework_main

    run = ["run", "--zk", zk_hosts, "--chroot", chroot, "--session-timeout", "4"]
    for name, value, message in (
            ("KATTA_NODE_GRACE", "abc", "KATTA_NODE_GRACE must be a number of seconds"),
            ("KATTA_SAFE_MODE", "-1", "KATTA_SAFE_MODE must be a finite number"),
            ("KATTA_SAFE_MODE", "inf", "KATTA_SAFE_MODE must be a finite number")):
        with monkeypatch.context() as env:
            env.setenv(name, value)
            code = framework_main([*run, "examples.katta_like.master:KattaMaster"])
        err = capsys.readouterr().err
        assert code == 2 and message in err and "Traceback" not in err, err
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("KATTA_DATA", str(blocker / "node"))
    code = framework_main([*run, "examples.katta_like.node:SearchNode"])
    err = capsys.readouterr().err
    assert code == 2 and "KATTA_DATA: cannot use" in err and "Traceback" not in err, err


def test_the_search_api_answers_what_it_cannot_take_clearly() -> None:
    """The node's query protocol: a call that is not one is answered with one line, a
    shard it does not serve in ``refused``; a frame that is not a msgpack map with an id
    cannot be answered at all (:class:`ProtocolError`: the node closes the connection)."""
    import msgpack

    from examples.katta_like.node import SearchNode
    from examples.katta_like.wire import (
        Answer,
        Call,
        Kind,
        ProtocolError,
        SearchReply,
        ShardRequest,
    )
    from framework import records

    node = SearchNode(name="n0")
    with pytest.raises(ProtocolError, match="not msgpack"):
        node._reply(b"\xc1")
    with pytest.raises(ProtocolError, match="integer id"):
        node._reply(msgpack.packb({"kind": "search"}))
    answer = node._reply(msgpack.packb({"id": 3, "kind": "nope"}))
    assert answer.id == 3 and answer.reply is None
    assert answer.error is not None and answer.error.startswith("bad request: not a Call record")
    answer = node._reply(msgpack.packb({"id": 4, "kind": "search", "request": {
        "index": "ix", "shards": ["x"], "query": "a"}}))
    assert answer.id == 4 and answer.error is not None and "shards" in answer.error
    call = Call(5, Kind.SEARCH, ShardRequest("ix", (0,), "a"))
    answer = node._reply(msgpack.packb(records.unstructure(call)))
    assert answer == Answer(5, SearchReply({}, {0: "n0 does not serve ix/0"}))
