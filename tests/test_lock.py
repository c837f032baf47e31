"""Locks against a real server: exclusion, timeouts, no leaked contenders, loss, revocation,
read/write sharing, and safety under a frozen connection proven by fenced writes."""

from __future__ import annotations

import pytest
import trio

from framework import Session
from framework.errors import LockLost, LockRevoked, LockTimeout, NoNodeError
from framework.primitives.lock import Lock, LockHolding, RevocableLock, request_revoke
from framework.primitives.rwlock import ReadWriteLock
from framework.testing import TcpProxy, count_watch_fires, watchers_by_path
from framework.zk import wait_exists
from framework.zkserver import four_letter


async def test_exclusive_among_many_sessions(zk_hosts: str, chroot: str) -> None:
    holders = 0
    most = 0
    cycles = 0

    async def contender(name: str) -> None:
        nonlocal holders, most, cycles
        async with Session(zk_hosts, chroot=chroot, session_timeout=4.0) as s:
            lock = Lock(s, "/lock", name.encode())
            for _ in range(5):
                async with lock.acquire() as holding:
                    holders += 1
                    most = max(most, holders)
                    await holding.fence(s.transaction()).create("/log/e-", b"x", sequence=True) \
                        .commit()
                    await trio.lowlevel.checkpoint()
                    holders -= 1
                    cycles += 1

    async with Session(zk_hosts, chroot=chroot) as s:
        await s.ensure_path("/log")
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                for i in range(5):
                    nursery.start_soon(contender, f"c{i}")
        assert most == 1 and cycles == 25
        assert len(await s.children("/log")) == 25
        assert await s.children("/lock") == []


def _signal_watched_exists(session: Session, armed: trio.Event) -> None:
    """Set ``armed`` once an ``exists`` with a watch has returned (the watch is then
    registered on the server)."""
    plain = session.exists

    async def exists(path: str, watch: object = None) -> object:
        stat = await plain(path, watch=watch)
        if watch is not None:
            armed.set()
        return stat

    session.exists = exists  # type: ignore[method-assign, assignment]


async def test_release_wakes_only_the_next_waiter(zk_hosts: str, chroot: str,
                                                  session: Session) -> None:
    """Herd check: the server's watch table shows each waiter watching only its predecessor,
    and a release fires exactly one waiter's watch (a children watch would fire them all)."""
    from contextlib import AsyncExitStack

    port = int(zk_hosts.split(",")[0].rsplit(":", 1)[1])
    count = 5
    await session.ensure_path("/lock")
    async with AsyncExitStack() as stack:
        sessions = [
            await stack.enter_async_context(Session(zk_hosts, chroot=chroot, session_timeout=4))
            for _ in range(count)
        ]
        armed = [trio.Event() for _ in range(count)]
        holding = [trio.Event() for _ in range(count)]
        release = [trio.Event() for _ in range(count)]
        fired = [0] * count
        for i, s in enumerate(sessions):
            _signal_watched_exists(s, armed[i])
            count_watch_fires(s, fired, i)

        async def contend(i: int) -> None:
            async with Lock(sessions[i], "/lock").acquire():
                holding[i].set()
                await release[i].wait()

        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                for i in range(count):
                    nursery.start_soon(contend, i)
                    await armed[i].wait()  # i's watch is set: the next one queues behind it
                line = sorted(await session.children("/lock"), key=lambda n: n[-10:])
                ids = [f"{s.session_id:#x}" for s in sessions]
                watchers = watchers_by_path(four_letter(port, "wchp"), f"{chroot}/lock")
                for i, name in enumerate(line):
                    expected = {ids[i + 1]} if i + 1 < count else set()
                    if i == 0:
                        expected.add(ids[0])  # the holder watches its own node
                    assert watchers.get(f"{chroot}/lock/{name}", set()) == expected, i
                before = list(fired)
                release[0].set()
                await holding[1].wait()
                for s in sessions[2:]:
                    await s.sync("/lock")
                woken = [after - prior for after, prior in zip(fired, before, strict=True)]
                assert woken[1:] == [1, 0, 0, 0]
                for event in release:
                    event.set()


async def test_shorthand_and_fencing_token_grows(session: Session) -> None:
    lock = Lock(session, "/l")
    async with lock as first:
        assert isinstance(first, LockHolding)
    async with lock as second:
        assert second.token > first.token


async def test_timeout_leaves_no_contender_node(zk_hosts: str, chroot: str,
                                                session: Session) -> None:
    async with Session(zk_hosts, chroot=chroot) as other:
        with trio.fail_after(10):
            async with Lock(session, "/l").acquire():
                with pytest.raises(LockTimeout):
                    async with Lock(other, "/l").acquire(timeout=0.2):
                        raise AssertionError("acquired a held lock")
                assert len(await session.children("/l")) == 1


