"""Two-phase commit against a real server: commit, abort votes, failing voters, timeouts,
a site killed with kill -9 before voting (abort), and a site gone after voting commit."""

from __future__ import annotations

from contextlib import AsyncExitStack
from pathlib import Path

import pytest
import trio

from framework import Session
from framework.errors import ConfigurationError
from framework.primitives.two_phase import TwoPhaseCoordinator, TwoPhaseOutcome, TwoPhaseSite
from framework.testing import TcpProxy, python_argv, spawn
from framework.zk import wait_exists

HELPERS = Path(__file__).parent / "helpers"
ROOT = Path(__file__).parent.parent


async def _run(zk_hosts: str, chroot: str, votes: dict[str, object], *, timeout: float = 20
               ) -> tuple[TwoPhaseOutcome, dict[str, TwoPhaseOutcome]]:
    """A coordinator and one in-process site per entry of ``votes`` (each its own session)."""
    outcomes: dict[str, TwoPhaseOutcome] = {}
    result: list[TwoPhaseOutcome] = []

    async def site(name: str, vote: object) -> None:
        async with Session(zk_hosts, chroot=chroot) as s:
            outcomes[name] = await TwoPhaseSite(s, "/tx", name).participate("t1", vote)  # type: ignore[arg-type]

    async with Session(zk_hosts, chroot=chroot) as s:
        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                for name, vote in votes.items():
                    nursery.start_soon(site, name, vote)
                result.append(
                    await TwoPhaseCoordinator(s, "/tx", list(votes)).run("t1", b"pay", timeout)
                )
    return result[0], outcomes


async def _reason(s: Session, txid: str = "t1") -> str:
    return (await s.get(f"/tx/{txid}/decision"))[0].decode()


async def test_all_commit(zk_hosts: str, chroot: str, session: Session) -> None:
    seen: list[bytes] = []

    async def yes(payload: bytes) -> bool:
        seen.append(payload)
        return True

    outcome, sites = await _run(zk_hosts, chroot, {"a": yes, "b": lambda p: True, "c": yes})
    assert outcome is TwoPhaseOutcome.COMMITTED
    assert set(sites.values()) == {TwoPhaseOutcome.COMMITTED} and len(sites) == 3
    assert seen == [b"pay", b"pay"]
    assert "every site voted commit" in await _reason(session)


async def test_one_abort_vote_aborts_everyone(zk_hosts: str, chroot: str,
                                              session: Session) -> None:
    outcome, sites = await _run(
        zk_hosts, chroot, {"a": lambda p: True, "b": lambda p: False, "c": lambda p: True}
    )
    assert outcome is TwoPhaseOutcome.ABORTED and set(sites.values()) == {TwoPhaseOutcome.ABORTED}
    assert "site b voted abort" in await _reason(session)


async def test_a_failing_voter_votes_abort(zk_hosts: str, chroot: str) -> None:
    def broken(payload: bytes) -> bool:
        raise RuntimeError("disk full")

    outcome, sites = await _run(zk_hosts, chroot, {"a": lambda p: True, "b": broken})
    assert outcome is TwoPhaseOutcome.ABORTED and set(sites.values()) == {TwoPhaseOutcome.ABORTED}


async def test_coordinator_timeout_aborts_and_late_sites_learn_it(
    zk_hosts: str, chroot: str, session: Session
) -> None:
    with trio.fail_after(10):
        coordinator = TwoPhaseCoordinator(session, "/tx", ["a", "never"])
        async with trio.open_nursery() as nursery:

            async def site_a() -> None:
                async with Session(zk_hosts, chroot=chroot) as s:
                    assert await TwoPhaseSite(s, "/tx", "a").participate(
                        "t1", lambda p: True) is TwoPhaseOutcome.ABORTED

            nursery.start_soon(site_a)
            assert await coordinator.run("t1", b"", timeout=0.5) is TwoPhaseOutcome.ABORTED
        assert "timeout" in await _reason(session)
        # a site that turns up afterwards learns the outcome without voting
        late = TwoPhaseSite(session, "/tx", "never")
        assert await late.participate("t1", lambda p: True) is TwoPhaseOutcome.ABORTED
        assert await coordinator.decision("t1") is TwoPhaseOutcome.ABORTED
        with pytest.raises(ConfigurationError, match="already exists"):
            await coordinator.run("t1", b"", timeout=1)
        with pytest.raises(ConfigurationError, match="not part of"):
            await TwoPhaseSite(session, "/tx", "stranger").participate("t1", lambda p: True)
        await coordinator.forget("t1")
        assert await session.exists("/tx/t1") is None


