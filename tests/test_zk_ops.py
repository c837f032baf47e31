"""Every Session operation and its errors, against the real server."""

from __future__ import annotations

import pytest
import trio

from framework import (
    BadVersionError,
    DataTooLargeError,
    InvalidPathError,
    NoAuthError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    Session,
    TransactionFailedError,
)
from framework.errors import ConfigurationError, NoChildrenForEphemeralsError, RolledBackError
from framework.zk import MAX_DATA_BYTES, create_protected, new_guid, sequence_of


async def test_create_get_set_delete_roundtrip(session: Session) -> None:
    assert await session.create("/a", b"one") == "/a"
    data, stat = await session.get("/a")
    assert data == b"one" and stat.version == 0
    stat = await session.set("/a", b"two")
    assert stat.version == 1
    assert (await session.get("/a"))[0] == b"two"
    assert (await session.exists("/a")).version == 1
    await session.delete("/a")
    assert await session.exists("/a") is None


async def test_missing_and_existing_nodes_raise_typed_errors(session: Session) -> None:
    with pytest.raises(NoNodeError):
        await session.get("/missing")
    with pytest.raises(NoNodeError):
        await session.set("/missing", b"")
    with pytest.raises(NoNodeError):
        await session.delete("/missing")
    await session.delete("/missing", missing_ok=True)
    with pytest.raises(NoNodeError):
        await session.create("/no/parent")
    await session.create("/x")
    with pytest.raises(NodeExistsError):
        await session.create("/x")
    await session.create("/x/child")
    with pytest.raises(NotEmptyError):
        await session.delete("/x")


async def test_conditional_updates_use_versions(session: Session) -> None:
    await session.create("/v", b"0")
    await session.set("/v", b"1", version=0)
    with pytest.raises(BadVersionError):
        await session.set("/v", b"stale", version=0)
    with pytest.raises(BadVersionError):
        await session.delete("/v", version=0)
    await session.delete("/v", version=1)


async def test_sequential_and_ephemeral_and_makepath(zk_hosts: str, session: Session) -> None:
    first = await session.create("/q/item-", b"", sequence=True, makepath=True)
    second = await session.create("/q/item-", b"", sequence=True)
    assert sequence_of(second) == sequence_of(first) + 1
    assert sorted(await session.children("/q")) == [first.split("/")[-1], second.split("/")[-1]]
    _kids, stat = await session.children_stat("/q")
    assert stat.numChildren == 2 and stat.cversion == 2
    eph = await session.create("/eph", b"", ephemeral=True)
    with pytest.raises(NoChildrenForEphemeralsError):
        await session.create(eph + "/child")
    async with Session(zk_hosts, chroot=session.chroot) as other:
        owner = await other.create("/other-eph", ephemeral=True)
        assert (await session.exists(owner)).ephemeralOwner == other.session_id
    # closing the other session removes its ephemeral node at once
    assert await session.exists("/other-eph") is None


async def test_chroot_isolates_paths(zk_hosts: str, session: Session) -> None:
    await session.create("/inside", b"1")
    async with Session(zk_hosts) as root:
        assert (await root.get(f"{session.chroot}/inside"))[0] == b"1"
        assert await root.exists("/inside") is None


async def test_transaction_commits_atomically(session: Session) -> None:
    results = await (
        session.transaction().create("/t", b"a").create("/t/b", b"b").check("/t", 0).commit()
    )
    assert results == ["/t", "/t/b", True]
    with pytest.raises(TransactionFailedError) as info:
        await session.transaction().create("/t/c").set("/t", b"x", version=7).commit()
    err = info.value
    assert err.failed_index == 1
    assert isinstance(err.cause, BadVersionError)
    assert isinstance(err.results[0], RolledBackError)
    assert await session.exists("/t/c") is None, "a failed transaction applied nothing"
    assert await session.transaction().commit() == []


async def test_sync(zk_hosts: str, chroot: str, session: Session) -> None:
    """``sync`` goes to the server and returns; a bad path is refused before it leaves.  On
    a standalone server every read is already up to date, so this cannot show the barrier:
    ``test_netns_partitions.py::test_sync_makes_a_lagging_follower_catch_up_before_the_read``
    does, with a follower that deterministically lags."""
    async with Session(zk_hosts, chroot=chroot) as writer:
        for version in range(5):
            await writer.create(f"/s{version}", str(version).encode())
            await session.sync(f"/s{version}")
            assert (await session.get(f"/s{version}"))[0] == str(version).encode()
    with pytest.raises(InvalidPathError):
        await session.sync("no-slash")
    await session.sync("/never-created")  # sync needs no node: it is a barrier, not a read
    with pytest.raises(InvalidPathError):
        await session.sync("/trailing/")


async def test_delete_tree_and_ensure_path(session: Session) -> None:
    await session.ensure_path("/d/e/f")
    await session.ensure_path("/d/e/f")
    await session.create("/d/e/g", b"")
    await session.delete_tree("/d")
    assert await session.exists("/d") is None
    await session.delete_tree("/d")