async def test_cancelled_waiter_leaves_no_contender_node(zk_hosts: str, chroot: str,
                                                         session: Session) -> None:
    async with Session(zk_hosts, chroot=chroot) as other:
        with trio.fail_after(10):
            async with Lock(session, "/l").acquire():
                async with trio.open_nursery() as nursery:

                    async def wait_for_lock() -> None:
                        async with Lock(other, "/l").acquire():
                            raise AssertionError("acquired a held lock")

                    nursery.start_soon(wait_for_lock)
                    # the waiter is registered once a second contender node exists
                    await _wait_children(session, "/l", 2)
                    nursery.cancel_scope.cancel()
                assert len(await session.children("/l")) == 1
        assert await session.children("/l") == []


async def test_deleted_node_cancels_the_body(zk_hosts: str, chroot: str,
                                             session: Session) -> None:
    async with Session(zk_hosts, chroot=chroot) as admin:
        reached = False
        with trio.fail_after(10):
            with pytest.raises(LockLost) as info:
                async with Lock(session, "/l").acquire() as holding:
                    await admin.delete(holding.node)
                    await trio.sleep_forever()
            reached = True
        assert reached and info.value.reason == "node deleted"


async def test_revocation_cancels_the_holder(zk_hosts: str, chroot: str,
                                             session: Session) -> None:
    async with Session(zk_hosts, chroot=chroot) as other:
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                got_it = trio.Event()
                revoked: list[BaseException] = []

                async def holder() -> None:
                    try:
                        async with RevocableLock(session, "/l").acquire():
                            got_it.set()
                            await trio.sleep_forever()
                    except LockRevoked as exc:
                        revoked.append(exc)

                nursery.start_soon(holder)
                await got_it.wait()
                lock = RevocableLock(other, "/l")
                assert await lock.revoke() is not None
                async with lock.acquire(timeout=8):
                    pass
        assert len(revoked) == 1
        assert await session.children("/l") == []


async def test_cooperative_revocation_only_notifies(session: Session) -> None:
    with trio.fail_after(10):
        async with RevocableLock(session, "/l", cooperative=True).acquire() as holding:
            assert await request_revoke(session, "/l") == holding.node.rsplit("/", 1)[1]
            await holding.revoke_requested.wait()
            # still the holder until the block ends
            assert (await session.exists(holding.node)) is not None
    assert await request_revoke(session, "/l") is None


async def _wait_children(s: Session, path: str, count: int) -> None:
    """Wait (on a children watch) until ``path`` has at least ``count`` children."""
    while True:
        fired = trio.Event()
        try:
            if len(await s.children(path, watch=s.waker(fired))) >= count:
                return
        except NoNodeError:
            if await s.exists(path, watch=s.waker(fired)) is not None:
                continue
        await fired.wait()


async def test_readers_share_writers_exclude_in_order(zk_hosts: str, chroot: str) -> None:
    """Queue: W1 (held), R1 R2 R3, W2, R4.  Releasing W1 lets the three readers in together;
    W2 waits for them; R4 (behind W2) waits for W2."""
    log: list[str] = []
    readers_in = 0
    all_in = trio.Event()
    release = trio.Event()

    async with (
        Session(zk_hosts, chroot=chroot) as a,
        Session(zk_hosts, chroot=chroot) as b,
        Session(zk_hosts, chroot=chroot) as c,
        Session(zk_hosts, chroot=chroot) as d,
    ):

        async def first_writer() -> None:
            async with ReadWriteLock(d, "/rw").write_lock():
                await release.wait()

        async def reader(s: Session, name: str, together: bool) -> None:
            nonlocal readers_in
            async with ReadWriteLock(s, "/rw").read_lock():
                log.append(f"{name} in")
                if together:
                    readers_in += 1
                    if readers_in == 3:
                        all_in.set()
                    await all_in.wait()  # only possible if all three hold it at once
                log.append(f"{name} out")

        async def second_writer() -> None:
            async with ReadWriteLock(d, "/rw").write_lock():
                log.append("w2 in")
                log.append("w2 out")

        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(first_writer)
                await _wait_children(a, "/rw", 1)
                for s, name in ((a, "r1"), (b, "r2"), (c, "r3")):
                    nursery.start_soon(reader, s, name, True)
                await _wait_children(a, "/rw", 4)
                nursery.start_soon(second_writer)
                await _wait_children(a, "/rw", 5)
                nursery.start_soon(reader, a, "r4", False)
                await _wait_children(a, "/rw", 6)
                assert log == []
                release.set()
        assert sorted(log[:3]) == ["r1 in", "r2 in", "r3 in"]
        assert sorted(log[3:6]) == ["r1 out", "r2 out", "r3 out"]
        assert log[6:] == ["w2 in", "w2 out", "r4 in", "r4 out"]
        assert await a.children("/rw") == []


