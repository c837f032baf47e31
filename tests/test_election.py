"""Leader election against a real ZooKeeper: hand-over, kill -9, frozen leader, fencing, herd."""

from __future__ import annotations

from contextlib import AsyncExitStack
from pathlib import Path

import pytest
import trio

from framework import LeadershipLost, Session, TransactionFailedError
from framework.primitives.election import Election, Term, contenders_of
from framework.testing import (
    TcpProxy,
    count_watch_fires,
    expire_session,
    python_argv,
    spawn,
    watchers_by_path,
)
from framework.zk import watch_children
from framework.zkserver import four_letter

HELPER = Path(__file__).parent / "helpers" / "p1_election_holder.py"
PATH = "/election"


async def wait_contenders(observer: Session, count: int, path: str = PATH) -> list[str]:
    """Wait (on a children watch) until ``path`` holds ``count`` contender nodes."""
    async for snap in watch_children(observer, path):
        line = contenders_of(snap.children)
        if len(line) >= count:
            return line
    raise AssertionError("unreachable")


async def records(session: Session) -> dict[str, int]:
    """``{record name: czxid}`` of everything under /records (server-side evidence)."""
    found = {}
    for name in await session.children("/records"):
        found[name] = (await session.exists(f"/records/{name}")).czxid
    return found


async def test_leader_hands_over_on_resign_and_observers_follow(
    zk_hosts: str, chroot: str, session: Session
) -> None:
    async with (
        Session(zk_hosts, chroot=chroot, session_timeout=4) as a,
        Session(zk_hosts, chroot=chroot, session_timeout=4) as b,
    ):
        ea, eb = Election(a, PATH, b"A"), Election(b, PATH, b"B")
        observer = Election(session, PATH)
        seen: list[bytes | None] = []
        got_b, saw_b, observing = trio.Event(), trio.Event(), trio.Event()
        with trio.fail_after(10):
            assert await observer.leader() is None
            async with trio.open_nursery() as nursery:

                async def observe() -> None:
                    async for info in observer.watch_leaders():
                        seen.append(None if info is None else info.identifier)
                        observing.set()
                        if seen[-1] == b"B":
                            saw_b.set()

                async def contend_b() -> None:
                    async with eb.leadership() as term:
                        assert term.session_id == b.session_id
                        got_b.set()
                        await saw_b.wait()  # hold on until the observer has seen us

                nursery.start_soon(observe)
                await observing.wait()  # it has seen "nobody leads" before A contends
                async with ea.leadership() as term_a:
                    nursery.start_soon(contend_b)
                    await eb.wait_in_line()
                    assert eb.predecessor == term_a.node
                    leader = await observer.leader()
                    assert leader is not None and leader.identifier == b"A"
                    assert leader.token == term_a.token
                    assert [c.identifier for c in await observer.contenders()] == [b"A", b"B"]
                    assert not got_b.is_set()
                await got_b.wait()
                await saw_b.wait()
                nursery.cancel_scope.cancel()
        assert seen[:3] == [None, b"A", b"B"]
        assert contenders_of(await session.children(PATH)) == []


