"""Katta-like search, in one process against the real ZooKeeper: build, deploy, search,
lifecycle (alias switch, remove), corrupt shard, clear errors."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio

from examples.katta_like.client import SearchClient, UnknownIndex
from examples.katta_like.cluster import wait_serving
from examples.katta_like.corpus import CorpusSource, CorpusSpec, documents, sample_queries
from examples.katta_like.ctl import (
    add_index,
    gather_status,
    remove_index,
    set_alias,
    wait_balanced,
    wait_gone,
    wait_replicated,
    wait_state,
)
from examples.katta_like.layout import IndexRecord, IndexState, ShardSpec
from examples.katta_like.master import KattaMaster
from examples.katta_like.node import SearchNode
from examples.katta_like.searcher import ShardSearcher
from examples.katta_like.store import ShardStore
from framework import Session, records
from framework.errors import ConfigurationError, FrameworkError

TIMEOUT = 30


@contextlib.asynccontextmanager
async def cluster(zk_hosts: str, chroot: str, tmp: Path, nodes: int
                  ) -> AsyncIterator[trio.Nursery]:
    """A master and ``nodes`` search nodes, each with its own session, in this process."""
    async with trio.open_nursery() as nursery:

        async def run(component: object) -> None:
            async with Session(zk_hosts, chroot=chroot, session_timeout=4.0) as s:
                await component.run(s)  # type: ignore[attr-defined]

        master = KattaMaster(name="m1")
        master.stable_for = 0.2
        master.node_grace = 0.2
        nursery.start_soon(run, master)
        for n in range(nodes):
            node = SearchNode(name=f"n{n}")
            node.data_dir = tmp / f"node{n}"
            nursery.start_soon(run, node)
        yield nursery
        nursery.cancel_scope.cancel()


def record(name: str, tmp: Path, *, docs: int = 300, shards: int = 4, replication: int = 2,
           seed: int = 11) -> IndexRecord:
    return IndexRecord(name, shards, replication, str(tmp / "store"),
                       CorpusSpec(docs=docs, seed=seed))


def single_index(spec: CorpusSpec, tmp: Path) -> ShardSearcher:
    store = ShardStore(tmp / "single")
    store.build_shard("all", 0, documents(spec))
    return ShardSearcher(store.shard_path("all", 0))


async def test_build_deploy_search_lifecycle(zk_hosts: str, chroot: str, session: Session,
                                            tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        async with cluster(zk_hosts, chroot, tmp_path, nodes=3):
            v1 = record("docs-v1", tmp_path)
            await add_index(session, v1)
            done = await wait_state(session, "docs-v1", (IndexState.DEPLOYED, IndexState.ERROR))
            assert done is not None and done.state is IndexState.DEPLOYED, done
            await wait_replicated(session, "docs-v1", 2)
            await set_alias(session, "docs", "docs-v1")
            single = single_index(v1.corpus, tmp_path)
            async with SearchClient.open(session) as client:
                for query in sample_queries(v1.corpus, 10):
                    result = await client.search(query, index="docs", top=10)
                    assert not result.partial
                    assert result.count == single.search(query, 10).count
                # lifecycle: a new version beside the old, then an atomic alias switch
                v2 = record("docs-v2", tmp_path, docs=200, seed=12)
                await add_index(session, v2)
                await wait_state(session, "docs-v2", (IndexState.DEPLOYED,))
                await wait_replicated(session, "docs-v2", 2)
                single2 = single_index(v2.corpus, tmp_path / "v2")
                # switch the alias under a query load: every answer is one version's whole
                # answer (its hit count), never a mix of the two versions' shards
                mixed = sample_queries(v1.corpus, 6) + sample_queries(v2.corpus, 6)
                want = {"docs-v1": {q: single.search(q, 10).count for q in mixed},
                        "docs-v2": {q: single2.search(q, 10).count for q in mixed}}
                seen = {"docs-v1": 0, "docs-v2": 0}
                warmed = trio.Event()

                async def load() -> None:
                    n = 0
                    while seen["docs-v2"] < 20:
                        query = mixed[n % len(mixed)]
                        n += 1
                        result = await client.search(query, index="docs")
                        assert not result.partial
                        assert result.count == want[result.index][query], (result.index, query)
                        seen[result.index] += 1
                        if seen["docs-v1"] >= 10:
                            warmed.set()

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(load)
                    await warmed.wait()
                    await set_alias(session, "docs", "docs-v2")
                assert seen["docs-v1"] >= 10
                assert await client.resolve("docs") == "docs-v2"
                # remove the old version: nodes drop its shards and local files
                with pytest.raises(FrameworkError, match="alias 'docs' points at"):
                    await remove_index(session, "docs-v2")
                await remove_index(session, "docs-v1", purge=True)
                await wait_gone(session, "docs-v1")
                assert not (tmp_path / "store" / "docs-v1").exists()
                status = await gather_status(session)
                assert set(status.indexes) == {"docs-v2"}
                assert not status.under_replicated
                for n in range(3):
                    assert not (tmp_path / f"node{n}" / "docs-v1").exists() or not any(
                        (tmp_path / f"node{n}" / "docs-v1").iterdir())
                with pytest.raises(UnknownIndex, match="no index or alias named 'nope'"):
                    await client.search("x", index="nope")
                with pytest.raises(FrameworkError, match="bad query syntax"):
                    await client.search("foo AND (", index="docs")


async def test_corrupt_shard_is_never_served(zk_hosts: str, chroot: str, session: Session,
                                             tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    spec = record("bad", tmp_path, shards=2, replication=1)
    store = ShardStore(spec.store)
    # publish the shards ourselves, then corrupt shard 1 in the store
    from examples.katta_like.corpus import shard_of
    for shard in range(2):
        store.build_shard("bad", shard, (d for d in documents(spec.corpus)
                                         if shard_of(d.url, 2) == shard))
    manifest = store.manifest("bad", 1)
    assert manifest is not None
    victim = store.shard_path("bad", 1) / sorted(manifest.files)[0]
    victim.write_bytes(victim.read_bytes() + b"garbage")
    with trio.fail_after(TIMEOUT):
        async with cluster(zk_hosts, chroot, tmp_path, nodes=2):
            await add_index(session, spec)
            done = await wait_state(session, "bad", (IndexState.ERROR,))
            assert done is not None and "corrupt shards: 00001" in done.error
            status = await gather_status(session)
            assert status.indexes["bad"].placement["00001"].serving == ()
            assert len(status.indexes["bad"].errors) == 2  # both nodes refused it
            async with SearchClient.open(session) as client:
                query = sample_queries(spec.corpus, 1)[0]
                result = await client.search(query, index="bad")
                assert result.partial and result.missing == [1] and result.answered == [0]
            # the command says so too, and exits 1
            from examples.katta_like.ctl import main
            capsys.readouterr()
            code = await trio.to_thread.run_sync(main, [
                "search", query, "--index", "bad", "--zk", zk_hosts, "--chroot", chroot])
            out, err = capsys.readouterr()
            assert code == 1 and "shards answered 1/2" in out
            assert "PARTIAL RESULT: no live replica answered for shards 1 (index bad is error)" \
                in err


def test_bad_settings_are_clear() -> None:
    with pytest.raises(ConfigurationError, match=r"shards must be 1\.\.1000"):
        IndexRecord("x", 0, 1, "/tmp", CorpusSpec())
    with pytest.raises(ConfigurationError, match="replication must be"):
        IndexRecord("x", 1, 0, "/tmp", CorpusSpec())
    with pytest.raises(ConfigurationError, match="no WARC directory"):
        CorpusSpec(CorpusSource.WARC, warc_dir="/nonexistent").check_available()
    with pytest.raises(ConfigurationError, match="no WARC directory"):
        list(documents(CorpusSpec(CorpusSource.WARC, warc_dir="/nonexistent")))


def write_warc(directory: Path, pages: int) -> None:
    """A small crawl in the Fetch Service's WARC format."""
    import datetime as dt

    from examples.fetch_service.fetch import RawResponse
    from examples.fetch_service.warc import WarcWriter

    with WarcWriter(directory) as writer:
        for n in range(pages):
            html = (f"<html><title>Page {n}</title><body>alpha {'beta ' * (n % 7)} "
                    f"gamma{n % 5}</body></html>")
            writer.write(RawResponse(f"http://site.test/p{n}", 200, "OK", "HTTP/1.1",
                                     (("Content-Type", "text/html"),), html.encode(),
                                     dt.datetime.now(dt.UTC)))


