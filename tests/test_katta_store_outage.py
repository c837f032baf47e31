"""A Katta node whose shard store cannot be reached waits it out (issue 36): the S3 store
(moto's S3 server, a stand-in for AWS S3, MinIO, Ceph RGW) is reached through a proxy,
which goes away - connections refused, as when the store's front end is down, its data kept
- while a node copies its shards; the node retries with a backoff instead of refusing the
shards as corrupt, and serves them once the store is back - the index never goes to
``error``.  (Killing moto itself would lose its objects, which a real S3 outage does not:
putting them back raced the node's next retry, which then found the shards missing.)"""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import structlog
import trio

from examples.katta_like.client import SearchClient
from examples.katta_like.corpus import CorpusSpec, sample_queries
from examples.katta_like.ctl import add_index, read_index, wait_replicated, wait_state
from examples.katta_like.layout import APP_NAME, IndexRecord, IndexState, replica_name
from examples.katta_like.master import KattaMaster
from examples.katta_like.node import SearchNode
from framework import Session
from framework.retry import Backoff
from framework.runtime import App
from framework.testing import TcpProxy
from tests.test_katta_basic import TIMEOUT, single_index


class MotoServer:
    """moto's S3 server in a process of its own."""

    def __init__(self) -> None:
        self.port = 0
        self.proc: subprocess.Popen[str] | None = None
        self.front: TcpProxy  # the store's address (see the fixture)

    def start(self) -> str:
        proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        assert proc.stderr is not None
        for line in proc.stderr:  # werkzeug says where it listens once it does
            found = re.search(r"Running on http://127\.0\.0\.1:(\d+)", line)
            if found:
                break
        else:
            pytest.fail(f"moto's S3 server did not start (exit {proc.wait()})")
        # keep reading its request log, or the pipe fills and the server blocks
        threading.Thread(target=lambda: [None for _ in proc.stderr],  # type: ignore[union-attr]
                         daemon=True).start()
        self.port, self.proc = int(found.group(1)), proc
        return f"http://127.0.0.1:{self.port}"

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


@pytest.fixture
def moto(monkeypatch: pytest.MonkeyPatch) -> Iterator[MotoServer]:
    """moto behind a :class:`TcpProxy` (``server.front``): the store's address is the
    proxy's."""
    server = MotoServer()
    server.start()
    server.front = TcpProxy(("127.0.0.1", server.port))
    endpoint = f"http://{server.front.address}"
    for name, value in {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "test",
                        "AWS_SECRET_ACCESS_KEY": "test", "AWS_REGION": "us-east-1"}.items():
        monkeypatch.setenv(name, value)
    try:
        yield server
    finally:
        server.front.stop()
        server.kill()


def create_bucket(endpoint: str, bucket: str) -> None:
    import boto3

    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=bucket)


@contextmanager
def store_failures() -> Iterator[tuple[list[dict[str, Any]], trio.Event]]:
    """The node's ``shard.store_unavailable`` events within the block, and an event set
    at the second one (the copy was tried again after a failure)."""
    seen: list[dict[str, Any]] = []
    retried = trio.Event()

    def spy(_logger: object, _method: str, event_dict: Any) -> Any:
        if event_dict.get("event") == "shard.store_unavailable":
            seen.append(dict(event_dict))
            if len(seen) >= 2:
                retried.set()
        return event_dict

    with structlog.testing.capture_logs(processors=[spy]):
        yield seen, retried


async def test_a_node_waits_out_a_store_outage(zk_hosts: str, chroot: str, session: Session,
                                               moto: MotoServer, tmp_path: Path) -> None:
    endpoint = f"http://{moto.front.address}"
    bucket = f"t-{uuid.uuid4().hex[:12]}"
    create_bucket(endpoint, bucket)
    url = f"s3://{bucket}/katta"
    spec = IndexRecord("docs", 2, 2, url, CorpusSpec(docs=120, seed=7))
    single = single_index(spec.corpus, tmp_path)

    async def run(component: Any) -> None:
        async with Session(zk_hosts, chroot=chroot, session_timeout=4.0) as s:
            await component.run(s)

    def node(name: str) -> SearchNode:
        n = SearchNode(name=name)
        n.data_dir = tmp_path / name
        n.store_backoff = Backoff(0.05, 0.3)  # type: ignore[misc]
        return n

    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            master = KattaMaster(name="m1")
            master.stable_for = 0.2
            master.node_grace = 0.2
            nursery.start_soon(run, master)
            nursery.start_soon(run, node("n0"))
            await add_index(session, spec)
            done = await wait_state(session, "docs", (IndexState.DEPLOYED, IndexState.ERROR))
            assert done.state is IndexState.DEPLOYED, done  # on n0 alone
            front_port = moto.front.port
            moto.front.stop()  # the store is unreachable while a second node copies
            with store_failures() as (seen, retried):
                nursery.start_soon(run, node("n1"))
                await retried.wait()
            assert {e["node"] for e in seen} == {"n1"}
            assert all("cannot read" in e["error"] for e in seen), seen[0]

            moto.front = TcpProxy(("127.0.0.1", moto.port), listen_port=front_port)  # back
            await wait_replicated(session, "docs", 2)

            app = App(APP_NAME)
            for shard in range(spec.shards):
                refused = app.refused_dir(replica_name("docs", shard))
                assert await session.exists(f"{refused}/n1") is None
            assert (await read_index(session, "docs")).state is IndexState.DEPLOYED
            async with SearchClient.open(session) as client:
                for query in sample_queries(spec.corpus, 4):
                    result = await client.search(query, index="docs", top=10)
                    assert not result.partial
                    assert result.count == single.search(query, 10).count
            nursery.cancel_scope.cancel()