async def test_kill9_leader_next_contender_leads_after_session_timeout(
    zk_hosts: str, chroot: str, session: Session
) -> None:
    await session.ensure_path("/records")
    await session.ensure_path(PATH)
    async with spawn(python_argv(HELPER, zk_hosts, chroot, PATH, "holder", "--timeout", "2",
                                 "--records", "/records"), pipe_stdout=True) as proc:
        assert proc.lines is not None
        with trio.fail_after(30):
            holder_token = int((await proc.lines.next()).split()[1])
            async with (
                Session(zk_hosts, chroot=chroot, session_timeout=2) as b,
                Session(zk_hosts, chroot=chroot, session_timeout=2) as c,
            ):
                leading: list[str] = []
                max_leaders = 0
                led = {"B": trio.Event(), "C": trio.Event()}
                release = trio.Event()

                async def contend(s: Session, name: str) -> None:
                    nonlocal max_leaders
                    async with Election(s, PATH, name.encode()).leadership() as term:
                        leading.append(name)
                        max_leaders = max(max_leaders, len(leading))
                        await term.commit(lambda t: t.create(
                            f"/records/start-{term.token:020d}", name.encode()))
                        led[name].set()
                        await release.wait()
                        leading.remove(name)

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(contend, b, "B")
                    await wait_contenders(session, 2)
                    nursery.start_soon(contend, c, "C")
                    await wait_contenders(session, 3)
                    assert not leading  # the helper process leads
                    proc.kill()
                    await proc.wait()
                    await led["B"].wait()
                    assert leading == ["B"]  # exactly one leader: C still waits
                    # server-side: the holder's node was deleted (the parent's pzxid: the
                    # last change of its children) after the holder's term began, and
                    # before B's term wrote its first record
                    parent = await session.exists(PATH)
                    evidence = await records(session)
                    holder_start = evidence[f"start-{holder_token:020d}"]
                    b_start = max(evidence.values())
                    assert holder_start < parent.pzxid < b_start
                    release.set()
                    await led["C"].wait()
                assert max_leaders == 1
                tokens = sorted(int(name.split("-")[1]) for name in await records(session))
                assert tokens[0] == holder_token and len(tokens) == 3


async def test_frozen_leader_is_cancelled_before_the_next_leader_starts(
    zk_hosts: str, chroot: str, session: Session, proxy: TcpProxy
) -> None:
    """A's connection freezes: A's body must end before B's body begins (server evidence:
    A's end record, written out of band the moment A's body is cancelled, precedes B's
    fenced start record), and A's later fenced write is rejected by the server."""
    await session.ensure_path("/records")
    async with (
        Session(proxy.address, chroot=chroot, session_timeout=3) as a,
        Session(zk_hosts, chroot=chroot, session_timeout=3) as b,
    ):
        a_led, b_led, a_done = trio.Event(), trio.Event(), trio.Event()
        a_term: list[Term] = []
        a_lost: list[LeadershipLost] = []

        async def leader_a() -> None:
            try:
                async with Election(a, PATH, b"A").leadership() as term:
                    a_term.append(term)
                    await term.commit(lambda t: t.create(f"/records/start-A-{term.token}"))
                    a_led.set()
                    try:
                        await trio.sleep_forever()
                    finally:
                        with trio.CancelScope(shield=True):  # record the end out of band
                            await session.create(f"/records/end-A-{term.token}")
            except LeadershipLost as exc:
                a_lost.append(exc)
            finally:
                a_done.set()

        async def leader_b() -> None:
            async with Election(b, PATH, b"B").leadership() as term:
                await term.commit(lambda t: t.create(f"/records/start-B-{term.token}"))
                b_led.set()
                await trio.sleep_forever()

        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(leader_a)
                await a_led.wait()
                nursery.start_soon(leader_b)
                await wait_contenders(session, 2)
                proxy.freeze()
                await b_led.wait()
                proxy.unfreeze()
                await a_done.wait()
                assert a_lost and a_lost[0].reason in ("suspended", "lost")
                # A's session is gone: its old term's fenced write fails on the server
                while a.session_id in (None, a_term[0].session_id):
                    await a.wait_change(a.snapshot().generation)
                with pytest.raises(LeadershipLost):
                    await a_term[0].commit(lambda t: t.create("/records/late-A"))
                with pytest.raises(TransactionFailedError) as failed:
                    await a_term[0].fenced().create("/records/late-A").commit()
                assert failed.value.failed_index == 0
                nursery.cancel_scope.cancel()
        evidence = await records(session)
        a_token = a_term[0].token
        b_start = next(z for name, z in evidence.items() if name.startswith("start-B-"))
        assert evidence[f"start-A-{a_token}"] < evidence[f"end-A-{a_token}"] < b_start
        assert "late-A" not in evidence