async def test_warc_index_outlives_its_crawl(zk_hosts: str, chroot: str, session: Session,
                                             tmp_path: Path) -> None:
    """An index built from WARC files stays readable, served and searchable once the crawl's
    files are gone (they are needed only to build it): the master, a node that joins
    later, the client and `katta status` all read its record."""
    warc = tmp_path / "warc"
    write_warc(warc, 40)
    spec = IndexRecord("crawl", 2, 2, str(tmp_path / "store"),
                       CorpusSpec(CorpusSource.WARC, warc_dir=str(warc)))
    with trio.fail_after(TIMEOUT):
        async with cluster(zk_hosts, chroot, tmp_path, nodes=2) as nursery:
            await add_index(session, spec)
            done = await wait_state(session, "crawl", (IndexState.DEPLOYED, IndexState.ERROR))
            assert done is not None and done.state is IndexState.DEPLOYED, done
            shutil.rmtree(warc)
            late = SearchNode(name="late")
            late.data_dir = tmp_path / "late"

            async def run_late() -> None:
                async with Session(zk_hosts, chroot=chroot, session_timeout=4.0) as s:
                    await late.run(s)

            nursery.start_soon(run_late)
            await wait_serving(session, "late")  # the rebalance gave it a replica
            await wait_balanced(session, "crawl")
            status = await gather_status(session)
            assert status.indexes["crawl"].state is IndexState.DEPLOYED
            async with SearchClient.open(session) as client:
                result = await client.search("alpha", index="crawl", top=5)
            assert not result.partial and result.count == 40