async def test_never_two_holders_under_a_frozen_connection(
    zk_hosts: str, chroot: str, proxy: TcpProxy
) -> None:
    """A holds the lock through a proxy and keeps writing, fenced on its lock node; its
    connection freezes until the server expires it; B then gets the lock and writes.  The
    server-side log must show A's writes, then B's, never interleaved, and A's body must have
    been cancelled with LockLost before B's began."""
    async with (
        Session(proxy.address, chroot=chroot, session_timeout=2.0) as a,
        Session(zk_hosts, chroot=chroot, session_timeout=4.0) as b,
    ):
        await b.ensure_path("/log")
        a_in = trio.Event()
        a_lost: list[LockLost] = []
        in_body = {"a": False, "b": False}
        overlap = False

        async def write(s: Session, holding: LockHolding, who: str) -> None:
            await holding.fence(s.transaction()).create(
                "/log/e-", who.encode(), sequence=True
            ).commit()

        async def holder_a() -> None:
            nonlocal overlap
            try:
                async with Lock(a, "/l", b"a").acquire() as holding:
                    in_body["a"] = True
                    a_in.set()
                    try:
                        while True:
                            overlap |= in_body["b"]
                            try:
                                await write(a, holding, "a")
                            except Exception:
                                await trio.lowlevel.checkpoint()
                    finally:
                        in_body["a"] = False
            except LockLost as exc:
                a_lost.append(exc)

        with trio.fail_after(40):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(holder_a)
                await a_in.wait()
                await wait_exists(b, "/log/e-0000000002")  # A wrote a few times
                proxy.freeze()
                async with Lock(b, "/l", b"b").acquire(timeout=30) as holding:
                    in_body["b"] = True
                    overlap |= in_body["a"]
                    for _ in range(3):
                        await write(b, holding, "b")
                    # A's client may now reconnect: whatever it had queued reaches the server
                    proxy.unfreeze()
                    in_body["b"] = False
        await b.sync("/log")
        assert len(a_lost) == 1 and not overlap
        names = sorted(await b.children("/log"))
        writers = [(await b.get(f"/log/{n}"))[0].decode() for n in names]
        first_b = writers.index("b")
        assert set(writers[:first_b]) == {"a"} and set(writers[first_b:]) == {"b"}
        assert writers.count("b") == 3


async def test_waiter_survives_suspension(zk_hosts: str, chroot: str, proxy: TcpProxy) -> None:
    """A waiter whose connection is cut keeps its place and gets the lock after reconnecting."""
    async with (
        Session(zk_hosts, chroot=chroot) as holder_session,
        Session(proxy.address, chroot=chroot, session_timeout=4.0) as waiter_session,
    ):
        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                release = trio.Event()
                got = trio.Event()

                async def holder() -> None:
                    async with Lock(holder_session, "/l").acquire():
                        await release.wait()

                async def waiter() -> None:
                    async with Lock(waiter_session, "/l").acquire():
                        got.set()

                nursery.start_soon(holder)
                await _wait_children(holder_session, "/l", 1)
                nursery.start_soon(waiter)
                await _wait_children(holder_session, "/l", 2)
                proxy.cut()
                release.set()
                await got.wait()
        assert await holder_session.children("/l") == []


async def test_first_acquire_cancelled_mid_create_leaks_no_node(
    zk_hosts: str, chroot: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cancel the very first acquire on a fresh path while its create is in flight: no
    contender node may appear afterwards (kazoo's makepath used to re-issue the create from
    its own thread after the parents were made), so another session gets the lock at once."""
    from framework.zk.connection import Connection

    real_call = Connection.call
    armed: list[trio.CancelScope] = []

    async def cancelling_call(self: Connection, record: object) -> object:
        if armed:
            armed.pop().cancel()  # lands while the create's reply is awaited
        return await real_call(self, record)

    async with Session(zk_hosts, chroot=chroot) as s, Session(zk_hosts, chroot=chroot) as other:
        monkeypatch.setattr(Connection, "call", cancelling_call)
        with trio.CancelScope() as scope:
            armed.append(scope)
            async with Lock(s, "/fresh/lock").acquire():
                raise AssertionError("acquired although cancelled")
        monkeypatch.setattr(Connection, "call", real_call)
        assert scope.cancelled_caught
        with trio.fail_after(5):
            async with Lock(other, "/fresh/lock").acquire() as holding:
                assert holding.node.startswith("/fresh/lock/lock-")
        assert await s.children("/fresh/lock") == []


async def test_bad_timeout_is_a_clear_error(session: Session) -> None:
    from framework import ConfigurationError

    for bad in ("5", -1):
        with pytest.raises(ConfigurationError, match="lock timeout"):
            async with Lock(session, "/lock").acquire(timeout=bad):  # type: ignore[arg-type]
                pass
    assert await session.exists("/lock") is None  # nothing was created


async def test_tasks_sharing_a_lock_object_keep_their_own_holdings(session: Session) -> None:
    """``async with lock:`` from several tasks of one process on one ``Lock``: each task
    releases its own holding (re-entry is not shared)."""
    lock = Lock(session, "/lock")
    order: list[str] = []

    async def user(name: str) -> None:
        async with lock as holding:
            order.append(f"{name}+")
            assert holding.node in [f"/lock/{n}" for n in await session.children("/lock")]
            await trio.lowlevel.checkpoint()
            order.append(f"{name}-")

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            for name in "abc":
                nursery.start_soon(user, name)
    assert len(order) == 6
    assert all(order[i][0] == order[i + 1][0] for i in range(0, 6, 2))  # never interleaved
    assert await session.children("/lock") == []