async def test_site_killed_before_voting_aborts(zk_hosts: str, chroot: str,
                                                session: Session) -> None:
    """Three sites in their own processes; one is killed with kill -9 after joining, before
    voting.  Its ephemeral node vanishes with its session and everyone decides abort long
    before the coordinator's timeout."""
    coordinator = TwoPhaseCoordinator(session, "/tx", ["s1", "s2", "s3"])
    async with AsyncExitStack() as stack:
        procs = [
            await stack.enter_async_context(spawn(
                python_argv(HELPERS / "p2_two_phase_site.py", zk_hosts, chroot, "/tx", "t1",
                            name, mode), name=name, pipe_stdout=True, cwd=ROOT))
            for name, mode in (("s1", "commit"), ("s2", "commit"), ("s3", "hang"))
        ]
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                outcome: list[TwoPhaseOutcome] = []

                async def coordinate() -> None:
                    outcome.append(await coordinator.run("t1", b"work", timeout=60))

                nursery.start_soon(coordinate)
                await wait_exists(session, "/tx/t1/alive-s3")  # s3 joined and is voting
                procs[2].kill()
                await procs[2].wait()
            for proc in procs[:2]:
                assert await proc.wait() == 0
                assert proc.lines is not None
                assert await proc.lines.rest() == ["abort"]
    assert outcome == [TwoPhaseOutcome.ABORTED]
    assert "site s3 crashed before voting" in await _reason(session)
    assert (await session.get("/tx/t1/site-s3"))[0] == b"joined"


async def test_site_gone_after_voting_commit_still_commits(
    zk_hosts: str, chroot: str, session: Session
) -> None:
    """A vote, once written, stands: a site whose session ends after voting commit does not
    turn the outcome into an abort."""
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            result: list[TwoPhaseOutcome] = []

            async def coordinate() -> None:
                result.append(await TwoPhaseCoordinator(session, "/tx", ["gone", "b"]).run(
                    "t1", b"", timeout=30))

            async def short_lived_site() -> None:
                async with Session(zk_hosts, chroot=chroot) as s:
                    with trio.CancelScope() as scope:
                        async with trio.open_nursery() as inner:
                            inner.start_soon(TwoPhaseSite(s, "/tx", "gone").participate, "t1",
                                             lambda p: True)
                            while (await s.get("/tx/t1/site-gone", watch=s.waker(
                                    fired := trio.Event())))[0] != b"commit":
                                await fired.wait()
                            scope.cancel()

            nursery.start_soon(coordinate)
            await short_lived_site()  # voted commit, then its session closed
            assert await session.exists("/tx/t1/alive-gone") is None
            async with Session(zk_hosts, chroot=chroot) as s:
                assert await TwoPhaseSite(s, "/tx", "b").participate(
                    "t1", lambda p: True) is TwoPhaseOutcome.COMMITTED
    assert result == [TwoPhaseOutcome.COMMITTED]


async def test_connection_cut_while_the_vote_is_in_flight(
    zk_hosts: str, chroot: str, session: Session, proxy: TcpProxy,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The site's connection is cut right after it sends its commit vote (the session
    survives): the site resolves the lost reply from the server's state, is not taken for
    crashed, and learns the same outcome as the coordinator."""
    from kazoo.exceptions import ConnectionDropped

    import framework.zk.session as session_module
    from framework.zk.connection import Connection
    from framework.zk.wire import parse_header

    real_commit = session_module.Transaction.commit
    real_enqueue, real_dispatch = Connection._enqueue, Connection._dispatch
    vote_next_send: list[bool] = []
    vote_xid: list[int] = []

    async def commit(self: session_module.Transaction) -> list[object]:
        if any(op[0] == "set_data" and op[1][1] == b"commit" for op in self.operations):
            vote_next_send.append(True)
        return await real_commit(self)

    def enqueue(self: Connection, record: object) -> object:
        request = real_enqueue(self, record)
        if vote_next_send:
            vote_next_send.clear()
            vote_xid.append(request.xid)
        return request

    def dispatch(self: Connection, packet: bytes) -> None:
        if vote_xid and parse_header(packet)[0].xid == vote_xid[0]:
            vote_xid.clear()
            proxy.cut()  # the server applied the vote; its reply is lost with the link
            raise ConnectionDropped("cut by the test")
        real_dispatch(self, packet)

    monkeypatch.setattr(session_module.Transaction, "commit", commit)
    monkeypatch.setattr(Connection, "_enqueue", enqueue)
    monkeypatch.setattr(Connection, "_dispatch", dispatch)
    site_outcome: list[TwoPhaseOutcome] = []
    async with Session(proxy.address, chroot=chroot, session_timeout=4.0) as flaky:

        async def site() -> None:
            site_outcome.append(
                await TwoPhaseSite(flaky, "/tx", "a").participate("t1", lambda _p: True)
            )

        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(site)
                outcome = await TwoPhaseCoordinator(session, "/tx", ["a"]).run("t1", b"", 15)
    assert outcome is TwoPhaseOutcome.COMMITTED and site_outcome == [TwoPhaseOutcome.COMMITTED]
    assert (await session.get("/tx/t1/site-a"))[0] == b"commit"


async def test_bad_arguments_are_clear_errors(session: Session) -> None:
    from framework.errors import TwoPhaseTimeout

    with pytest.raises(ConfigurationError, match="list of site names"):
        TwoPhaseCoordinator(session, "/tx", "ab")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="timeout"):
        await TwoPhaseCoordinator(session, "/tx", ["a"]).run("t9", b"", None)  # type: ignore[arg-type]
    with pytest.raises(TwoPhaseTimeout):
        await TwoPhaseSite(session, "/tx", "a").participate("never", lambda _p: True,
                                                              timeout=0.2)