async def test_a_late_announcement_does_not_bring_back_a_removed_index(
        session: Session, tmp_path: Path) -> None:
    """A node that finishes copying a shard after the master removed it does not recreate
    its znodes: the runtime's ``ready`` never creates parents."""
    from examples.katta_like.layout import KattaPaths
    from framework.runtime import App

    paths = KattaPaths(App("katta"))
    node = SearchNode(name="n0")
    node.session = session
    deployed = paths.deployed("gone", 1)
    await session.ensure_path(deployed)  # the master placed the shard
    async with node.ready("gone.00001", {"docs": 1}) as listed:
        assert listed and await session.exists(f"{deployed}/n0") is not None
    assert await session.exists(f"{deployed}/n0") is None  # withdrawn when the block ends
    await session.delete(deployed)  # the master removed the shard
    async with node.ready("gone.00001", {"docs": 1}) as listed:
        assert listed is False
    assert await session.exists(deployed) is None


async def test_a_shard_dropped_mid_copy_leaves_no_local_files(
        session: Session, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Unassigned (or the session not trusted) while the shard is being copied: the node's
    local copy is deleted, nothing is announced."""
    import examples.katta_like.node as node_module
    from examples.katta_like.corpus import shard_of
    from examples.katta_like.layout import KattaPaths
    from framework.runtime import App

    spec = record("ix", tmp_path, shards=1, replication=1)
    ShardStore(spec.store).build_shard("ix", 0, (d for d in documents(spec.corpus)
                                                 if shard_of(d.url, 1) == 0))
    paths = KattaPaths(App("katta"))
    await session.ensure_path(paths.deployed("ix", 0))
    node = SearchNode(name="n0")
    node.session = session
    node.data_dir = tmp_path / "n0"
    node.address = "127.0.0.1:1"
    scope: list[trio.CancelScope] = []
    real_fetch = node_module.fetch_shard

    def fetch_then_unassigned(*args: object) -> Path:
        local = real_fetch(*args)  # type: ignore[arg-type]
        trio.from_thread.run_sync(scope[0].cancel)  # the assignment went meanwhile
        return local

    monkeypatch.setattr(node_module, "fetch_shard", fetch_then_unassigned)
    shard_spec = records.encode(ShardSpec("ix", 0, spec.store))
    with trio.fail_after(TIMEOUT), trio.CancelScope() as cancel:
        scope.append(cancel)
        await node.serve_shard("ix.00000", shard_spec)
    assert not (node.data_dir / "ix" / "shard-00000").exists()
    assert not node.served
    assert await session.children(paths.deployed("ix", 0)) == []


async def test_a_lost_node_keeps_its_replicas_for_the_grace(
        zk_hosts: str, chroot: str, session: Session, tmp_path: Path) -> None:
    """Safe mode: a node that leaves still counts as live for the master's node grace, so
    its shards are not re-replicated at once (a node that comes back in time keeps them);
    a node that joins meanwhile is used for a rebalance, but the lost node stays planned."""
    from examples.katta_like.layout import KattaPaths
    from framework.runtime import App
    from framework.zk import watch_children

    paths = KattaPaths(App("katta"))
    scopes: dict[str, trio.CancelScope] = {}

    async def run(component: object, task_status: trio.TaskStatus[None]) -> None:
        with trio.CancelScope() as scope:
            scopes[component.name] = scope  # type: ignore[attr-defined]
            task_status.started()
            async with Session(zk_hosts, chroot=chroot, session_timeout=4.0) as s:
                await component.run(s)  # type: ignore[attr-defined]

    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            master = KattaMaster(name="m1")
            master.stable_for = 0.2
            master.node_grace = 3600.0  # longer than the test: the grace never ends here
            await nursery.start(run, master)
            for n in range(3):
                node = SearchNode(name=f"n{n}")
                node.data_dir = tmp_path / f"n{n}"
                await nursery.start(run, node)
            await add_index(session, record("docs", tmp_path, shards=3))
            await wait_state(session, "docs", (IndexState.DEPLOYED,))
            await wait_replicated(session, "docs", 2)
            held = {s for s, shard in (await gather_status(session)).indexes["docs"]
                    .placement.items() if "n2" in shard.planned}
            assert held
            scopes["n2"].cancel()  # n2 leaves: its session closes, its records go
            async for snap in watch_children(session, App("katta").workers):
                if "n2" not in snap.children:
                    break
            late = SearchNode(name="n3")
            late.data_dir = tmp_path / "n3"
            await nursery.start(run, late)
            await wait_serving(session, "n3")  # the master saw n2 gone, then n3 come
            placement = (await gather_status(session)).indexes["docs"].placement
            for shard in held:
                assert "n2" in placement[shard].planned, placement  # still n2's
                assert "n2" not in placement[shard].serving
            assert await session.exists(paths.node("n2")) is not None
            nursery.cancel_scope.cancel()


async def test_a_corrupt_record_is_a_clear_error(zk_hosts: str, chroot: str, session: Session,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """An index or alias record that is not one: a search of it says so in one error, the
    status leaves it out, every reader logs ``katta.bad_record`` with its path, and the
    command that must read it ends in one line naming the znode (exit status 2)."""
    from structlog.testing import capture_logs

    from examples.katta_like.ctl import main
    from examples.katta_like.layout import KattaPaths
    from framework.runtime import App

    paths = KattaPaths(App("katta"))
    await session.ensure_path(paths.indexes)
    await session.create(paths.index("bad"), b"{not json")
    await session.create(paths.alias("old"), b'{"target": 1}', makepath=True)
    with trio.fail_after(TIMEOUT), capture_logs() as logs:
        async with SearchClient.open(session) as client:
            with pytest.raises(FrameworkError, match=(
                    r"cannot search index 'bad': .*/katta/indexes/bad: not a IndexRecord "
                    r"record: not JSON")):
                await client.search("x", index="bad")
        status = await gather_status(session)
    assert "bad" not in status.indexes and "old" not in status.aliases
    bad = {e["path"] for e in logs if e["event"] == "katta.bad_record"}
    assert bad == {paths.index("bad"), paths.alias("old")}
    capsys.readouterr()
    code = await trio.to_thread.run_sync(main, [
        "remove", "bad", "--zk", zk_hosts, "--chroot", chroot])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err
    assert [line for line in err.splitlines() if line.startswith("katta: error")] == [
        f"katta: error: {paths.index('bad')}: not a IndexRecord record: not JSON "
        "(Expecting property name enclosed in double quotes: line 1 column 2 (char 1))"]


async def test_term_statistics_are_kept_per_index_version(
        zk_hosts: str, chroot: str, session: Session, tmp_path: Path) -> None:
    """A query whose terms were all seen in this index version skips the statistics round
    (and is scored as one index would); the same name removed and added again is another
    version (another record znode): its statistics are gathered again."""
    from examples.katta_like.load import reference
    from examples.katta_like.wire import Answer, Kind, ShardRequest

    stats = Kind.STATS
    with trio.fail_after(TIMEOUT):
        async with cluster(zk_hosts, chroot, tmp_path, nodes=2):
            async with SearchClient.open(session) as client:
                rounds: list[Kind] = []
                call = client._call

                async def counted(address: str, kind: Kind, request: ShardRequest) -> Answer:
                    rounds.append(kind)
                    return await call(address, kind, request)

                client._call = counted  # type: ignore[method-assign]
                spec = record("ix", tmp_path)
                words = [q for q in dict.fromkeys(sample_queries(spec.corpus, 30))
                         if " " not in q][:2]
                both = f"{words[1]} {words[0]}"
                want = reference(spec.corpus, tmp_path, [both], 10)[both]
                for _version in range(2):
                    await add_index(session, spec)
                    await wait_replicated(session, "ix", 2)
                    await client.wait_routable("ix", 2)
                    for word in words:
                        rounds.clear()
                        assert not (await client.search(word, index="ix")).partial
                        assert stats in rounds  # a term not seen yet in this version
                    rounds.clear()
                    result = await client.search(both, index="ix")
                    assert stats not in rounds and rounds  # searched, no statistics round
                    assert not result.partial and result.count == want.count
                    assert want.correct([hit.url for hit in result.hits]) == 1.0
                    for hit in result.hits:
                        assert abs(hit.score - want.scores[hit.url]) < 1e-4
                    await remove_index(session, "ix")
                    await wait_gone(session, "ix")


async def test_an_index_added_again_under_its_name_is_built_again(
        zk_hosts: str, chroot: str, session: Session, tmp_path: Path) -> None:
    """Removed and added again with another corpus and store, the same name is a new
    incarnation (a new record znode): its shards are built again, not taken for done from
    the first one's build results, and searches count the new corpus."""
    from examples.katta_like.load import reference

    first = record("again", tmp_path / "one", docs=200, seed=3)
    second = record("again", tmp_path / "two", docs=260, seed=5)
    with trio.fail_after(TIMEOUT):
        async with cluster(zk_hosts, chroot, tmp_path, nodes=2):
            await add_index(session, first)
            assert (await wait_state(session, "again", (IndexState.DEPLOYED,
                                                        IndexState.ERROR))).state \
                is IndexState.DEPLOYED
            await remove_index(session, "again")
            await wait_gone(session, "again")
            await add_index(session, second)
            done = await wait_state(session, "again", (IndexState.DEPLOYED, IndexState.ERROR))
            assert done.state is IndexState.DEPLOYED, done.error
            await wait_replicated(session, "again", 2)
            query = sample_queries(second.corpus, 1)[0]
            want = reference(second.corpus, tmp_path, [query], 10)[query]
            async with SearchClient.open(session) as client:
                await client.wait_routable("again", 2)
                result = await client.search(query, index="again")
    assert not result.partial and result.count == want.count
    assert (tmp_path / "two").exists()  # built into the second store


async def test_replicas_are_routed_by_deployment_and_registration(
        session: Session, tmp_path: Path) -> None:
    """The client routes a shard to a node only while the node has both a deployment record
    (it serves the shard) and a discovery instance (where it answers, from the node itself);
    a registration without a deployment, or the reverse, routes nothing."""
    from examples.katta_like.layout import DeploymentInfo, KattaPaths, discovery, node_instance
    from framework.runtime import App

    paths = KattaPaths(App("katta"))
    spec = record("ix", tmp_path, shards=1, replication=1)
    await session.create(paths.index("ix"), records.encode(spec), makepath=True)
    await session.ensure_path(paths.deployed("ix", 0))
    await session.create(f"{paths.deployed('ix', 0)}/n9",
                         records.encode(DeploymentInfo(docs=5)), ephemeral=True)
    n9 = node_instance(paths, "n9", "10.9.9.9:7009", tls=False)
    n8 = node_instance(paths, "n8", "10.9.9.8:7008", tls=False)
    with trio.fail_after(TIMEOUT):
        async with SearchClient.open(session) as client, \
                discovery(session).register(n8):
            assert await client.deployment("ix") == {0: {}}  # n9 serves, not registered
            async with discovery(session).register(n9):
                await client.wait_routable("ix")
                assert await client.deployment("ix") == {0: {"n9": "10.9.9.9:7009"}}
            view = await client.view("ix")
            while view.replicas[0]:  # unregistered: no longer routed to
                await view.changed.wait()
