"""TreeCache and NodeCache against the real server: a persistent recursive watch (ZooKeeper
3.6) or per-node watches; the view equals the server's tree after churn, after a dropped
connection (changes made meanwhile) and after a session expiry.

Convergence is waited for on the cache's own events: after each event the view is compared
with the server's tree, read by another session."""

from __future__ import annotations

import random

import pytest
import trio

from framework import Session
from framework.primitives import NodeCache, TreeCache, TreeView
from framework.testing import TcpProxy, expire_session
from framework.zkserver import watched_paths


async def server_tree(session: Session, root: str) -> dict[str, bytes]:
    """Every node under ``root`` (included) with its data, read from the server."""
    tree: dict[str, bytes] = {}

    async def visit(path: str) -> None:
        try:
            data, _stat = await session.get(path)
            kids = await session.children(path)
        except Exception:  # deleted while read: the caller compares again
            return
        tree[path] = data
        for kid in kids:
            await visit(f"{path.rstrip('/')}/{kid}")

    await visit(root)
    return tree


def cached_tree(view: TreeView) -> dict[str, bytes]:
    return {path: node.data for path, node in view.nodes.items()}


async def converged(view: TreeView, writer: Session, root: str) -> dict[str, bytes]:
    """Wait until the view equals the server's tree (compared again after each event)."""
    async with view.events() as events:
        await view.ready.wait()
        while True:
            await writer.sync(root)
            expected = await server_tree(writer, root)
            if cached_tree(view) == expected:
                return expected
            await events.receive()


async def churn(session: Session, root: str, rng: random.Random, steps: int) -> None:
    """Creates, updates and deletes (whole subtrees too) at random under ``root``.  The tree
    is read from the server once; then ``session``, its only writer, keeps the paths itself
    (the same choices as reading it before each step, without a whole tree's reads per step)."""
    known = set(await server_tree(session, root))
    for _ in range(steps):
        paths = sorted(known)
        action = rng.random()
        if action < 0.5 or len(paths) < 3:
            parent = rng.choice(paths)
            if parent.count("/") - root.count("/") < 3:
                child = f"{parent}/n{rng.randrange(10**6)}"
                await session.create(child, b"%d" % rng.random())
                known.add(child)
        elif action < 0.8:
            await session.set(rng.choice(paths), b"v%d" % rng.randrange(1000))
        else:
            victim = rng.choice(paths[1:])
            await session.delete_tree(victim)
            known -= {p for p in known if p == victim or p.startswith(f"{victim}/")}


@pytest.mark.parametrize("persistent", [True, False], ids=["persistent-watch", "per-node"])
async def test_the_view_equals_the_tree_after_churn(
    zk_hosts: str, chroot: str, persistent: bool
) -> None:
    rng = random.Random(7)
    async with Session(zk_hosts, chroot=chroot) as writer, \
            Session(zk_hosts, chroot=chroot) as reader:
        await writer.create("/t", b"root")
        for i in range(20):
            await writer.create(f"/t/a{i}", b"%d" % i)
            await writer.create(f"/t/a{i}/b", b"deep")
        with trio.fail_after(60):
            async with TreeCache(reader, "/t", persistent=persistent).running() as view:
                first = await converged(view, writer, "/t")
                assert len(first) == 41
                await churn(writer, "/t", rng, 120)
                final = await converged(view, writer, "/t")
                assert view.children("/t") == sorted(p.rsplit("/", 1)[1] for p in final
                                                      if p.count("/") == 2)
                await writer.delete_tree("/t")
                await converged(view, writer, "/t")
                assert view.paths() == []
                await writer.create("/t", b"again")
                assert await converged(view, writer, "/t") == {"/t": b"again"}


