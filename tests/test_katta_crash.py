"""Katta-like search under faults, against the real ZooKeeper: kill -9 of a search node
process under query load, a node process frozen (SIGSTOP: a slow replica's shards are also
sent to another replica, a hedge), kill -9 of the active master during a rebalance, a node
whose ZooKeeper connection is frozen (the project's proxy)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio

from examples.katta_like.client import SearchClient
from examples.katta_like.cluster import Cluster, active_master, wait_new_master
from examples.katta_like.corpus import CorpusSpec, sample_queries
from examples.katta_like.ctl import add_index, wait_balanced, wait_replicated, wait_state
from examples.katta_like.layout import IndexRecord, IndexState, KattaPaths
from examples.katta_like.load import LoadStats, reference, run_load
from examples.katta_like.master import KattaMaster
from examples.katta_like.node import SearchNode
from examples.katta_like.wire import Answer, Kind, ShardRequest
from framework import Session
from framework.runtime import App, Plan
from framework.testing import TcpProxy
from framework.zk import watch_children, watch_data

SPEC = CorpusSpec(docs=600, seed=5)


async def deploy(session: Session, tmp: Path, shards: int, name: str = "docs") -> None:
    await add_index(session, IndexRecord(name, shards, 2, str(tmp / "store"), SPEC))
    record = await wait_state(session, name, (IndexState.DEPLOYED, IndexState.ERROR))
    assert record is not None and record.state is IndexState.DEPLOYED, record
    await wait_replicated(session, name, 2)
    await wait_balanced(session, name)  # no move in flight (a fault test starts settled)


async def start(cluster: Cluster, session: Session, tmp: Path, *,
                masters: tuple[str, ...] = ("m1",),
                nodes: tuple[str, ...] = ("n1", "n2", "n3")) -> None:
    """Start the masters and nodes as processes, and deploy 4 shards x 2 on them."""
    for name in masters:
        await cluster.start_master(name)
    for name in nodes:
        await cluster.start_node(name)
    await deploy(session, tmp, shards=4)


def checked(stats: LoadStats) -> None:
    assert stats.failed == 0, stats.errors
    assert stats.partial == 0
    assert stats.wrong_counts == 0
    assert stats.answered == stats.sent and stats.answered > 0


async def test_kill9_node_under_query_load(zk_hosts: str, chroot: str, session: Session,
                                           tmp_path: Path) -> None:
    queries = sample_queries(SPEC, 40)
    expected = reference(SPEC, tmp_path, list(dict.fromkeys(queries)), 10)
    async with Cluster(zk_hosts, chroot, tmp_path) as cluster:
        with trio.fail_after(60):
            await start(cluster, session, tmp_path)
            stats, stop = LoadStats(), trio.Event()
            async with SearchClient.open(session) as client, trio.open_nursery() as nursery:
                nursery.start_soon(run_load, client, queries, expected, stats, stop)
                await cluster.kill9("n2")
                sent_at_kill = stats.sent
                await wait_replicated(session, "docs", 2, exclude={"n2"})
                plan = await wait_balanced(session, "docs")
                assert all("n2" not in nodes for nodes in plan.values())
                assert stats.sent > sent_at_kill  # the load ran through the recovery
                stop.set()
            checked(stats)


async def test_stopped_node_times_out_and_another_replica_answers(
        zk_hosts: str, chroot: str, session: Session, tmp_path: Path) -> None:
    """A node process frozen with SIGSTOP accepts connections and never answers: a query
    that asked it is hedged (its shards are also asked of another replica once the request
    is slower than recent ones allow, long before its ``shard_timeout``) and is complete and
    right; no query of the load fails, none is partial or wrong; once its session expires
    the node is replaced.

    The node is frozen by a probe client of its own, right before that client's call to it
    goes out: the probe's query certainly meets the frozen replica.  (Frozen first, a probe
    sharing the load's client could miss it for good: the first query to meet it marks it
    suspect for 5 s, longer than the 4 s until its session expires and nobody routes to it.)
    """
    queries = sample_queries(SPEC, 40)
    expected = reference(SPEC, tmp_path, list(dict.fromkeys(queries)), 10)
    async with Cluster(zk_hosts, chroot, tmp_path) as cluster:
        with trio.fail_after(60):
            await start(cluster, session, tmp_path)
            stats, stop = LoadStats(), trio.Event()
            async with SearchClient.open(session, shard_timeout=5.0) as client, \
                    SearchClient.open(session, shard_timeout=5.0) as probe, \
                    trio.open_nursery() as nursery:
                nursery.start_soon(run_load, client, queries, expected, stats, stop)
                await probe.wait_routable("docs", 2)
                stopped = {nodes["n2"] for nodes in (await probe.deployment("docs")).values()
                           if "n2" in nodes}
                met: list[str] = []  # the probe's calls to n2, once frozen
                call = probe._call

                async def freezing(address: str, kind: Kind, request: ShardRequest) -> Answer:
                    if address in stopped:
                        if not met:
                            cluster.procs["n2"].pause()
                        met.append(address)
                    return await call(address, kind, request)

                probe._call = freezing  # type: ignore[method-assign]
                n = 0
                while not met:  # the probe picks replicas at random: until it picks n2
                    query = queries[n % len(queries)]
                    n += 1
                    result = await probe.search(query, index="docs")
                    assert not result.partial and result.count == expected[query].count
                assert result.hedged  # the query that met the frozen node hedged
                assert result.hedged <= result.retries  # a hedge is a retry that was sent
                await wait_replicated(session, "docs", 2, exclude={"n2"})
                stop.set()
            checked(stats)


async def test_kill9_active_master_during_rebalance(zk_hosts: str, chroot: str,
                                                   session: Session, tmp_path: Path) -> None:
    queries = sample_queries(SPEC, 40)
    expected = reference(SPEC, tmp_path, list(dict.fromkeys(queries)), 10)
    paths = KattaPaths(App("katta"))
    async with Cluster(zk_hosts, chroot, tmp_path) as cluster:
        with trio.fail_after(60):
            await start(cluster, session, tmp_path, masters=("m1", "m2"), nodes=("n1", "n2"))
            stats, stop = LoadStats(), trio.Event()
            serving: list[int] = []  # every serving count seen, any shard, through the moves
            planned: list[int] = []  # every planned replica count seen
            async with SearchClient.open(session) as client, trio.open_nursery() as nursery, \
                    trio.open_nursery() as observers:
                nursery.start_soon(run_load, client, queries, expected, stats, stop)
                for shard in range(4):
                    observers.start_soon(observe, session, paths.deployed("docs", shard),
                                         serving, None)
                    observers.start_soon(observe, session, paths.plan('docs', shard),
                                         None, planned)
                leader = await active_master(session)
                await session.ensure_path(paths.node("n3"))
                await cluster.start_node("n3")
                # the rebalance has begun once n3 is given its first replica: kill -9 then
                async for snap in watch_children(session, paths.node("n3")):
                    if snap.children:
                        break
                await cluster.kill9(leader or "m1")
                successor = await wait_new_master(session, leader)
                assert successor != leader
                plan = await wait_balanced(session, "docs")
                assert sum("n3" in nodes for nodes in plan.values()) >= 2
                stop.set()
                observers.cancel_scope.cancel()
            checked(stats)
            # no move left a shard under-served (a new replica served before an old one went;
            # no node died here), none planned more than R+1 replicas, across the master change
            assert min(serving) >= 2, serving
            assert max(planned) <= 3 and 3 in planned, planned


async def observe(session: Session, path: str, children: list[int] | None,
                  plan: list[int] | None) -> None:
    """Record each state of ``path`` seen by a watch: its number of children, or the
    number of nodes in the plan it holds (states between two reads may be missed, so this
    can only miss a violation, never invent one)."""
    if children is not None:
        async for snap in watch_children(session, path):
            children.append(len(snap.children))
    else:
        assert plan is not None
        async for data in watch_data(session, path):
            if data.data:
                plan.append(len(Plan.decode(data.data).workers))


class WatchedNode(SearchNode):
    """A search node that says when it serves nothing any more."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.idle = trio.Event()

    def status_changed(self) -> None:
        super().status_changed()
        if not self.served:
            self.idle.set()