async def test_deposed_leader_fenced_write_fails_after_expiry(
    zk_hosts: str, chroot: str, session: Session
) -> None:
    async with Session(zk_hosts, chroot=chroot, session_timeout=2) as s:
        await session.create("/target", b"v0")
        terms: list[Term] = []
        with trio.fail_after(20):
            with pytest.raises(LeadershipLost) as lost:
                async with Election(s, PATH).leadership() as term:
                    terms.append(term)
                    await term.commit(lambda t: t.set("/target", b"v1"))
                    await expire_session(s)
                    await trio.sleep_forever()
            assert lost.value.reason in ("suspended", "lost")
            await s.wait_connected()
            with pytest.raises(LeadershipLost):
                await terms[0].commit(lambda t: t.set("/target", b"stale"))
        assert (await session.get("/target"))[0] == b"v1"


async def test_each_contender_watches_only_its_predecessor(
    zk_hosts: str, chroot: str, session: Session
) -> None:
    """Herd check: server-side watch table (4lw ``wchp``) and watch callbacks counted."""
    port = int(zk_hosts.split(",")[0].rsplit(":", 1)[1])
    count = 5
    async with AsyncExitStack() as stack:
        sessions = [
            await stack.enter_async_context(Session(zk_hosts, chroot=chroot, session_timeout=4))
            for _ in range(count)
        ]
        fired = [0] * count
        for index, s in enumerate(sessions):
            count_watch_fires(s, fired, index)
        elections = [Election(s, PATH, str(i).encode()) for i, s in enumerate(sessions)]
        releases = [trio.Event() for _ in range(count)]
        leading = [trio.Event() for _ in range(count)]

        async def contend(i: int) -> None:
            async with elections[i].leadership():
                leading[i].set()
                await releases[i].wait()

        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                for i in range(count):
                    nursery.start_soon(contend, i)
                    await elections[i].wait_in_line()  # starts in order: i is i-th in line
                await leading[0].wait()
                line = contenders_of(await session.children(PATH))
                ids = [f"{s.session_id:#x}" for s in sessions]
                watchers = watchers_by_path(four_letter(port, "wchp"), f"{chroot}{PATH}")
                for i, name in enumerate(line):
                    expected = {ids[i + 1]} if i + 1 < count else set()
                    if i == 0:
                        expected.add(ids[0])  # the leader watches its own node
                    assert watchers.get(f"{chroot}{PATH}/{name}", set()) == expected, i
                before = list(fired)
                releases[0].set()
                await leading[1].wait()
                for s in sessions[2:]:
                    await s.sync(PATH)
                woken = [after - prior for after, prior in zip(fired, before, strict=True)]
                assert woken[1:] == [1, 0, 0, 0]
                for release in releases:
                    release.set()


async def test_cancelled_wait_leaves_no_node_and_body_errors_propagate(
    zk_hosts: str, chroot: str, session: Session
) -> None:
    async with Session(zk_hosts, chroot=chroot, session_timeout=4) as other:
        with trio.fail_after(10):
            async with Election(session, PATH).leadership():
                waiting = Election(other, PATH)
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(_lead_forever, waiting)
                    await waiting.wait_in_line()
                    assert len(contenders_of(await session.children(PATH))) == 2
                    nursery.cancel_scope.cancel()
                assert len(contenders_of(await session.children(PATH))) == 1
            with pytest.raises(ValueError, match="boom"):
                async with Election(other, PATH).leadership():
                    raise ValueError("boom")
            assert contenders_of(await session.children(PATH)) == []


async def test_waiting_contender_requeues_after_its_session_expires(
    zk_hosts: str, chroot: str, session: Session
) -> None:
    async with Session(zk_hosts, chroot=chroot, session_timeout=2) as s:
        waiting = Election(s, PATH, b"W")
        led = trio.Event()

        async def contend() -> None:
            async with waiting.leadership():
                led.set()

        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                async with Election(session, PATH, b"L").leadership():
                    nursery.start_soon(contend)
                    await waiting.wait_in_line()
                    before = await wait_contenders(session, 2)
                    old = s.session_id
                    await expire_session(s)
                    while s.session_id in (None, old):
                        await s.wait_change(s.snapshot().generation)
                    line = await wait_contenders(session, 2)
                    assert line[0] == before[0] and line[1] != before[1]  # a new node
                await led.wait()


async def _lead_forever(election: Election) -> None:
    async with election.leadership():
        await trio.sleep_forever()