@pytest.mark.parametrize(
    "path", ["relative", "/trailing/", "/double//slash", "/dot/./x", "/up/../x", "/nul\x00"]
)
async def test_invalid_paths_give_clear_errors(session: Session, path: str) -> None:
    with pytest.raises(InvalidPathError) as info:
        await session.create(path)
    assert repr(path) in str(info.value) or "absolute" in str(info.value)


async def test_data_size_limit_matches_the_server(session: Session) -> None:
    # the largest payload we allow is really accepted by ZooKeeper ...
    await session.create("/big", b"x" * MAX_DATA_BYTES)
    assert len((await session.get("/big"))[0]) == MAX_DATA_BYTES
    # ... and one byte more is refused before it leaves the process, with a clear message
    with pytest.raises(DataTooLargeError, match="at most"):
        await session.set("/big", b"x" * (MAX_DATA_BYTES + 1))
    with pytest.raises(DataTooLargeError, match="bytes"):
        await session.create("/text", "not bytes")  # type: ignore[arg-type]


def test_bad_session_settings_are_rejected() -> None:
    with pytest.raises(ConfigurationError):
        Session("")
    with pytest.raises(ConfigurationError, match="chroot"):
        Session("127.0.0.1:2181/chroot")
    with pytest.raises(InvalidPathError):
        Session("127.0.0.1:2181", chroot="relative")
    for hosts in ("127.0.0.1:99999", "a:b", ",", "host:-1"):
        with pytest.raises(ConfigurationError, match="bad ZooKeeper hosts"):
            Session(hosts)
    with pytest.raises(ConfigurationError, match="session_timeout must be a number"):
        Session("127.0.0.1:2181", session_timeout="10")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="third of the session timeout"):
        Session("127.0.0.1:2181", session_timeout=6, suspended_grace=2)
    Session("127.0.0.1:2181", session_timeout=6, suspended_grace=1.9)


async def test_in_flight_requests_are_bounded(zk_hosts: str, chroot: str) -> None:
    async with Session(zk_hosts, chroot=chroot, max_in_flight=4) as s:
        await s.create("/n", b"v")
        peak = 0

        async def reader() -> None:
            nonlocal peak
            peak = max(peak, s._limit.in_use)
            assert (await s.get("/n"))[0] == b"v"
            peak = max(peak, s._limit.in_use)

        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                for _ in range(200):
                    nursery.start_soon(reader)
        assert 1 <= peak <= 4


async def test_protected_create_finds_its_node_by_guid(session: Session) -> None:
    guid = new_guid()
    path = await create_protected(session, "/p", "lock-", guid=guid)
    assert guid in path and (await session.exists(path)).ephemeralOwner == session.session_id


async def test_a_burst_of_concurrent_creates_all_complete(session: Session) -> None:
    """500 requests issued from 500 tasks in one scheduling batch are all answered."""
    await session.create("/burst")
    created: list[str] = []

    async def create(i: int) -> None:
        created.append(await session.create(f"/burst/n{i:04d}-", sequence=True))

    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            for i in range(500):
                nursery.start_soon(create, i)
    assert len(created) == 500
    assert sorted(await session.children("/burst")) == sorted(c.rsplit("/", 1)[1]
                                                             for c in created)


async def test_an_oversized_transaction_is_refused_before_it_costs_the_connection(
    session: Session,
) -> None:
    """Each payload passes alone, but together they exceed what the server takes in one
    request: the server would drop the connection, interrupting every guarded scope."""
    await session.create("/tx")
    generation = session.snapshot().generation
    with trio.fail_after(20):
        async with session.guard(suspended_grace=0):
            with pytest.raises(DataTooLargeError, match="transaction of 2 operations"):
                await (
                    session.transaction()
                    .create("/tx/a", b"a" * 600_000)
                    .create("/tx/b", b"b" * 600_000)
                    .commit()
                )
            # the refusal cost nothing: the connection stayed up, the guard still holds
            await session.sync("/tx")
            assert session.snapshot().generation == generation
            # and a transaction just inside the limit is really accepted by the server
            results = await (
                session.transaction()
                .create("/tx/a", b"a" * 520_000)
                .create("/tx/b", b"b" * 520_000)
                .commit()
            )
    assert results == ["/tx/a", "/tx/b"]
    assert session.snapshot().generation == generation


async def test_a_refused_operation_says_what_and_why(zk_hosts: str) -> None:
    """The server's NoAuth carries no text: the error names the operation, the path and the
    reason (``/zookeeper/config`` is the server's own node)."""
    async with Session(zk_hosts) as plain:
        with pytest.raises(NoAuthError) as info:
            await plain.set("/zookeeper/config", b"x")
        message = str(info.value)
        assert "write '/zookeeper/config'" in message and "ACL" in message
        assert "super user" in message
        with pytest.raises(NoAuthError, match="create '/zookeeper/config/x'"):
            await plain.create("/zookeeper/config/x")
        with pytest.raises(TransactionFailedError) as failed:
            await plain.transaction().set("/zookeeper/config", b"y").commit()
        assert isinstance(failed.value.cause, NoAuthError)
        assert "write '/zookeeper/config'" in str(failed.value)