@pytest.mark.parametrize("persistent", [True, False], ids=["persistent-watch", "per-node"])
async def test_changes_while_disconnected_are_caught_up(
    zk_hosts: str, chroot: str, proxy: TcpProxy, persistent: bool
) -> None:
    """The cache's link is frozen until the session is suspended; meanwhile nodes are
    created, changed and deleted.  The same session reconnects: the view catches up
    (persistent watches: a walk, and nodes the walk no longer finds are dropped).  The
    changes are made while the session is being suspended, not after: the link comes back
    right at the suspension, a third of the session timeout before the server would expire
    the session (done after, the writes used up that margin on a loaded machine)."""
    async with Session(zk_hosts, chroot=chroot) as writer, \
            Session(proxy.address, chroot=chroot, session_timeout=6.0) as reader:
        for name in ("keep", "change", "drop", "dropdeep"):
            await writer.create(f"/t/{name}", b"1", makepath=True)
        await writer.create("/t/dropdeep/x", b"1")
        with trio.fail_after(60):
            async with TreeCache(reader, "/t", persistent=persistent).running() as view:
                await converged(view, writer, "/t")
                session_id = reader.session_id
                proxy.freeze()

                async def changes() -> None:
                    await writer.set("/t/change", b"2")
                    await writer.delete("/t/drop")
                    await writer.delete_tree("/t/dropdeep")
                    await writer.create("/t/new", b"n")
                    await writer.create("/t/new/kid", b"k")

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(changes)
                    async for change in reader.states():
                        if change.state.name == "SUSPENDED":
                            break
                proxy.unfreeze()
                final = await converged(view, writer, "/t")
                assert reader.session_id == session_id  # the same session, reconnected
    assert final == {"/t": b"", "/t/keep": b"1", "/t/change": b"2", "/t/new": b"n",
                     "/t/new/kid": b"k"}


async def test_a_new_session_after_expiry_walks_the_tree_again(
    zk_hosts: str, chroot: str
) -> None:
    async with Session(zk_hosts, chroot=chroot) as writer, \
            Session(zk_hosts, chroot=chroot, session_timeout=2.0) as reader:
        await writer.create("/t/a", b"1", makepath=True)
        with trio.fail_after(60):
            async with TreeCache(reader, "/t").running() as view:
                await converged(view, writer, "/t")
                first_session = view.session_id
                await expire_session(reader)
                await writer.create("/t/b", b"2")
                await writer.delete("/t/a")
                await converged(view, writer, "/t")
                while view.session_id == first_session:  # the walk of the new session
                    async with view.events() as events:
                        await events.receive()
                assert view.paths() == ["/t", "/t/b"]


async def test_events_come_in_order_and_the_server_holds_one_watch(
    zk_hosts: str, chroot: str
) -> None:
    """One node's history seen through a NodeCache, in order; a TreeCache of 201 nodes
    holds one watch on the server with a persistent recursive watch, and watches on all 201
    paths without (the session's watches, as the server lists them)."""
    async with Session(zk_hosts, chroot=chroot) as writer, \
            Session(zk_hosts, chroot=chroot) as reader:
        seen: list[tuple[str, bytes | None]] = []
        with trio.fail_after(30):
            async with NodeCache(reader, "/n").running() as view:
                await view.ready.wait()
                assert view.get("/n") is None
                async with view.events() as events:
                    await writer.create("/n", b"1")
                    await writer.create("/n/kid", b"ignored: below the node")
                    await writer.set("/n", b"2")
                    await writer.delete("/n/kid")
                    await writer.delete("/n")
                    await writer.create("/n", b"3")
                    while len(seen) < 4:
                        event = await events.receive()
                        seen.append((event.kind, event.data))
                node = view.get("/n")
                assert node is not None and node.data == b"3"
        assert seen == [("added", b"1"), ("updated", b"2"), ("removed", None), ("added", b"3")]
        for i in range(200):
            await writer.create(f"/big/n{i}", b"", makepath=True)
        for persistent, held in ((True, 1), (False, 201)):
            async with Session(zk_hosts, chroot=chroot) as watcher:
                with trio.fail_after(30):
                    async with TreeCache(watcher, "/big", persistent=persistent).running() as view:
                        await converged(view, writer, "/big")
                        assert len(view.paths()) == 201
                        assert watched_paths(zk_hosts, watcher.session_id or 0) == held


