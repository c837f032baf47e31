"""The ``katta`` command and the shard store: clear one-line errors, status, and no half
shard ever visible after a builder is killed with kill -9."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from examples.katta_like.corpus import CorpusSpec, documents
from examples.katta_like.ctl import main
from examples.katta_like.store import MANIFEST, ShardStore, verify


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
    assert "must be at least 1" in capsys.readouterr().err
    code, out, _ = katta(capsys, "status", "--json", *where)
    assert code == 0 and json.loads(out)["indexes"] == {}


def test_no_half_shard_after_kill9_of_a_builder(tmp_path: Path) -> None:
    store = ShardStore(tmp_path / "store")
    child = """
import sys
from examples.katta_like.corpus import CorpusSpec, documents
from examples.katta_like.store import ShardStore
def docs():
    for n, d in enumerate(documents(CorpusSpec(docs=100000))):
        if n == 2000:
            print("building", flush=True)
            sys.stdin.readline()  # wait here, mid-build, until killed
        yield d
ShardStore(sys.argv[1]).build_shard("docs", 0, docs())
"""
    proc = subprocess.Popen([sys.executable, "-c", child, str(store.root)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            cwd=Path(__file__).resolve().parents[1])
    assert proc.stdout is not None and proc.stdout.readline().strip() == b"building"
    proc.kill()
    proc.wait()
    assert not store.shard_path("docs", 0).exists()  # only a .tmp- directory may remain
    assert store.manifest("docs", 0) is None
    manifest = store.build_shard("docs", 0, documents(CorpusSpec(docs=50)))
    assert manifest.docs == 50 and verify(store.shard_path("docs", 0)) == manifest
    # publishing again (a redelivered task) keeps the published shard
    assert store.build_shard("docs", 0, documents(CorpusSpec(docs=10))).docs == 50
    assert json.loads((store.shard_path("docs", 0) / MANIFEST).read_text())["docs"] == 50
