"""Katta-like search under frozen nodes (issue #24), against the real ZooKeeper: a node
process paused with SIGSTOP right after it announced a moved replica is never left as the
only replica; a node paused for less than its session timeout keeps its local copies; a
shard missing from the statistics round makes the result partial."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio

from examples.katta_like.client import SearchClient
from examples.katta_like.cluster import Cluster, wait_serving
from examples.katta_like.corpus import CorpusSpec, sample_queries
from examples.katta_like.ctl import add_index, wait_balanced, wait_replicated, wait_state
from examples.katta_like.layout import IndexRecord, IndexState, KattaPaths
from examples.katta_like.load import LoadStats, reference, run_load
from examples.katta_like.master import KattaMaster
from examples.katta_like.node import SearchNode
from examples.katta_like.wire import ErrorReply, Kind, SearchReply, ShardRequest, StatsReply
from framework import Session
from framework.runtime import App, Plan
from framework.zk import watch_children, watch_data

SPEC = CorpusSpec(docs=400, seed=7)
PATHS = KattaPaths(App("katta"))


async def deploy(session: Session, tmp: Path, shards: int, replication: int) -> None:
    await add_index(session, IndexRecord("docs", shards, replication, str(tmp / "store"),
                                         SPEC))
    record = await wait_state(session, "docs", (IndexState.DEPLOYED, IndexState.ERROR))
    assert record is not None and record.state is IndexState.DEPLOYED, record
    await wait_replicated(session, "docs", replication)
    await wait_balanced(session, "docs")  # no move in flight (a fault test starts settled)


def checked(stats: LoadStats) -> None:
    assert stats.failed == 0, stats.errors
    assert stats.partial == 0
    assert stats.wrong_counts == 0
    assert stats.answered == stats.sent and stats.answered > 0


async def test_node_frozen_right_after_announcing_a_moved_replica_is_never_alone(
        zk_hosts: str, chroot: str, session: Session, tmp_path: Path) -> None:
    """R=1, a move n1 -> n2: n2 is stopped (SIGSTOP) as soon as its record appears.  Its
    record is not confirmed, so n1 is never dropped: n1's record stays through the pause,
    every query is complete; n2's session expires, the move is undone, and after SIGCONT
    n2 (a new session) takes its share properly."""
    queries = sample_queries(SPEC, 30)
    expected = reference(SPEC, tmp_path, list(dict.fromkeys(queries)), 10)
    async with Cluster(zk_hosts, chroot, tmp_path) as cluster:
        with trio.fail_after(60):
            await cluster.start_master("m1")
            await cluster.start_node("n1")
            await deploy(session, tmp_path, shards=2, replication=1)
            stats, stop = LoadStats(), trio.Event()
            moved: list[int] = []
            frozen = trio.Event()
            seen: dict[int, list[set[str]]] = {0: [], 1: []}  # deployed/ states while frozen

            observing = trio.CancelScope()

            async def follow(shard: int) -> None:
                async for snap in watch_children(session, PATHS.deployed("docs", shard)):
                    nodes = set(snap.children)
                    if "n2" in nodes and not frozen.is_set():
                        cluster.procs["n2"].pause()
                        moved.append(shard)
                        frozen.set()
                    if frozen.is_set():
                        seen[shard].append(nodes)

            async def observe() -> None:
                with observing:
                    async with trio.open_nursery() as observers:
                        for shard in (0, 1):
                            observers.start_soon(follow, shard)

            async with SearchClient.open(session) as client, trio.open_nursery() as nursery:
                nursery.start_soon(run_load, client, queries, expected, stats, stop)
                nursery.start_soon(observe)
                await cluster.start_node("n2")  # loads 2 and 0: one shard moves to n2
                await frozen.wait()
                shard = moved[0]
                # n2's session expires, the leader gives up the move (n2 leaves the plan)
                async for snap in watch_data(session, PATHS.plan("docs", shard)):
                    if snap.data and "n2" not in Plan.decode(snap.data).workers:
                        break
                observing.cancel()
                cluster.procs["n2"].resume()
                await wait_serving(session, "n2")  # back, in a new session, and given a shard
                plan = await wait_balanced(session, "docs")
                assert sorted(len(nodes) for nodes in plan.values()) == [1, 1]
                assert {n for nodes in plan.values() for n in nodes} == {"n1", "n2"}
                stop.set()
            # while n2 was frozen (and until the move was undone) n1 kept serving the shard
            assert seen[shard] and all("n1" in nodes for nodes in seen[shard]), seen
            checked(stats)


async def test_node_paused_shorter_than_its_session_keeps_its_local_copies(
        zk_hosts: str, chroot: str, session: Session, tmp_path: Path) -> None:
    """A node paused (SIGSTOP) past its trust deadline but for less than its session
    timeout stops serving, then serves the same shards again from its local copies
    (verified against the manifest and reopened: the same directories), not copied
    again.  Queries stay complete meanwhile."""
    queries = sample_queries(SPEC, 30)
    expected = reference(SPEC, tmp_path, list(dict.fromkeys(queries)), 10)
    async with Cluster(zk_hosts, chroot, tmp_path) as cluster:
        with trio.fail_after(60):
            await cluster.start_master("m1")
            for n in ("n1", "n2"):
                await cluster.start_node(n)
            await deploy(session, tmp_path, shards=2, replication=2)
            local = [tmp_path / "nodes" / "n1" / "docs" / f"shard-{s:05d}" for s in (0, 1)]
            inodes = [d.stat().st_ino for d in local]
            records = [f"{PATHS.deployed('docs', s)}/n1" for s in (0, 1)]
            created = [(await session.exists(r)).czxid for r in records]  # type: ignore[union-attr]
            stats, stop = LoadStats(), trio.Event()
            async with SearchClient.open(session) as client, trio.open_nursery() as nursery:
                nursery.start_soon(run_load, client, queries, expected, stats, stop)
                cluster.procs["n1"].pause()
                await trio.sleep(cluster.session_timeout * 0.75)  # the pause itself
                cluster.procs["n1"].resume()
                # it stopped serving (past its trust deadline) and serves again: new records
                for record, old in zip(records, created, strict=True):
                    async for snap in watch_data(session, record):
                        if snap.stat is not None and snap.stat.czxid != old:
                            break
                stop.set()
            assert [d.stat().st_ino for d in local] == inodes  # reopened, not copied again
            log = (tmp_path / "logs" / "n1.log").read_text()
            assert "shard.reopened" in log and "shard.copy_kept" in log
            checked(stats)


class StatsRefused(SearchNode):
    """A node that answers the statistics round for every shard but ``refused``."""

    refused = 1

    def _answer(self, kind: Kind, request: ShardRequest
                ) -> StatsReply | SearchReply | ErrorReply:
        answer = super()._answer(kind, request)
        if isinstance(answer, StatsReply) and self.refused in answer.shards:
            shards = {s: a for s, a in answer.shards.items() if s != self.refused}
            refused = answer.refused | {self.refused: "no statistics (test)"}
            return StatsReply(shards, refused)
        return answer


async def test_a_shard_missing_from_the_statistics_makes_the_result_partial(
        zk_hosts: str, chroot: str, session: Session, tmp_path: Path) -> None:
    """Global scoring: a shard that answered the search but not the statistics round would
    be scored with statistics that leave it out; it is reported missing instead."""

    async def run(component: Any) -> None:
        async with Session(zk_hosts, chroot=chroot, session_timeout=4.0) as s:
            await component.run(s)

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            master = KattaMaster(name="m1")
            master.stable_for = master.node_grace = 0.2
            nursery.start_soon(run, master)
            node = StatsRefused(name="n0")
            node.data_dir = tmp_path / "n0"
            nursery.start_soon(run, node)
            await deploy(session, tmp_path, shards=2, replication=1)
            async with SearchClient.open(session) as client:
                result = await client.search(sample_queries(SPEC, 1)[0], index="docs")
                assert result.partial and result.missing == [1] and result.answered == [0]
                assert all(hit.shard == 0 for hit in result.hits)
            async with SearchClient.open(session, scoring="local") as local:
                # no statistics round: both shards answer
                whole = await local.search(sample_queries(SPEC, 1)[0], index="docs")
                assert not whole.partial and whole.answered == [0, 1]
            nursery.cancel_scope.cancel()