async def test_frozen_node_stops_serving_and_is_replaced(
        zk_hosts: str, chroot: str, session: Session, proxy: TcpProxy, tmp_path: Path) -> None:
    queries = sample_queries(SPEC, 30)
    expected = reference(SPEC, tmp_path, list(dict.fromkeys(queries)), 10)
    frozen = WatchedNode(name="nf")
    frozen.data_dir = tmp_path / "nf"
    paths = KattaPaths(App("katta"))

    async def run(component: object, hosts: str) -> None:
        async with Session(hosts, chroot=chroot, session_timeout=4.0) as s:
            await component.run(s)  # type: ignore[attr-defined]

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            master = KattaMaster(name="m1")
            master.stable_for = master.node_grace = 0.2
            nursery.start_soon(run, master, zk_hosts)
            for n in ("n0", "n1"):
                node = SearchNode(name=n)
                node.data_dir = tmp_path / n
                node.store = frozen.store
                nursery.start_soon(run, node, zk_hosts)
            nursery.start_soon(run, frozen, proxy.address)
            await deploy(session, tmp_path, shards=3)
            held = sorted(frozen.served)
            assert held  # 6 replicas over 3 nodes: it serves 2 shards
            stats, stop = LoadStats(), trio.Event()
            async with SearchClient.open(session) as client, trio.open_nursery() as load:
                load.start_soon(run_load, client, queries, expected, stats, stop)
                frozen.idle = trio.Event()
                proxy.freeze()
                await frozen.idle.wait()
                # it stopped serving when its session could no longer be trusted: before
                # the server expired that session, so its records are still there
                records = [await session.exists(f"{paths.deployed(index, shard)}/nf")
                           for index, shard in held]
                assert all(r is not None for r in records)
                answered = frozen.queries
                await wait_replicated(session, "docs", 2, exclude={"nf"})
                stop.set()
            checked(stats)
            assert frozen.queries == answered  # no search answered by it after that
            proxy.unfreeze()
            nursery.cancel_scope.cancel()
