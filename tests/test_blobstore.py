"""Data several hosts share, named by a URL (framework.blobstore): a file store and an S3
store behave alike (whole objects, atomic writes, one-line errors), and each of the three
users works on both: the runtime's payloads, Katta's shard store, the crawler's inbox files
and checkpoints.

The S3 side runs against moto's S3 server, started here on 127.0.0.1 in a process of its
own: a stand-in for the production stores the path is meant for (AWS S3, MinIO, Ceph RGW).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from examples.fetch_service.scale import layout
from examples.fetch_service.warc import iter_stored
from examples.katta_like.client import SearchClient
from examples.katta_like.corpus import CorpusSpec, sample_queries
from examples.katta_like.ctl import add_index, remove_index, wait_gone, wait_state
from examples.katta_like.layout import IndexRecord, IndexState
from framework import (
    BlobMissing,
    ConfigurationError,
    Session,
    StoreUnavailable,
    open_store,
    store_location,
)
from framework.runtime import App, Client
from framework.testing import spawn
from tests.test_fetch_scale import crawl_in_process, lazy_site, one_fetcher, unhurried
from tests.test_katta_basic import TIMEOUT, cluster, single_index
from tests.test_payloads import BIG, Sizer, run_until

__all__ = ["lazy_site"]  # a fixture, imported for the crawl test

ROOT = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------- the S3 stand-in


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """moto's S3 server on a free 127.0.0.1 port, for the whole session."""
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", "0"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        for line in proc.stderr:  # werkzeug says where it listens once it does
            found = re.search(r"Running on (http://127\.0\.0\.1:\d+)", line)
            if found:
                break
        else:
            pytest.fail(f"moto's S3 server did not start (exit {proc.wait()})")
        # keep reading its request log, or the pipe fills and the server blocks
        threading.Thread(target=lambda: [None for _ in proc.stderr],  # type: ignore[union-attr]
                         daemon=True).start()
        yield found.group(1)
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture
def s3_bucket(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """A new bucket on the stand-in; the AWS_* environment points at it (this process and
    the processes it starts)."""
    import boto3

    for name, value in {"AWS_ENDPOINT_URL": s3_endpoint, "AWS_ACCESS_KEY_ID": "test",
                        "AWS_SECRET_ACCESS_KEY": "test", "AWS_REGION": "us-east-1"}.items():
        monkeypatch.setenv(name, value)
    bucket = f"t-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=s3_endpoint).create_bucket(Bucket=bucket)
    return bucket


@pytest.fixture(params=["file", "s3"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A store URL of each kind."""
    if request.param == "file":
        return f"file://{tmp_path}/store"
    return f"s3://{request.getfixturevalue('s3_bucket')}/root"


# ---------------------------------------------------------------- the store itself


def test_a_store_keeps_whole_objects_under_keys(store_url: str, tmp_path: Path) -> None:
    store = open_store(store_url)
    assert store.url == store_url and store.list() == []
    store.put("job/inbox/p001/a.json", b"one")
    store.put("job/inbox/p001/b.json", b"two")
    store.put("job/inbox/p002/c.json", b"three")
    store.put("job/inbox/p001/a.json", b"ONE")  # a later write replaces the object whole
    assert store.get("job/inbox/p001/a.json") == b"ONE"
    assert [i.key for i in store.list("job/inbox/p001")] == ["job/inbox/p001/a.json",
                                                               "job/inbox/p001/b.json"]
    assert [(i.key, i.size) for i in store.list()][-1] == ("job/inbox/p002/c.json", 5)
    assert store.exists("job/inbox/p001/b.json") and not store.exists("job/nothing")
    source = tmp_path / "local.bin"
    source.write_bytes(os.urandom(100_000))
    store.put_file("shards/s0/file.bin", source)
    store.get_file("shards/s0/file.bin", tmp_path / "copy" / "file.bin")
    assert (tmp_path / "copy" / "file.bin").read_bytes() == source.read_bytes()
    store.rename("job/inbox/p001/b.json", "job/inbox/p001/.b.json.corrupt")
    assert not store.exists("job/inbox/p001/b.json")
    with pytest.raises(BlobMissing, match=r"job/inbox/p001/b.json is not in the store"):
        store.get("job/inbox/p001/b.json")
    with pytest.raises(FileNotFoundError):  # BlobMissing is one
        store.get_file("job/gone", tmp_path / "gone")
    assert not (tmp_path / "gone").exists()
    store.delete("job/inbox/p001/a.json")
    store.delete("job/inbox/p001/a.json")  # already gone: nothing
    assert store.delete_prefix("job") == 2
    assert [i.key for i in store.list()] == ["shards/s0/file.bin"]
    for bad in ("", "/abs", "a//b", "a/../b", "."):
        with pytest.raises(ConfigurationError, match="not a blob key"):
            store.put(bad, b"x")


def test_a_bare_path_is_a_file_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    open_store("rel/store").put("k/v.json", b"1")
    assert (tmp_path / "rel" / "store" / "k" / "v.json").read_bytes() == b"1"
    assert open_store(f"file://{tmp_path}/rel/store").get("k/v.json") == b"1"
    assert store_location("rel/store") == f"{tmp_path}/rel/store"  # absolute for other hosts
    assert store_location("s3://bucket/prefix") == "s3://bucket/prefix"


def test_a_reader_never_sees_a_partial_object(store_url: str) -> None:
    """While one thread rewrites a key with objects of 3 MB (and, on S3, one of 9 MB: a
    multipart upload), another reads it over and over: every read is one whole object."""
    store = open_store(store_url)
    sizes = [3 << 20] * 6 + ([9 << 20] if store_url.startswith("s3") else [])
    store.put("blob", bytes([255]) * 100)
    done = threading.Event()
    seen: list[tuple[int, int]] = []

    def write() -> None:
        try:
            for n, size in enumerate(sizes):
                store.put("blob", bytes([n]) * size)
        finally:
            done.set()

    def read() -> None:
        while not done.is_set():
            data = store.get("blob")
            assert data == data[:1] * len(data), "a mix of two objects"
            seen.append((data[0], len(data)))
            names = [i.key for i in store.list()]
            assert names == ["blob"], names  # no temporary name is ever listed

    writer = threading.Thread(target=write)
    writer.start()
    try:
        read()
    finally:
        writer.join()
    whole = {(255, 100)} | {(n, size) for n, size in enumerate(sizes)}
    assert seen and set(seen) <= whole
    assert store.get("blob") == bytes([len(sizes) - 1]) * sizes[-1]


async def test_a_writer_killed_midway_leaves_no_object(store_url: str, tmp_path: Path) -> None:
    """kill -9 of a process in the middle of writing a 10 MB object (from a pipe: on S3 a
    multipart upload): the key never appears, and nothing is listed."""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    child = ("import sys\nfrom framework import open_store\n"
             "open_store(sys.argv[1]).put_file('big/object', sys.argv[2])\n")

    def feed() -> Any:
        pipe = open(fifo, "wb")  # noqa: SIM115 (closed after the kill, not before)
        for _ in range(10):
            pipe.write(b"x" * (1 << 20))
        pipe.flush()
        return pipe  # 10 MB read by the child (the pipe holds 64 KB), no end of file yet

    async with spawn([sys.executable, "-c", child, store_url, str(fifo)], name="writer",
                     cwd=ROOT) as writer:
        with trio.fail_after(30):
            pipe = await trio.to_thread.run_sync(feed, abandon_on_cancel=True)
            writer.kill()
            await writer.wait()
        try:
            pipe.close()
        except BrokenPipeError:
            pass
    store = open_store(store_url)
    assert not store.exists("big/object")
    assert store.list() == []
    if store_url.startswith("file://"):  # only a hidden temporary file is left behind
        leftovers = os.listdir(tmp_path / "store" / "big")
        assert all(n.startswith(".object.") and n.endswith(".part") for n in leftovers)


def test_a_bad_url_or_an_unreachable_store_is_one_line(
        s3_bucket: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    for bad, message in (
        ("ftp://host/x", "the scheme must be file:// (a directory every host mounts) or "
                         "s3://bucket/prefix"),
        ("s3://", "has no valid bucket name"),
        ("s3://Bad_Bucket/x", "has no valid bucket name"),
        ("s3://bucket/x?region=eu", "must not have a query"),
        ("file://otherhost/x", "names a host"),
        ("s3://bucket/a/../b", "not a blob key"),
    ):
        with pytest.raises(ConfigurationError, match=re.escape(message)) as caught:
            open_store(bad)
        assert "\n" not in str(caught.value)
    with pytest.raises(StoreUnavailable, match="no bucket 'no-such-bucket' there") as caught:
        open_store("s3://no-such-bucket/p").put("k", b"1")
    assert "\n" not in str(caught.value)
    with socketless_port() as port:
        monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
        with pytest.raises(StoreUnavailable, match=rf"cannot write k in the store "
                                                   rf"s3://{s3_bucket}/p: ") as caught:
            open_store(f"s3://{s3_bucket}/p").put("k", b"1")
        assert "\n" not in str(caught.value) and isinstance(caught.value, OSError)
    # the Katta command that names a store says it in one line, before it connects
    from examples.katta_like.ctl import main as katta

    code = katta(["index", "x", "--store", "ftp://host/x", "--zk", "127.0.0.1:1"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "unsupported store URL" in err, err


class socketless_port:
    """A 127.0.0.1 port nothing listens on (bound, never listening, for the block)."""

    def __enter__(self) -> int:
        import socket

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        return int(self.sock.getsockname()[1])

    def __exit__(self, *exc: object) -> None:
        self.sock.close()


# ---------------------------------------------------------------- the three users, each store


async def test_payloads_by_reference(zk_hosts: str, chroot: str, session: Session,
                                     store_url: str) -> None:
    url = f"{store_url}/payloads"

    class S3Sizer(Sizer):
        payload_store = url

    client = Client(session, Sizer.app_name, payload_store=url, create=True)
    task = await client.submit("handle", BIG, key="big")
    (stored,) = open_store(url).list()
    assert task.payload_ref == stored.key and json.loads(open_store(url).get(stored.key)) == BIG
    records = await run_until(zk_hosts, chroot, S3Sizer(Sizer.app_name, name="w1"), client, ["big"])
    assert records["big"].ok, records["big"].error
    assert records["big"].result == {"bytes": len(json.dumps(BIG)), "first": "blob"}
    assert open_store(url).list() == []  # deleted once the task was acknowledged


async def test_katta_builds_and_serves_shards(zk_hosts: str, chroot: str, session: Session,
                                              store_url: str, tmp_path: Path) -> None:
    url = f"{store_url}/katta"
    spec = IndexRecord("docs", 3, 2, url, CorpusSpec(docs=200, seed=5))
    single = single_index(spec.corpus, tmp_path)
    with trio.fail_after(TIMEOUT):
        async with cluster(zk_hosts, chroot, tmp_path, nodes=2):
            await add_index(session, spec)
            done = await wait_state(session, "docs", (IndexState.DEPLOYED, IndexState.ERROR))
            assert done is not None and done.state is IndexState.DEPLOYED, done
            keys = [i.key for i in open_store(url).list()]
            assert [k for k in keys if k.endswith("shard-00001/MANIFEST.json")]
            async with SearchClient.open(session) as client:
                for query in sample_queries(spec.corpus, 6):
                    result = await client.search(query, index="docs", top=10)
                    assert not result.partial
                    assert result.count == single.search(query, 10).count
            await remove_index(session, "docs", purge=True)
            await wait_gone(session, "docs")
    assert open_store(url).list() == []  # purged from the store


async def test_the_crawlers_inboxes_and_checkpoints(
        zk_hosts: str, chroot: str, lazy_site: Any, store_url: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A crawl whose links cross partitions through inbox files in the store, and whose
    checkpoints go there; the master's first two listings of the inboxes fail (the store
    unreachable): logged, listed again, and the crawl still ends with every page."""
    from examples.fetch_service.scale import master as master_module
    from tests.test_fetch_scale import logged

    real = master_module._inboxes_empty
    failures = iter([StoreUnavailable("cannot list x in the store s3://b/p: refused")] * 2)

    def flaky(job: Any) -> bool:
        failure = next(failures, None)
        if failure is not None:
            raise failure
        return real(job)

    monkeypatch.setattr(master_module, "_inboxes_empty", flaky)
    monkeypatch.setattr(master_module, "STORE_RETRY_S", 0.05)
    site = lazy_site
    url = f"{store_url}/crawl"
    fetcher = one_fetcher(tmp_path)
    async with Session(zk_hosts, chroot=chroot, session_timeout=4.0) as s:
        job = await layout.start_job(s, App(layout.APP_NAME), site.seeds,
                                     unhurried(site.hosts), shared=url, partitions=4,
                                     checkpoint_interval_s=0.2)
        assert job.shared == url
        with logged("crawl.store_unavailable") as seen:
            await crawl_in_process(zk_hosts, chroot, s, fetcher)
            assert seen.is_set()
    assert next(failures, None) is None
    stored = [u for u, _ in iter_stored(tmp_path / "warc")]
    expected = site.expected_urls(obey_robots=True)
    assert set(stored) == expected and len(stored) == len(expected)
    assert fetcher.stats.shipped_files > 0  # links crossed partitions through the store
    keys = [i.key for i in open_store(url).list(job.id)]
    assert not [k for k in keys if "/inbox/" in k]  # every inbox file merged and deleted
    assert {k.split("/")[2] for k in keys if "/parts/" in k} == set(job.names)


def test_a_katta_shard_is_published_whole_or_not_at_all(store_url: str,
                                                         tmp_path: Path) -> None:
    """The manifest is the commit point: a shard whose files were uploaded but whose
    manifest was not (a builder killed between the two) is not in the store; two builders
    racing publish one whole build, and a node's copy of it verifies."""
    from examples.katta_like.corpus import documents
    from examples.katta_like.store import MANIFEST, CorruptShard, ShardStore, fetch_shard, verify

    store = ShardStore(f"{store_url}/katta")
    docs = list(documents(CorpusSpec(docs=120, seed=3)))
    built = store.build_shard("ix", 0, docs)
    store.blobs.delete(f"ix/shard-00000/{MANIFEST}")  # as if killed before the manifest
    assert store.manifest("ix", 0) is None
    with pytest.raises(CorruptShard, match="shard 0 of index 'ix' is not in the store"):
        fetch_shard(store, "ix", 0, tmp_path / "node")
    results: list[Any] = []
    racers = [threading.Thread(target=lambda: results.append(store.build_shard("ix", 0, docs)))
              for _ in range(2)]
    for racer in racers:
        racer.start()
    for racer in racers:
        racer.join()
    published = store.manifest("ix", 0)
    assert published is not None and published.build != built.build
    assert published.docs == 120 and {r.checksum for r in results} >= {published.checksum}
    local = fetch_shard(store, "ix", 0, tmp_path / "node")
    assert verify(local) == published
