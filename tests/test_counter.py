"""Counter: versioned updates; increments under contention never lost, never doubled."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from framework import Session
from framework.errors import ConcurrentUpdateError, ConfigurationError, ConnectionLossError
from framework.primitives import Counter
from framework.primitives.counter import RECEIPTS, decode
from framework.testing import python_argv, spawn
from framework.zk import wait_gone

HELPER = Path(__file__).parent / "helpers" / "recipe_holder.py"


async def test_add_get_and_defaults(session: Session) -> None:
    counter = Counter(session, "/c/hits", default=10)
    assert await counter.get() == 10  # no node yet
    assert await counter.add(5) == 15
    assert await counter.add(-20) == -5
    assert await Counter(session, "/c/hits").get() == -5
    await session.set("/c/hits", b"41")  # a bare decimal, as another library writes it
    assert await counter.add(1) == 42  # the stale cached version is refreshed
    await session.create("/c/junk", b"not a number")
    with pytest.raises(ConcurrentUpdateError, match="does not hold a counter"):
        await Counter(session, "/c/junk").add(1)
    for bad in (1.5, True, "1"):
        with pytest.raises(ConfigurationError, match="delta must be an int"):
            await counter.add(bad)  # type: ignore[arg-type]


async def test_increments_from_several_processes_are_never_lost(
    zk_hosts: str, chroot: str, session: Session
) -> None:
    """2 processes x 4 tasks x 25 increments, plus 4 tasks here, all on one node."""
    times = 25
    with trio.fail_after(60):
        async with spawn(python_argv(HELPER, zk_hosts, chroot, "counter", times),
                         pipe_stdout=True) as a, \
                spawn(python_argv(HELPER, zk_hosts, chroot, "counter", times),
                      pipe_stdout=True) as b:
            async def adder() -> None:
                counter = Counter(session, "/counter")
                for _ in range(times):
                    await counter.add(1)

            async with trio.open_nursery() as nursery:
                for _ in range(4):
                    nursery.start_soon(adder)
            for child in (a, b):
                assert child.lines is not None
                await child.lines.until(lambda line: line == "DONE")
    assert await Counter(session, "/counter").get() == 3 * 4 * times


class _LostReply:
    """Session.transaction whose first commit's reply is lost after (``applied``) or before
    the server applies it: the write's outcome is unknown to the caller, as after a real
    ConnectionLoss.  ``meanwhile`` runs before the loss is reported (others updating)."""

    def __init__(self, session: Session, applied: bool,
                 meanwhile: Callable[[], Awaitable[None]] | None = None) -> None:
        self.session, self.applied, self.meanwhile, self.calls = session, applied, meanwhile, 0
        self.real = session.transaction

    def transaction(self) -> Any:
        txn = self.real()
        real_commit = txn.commit

        async def commit() -> Any:
            self.calls += 1
            if self.calls == 1:
                if self.applied:
                    await real_commit()
                if self.meanwhile is not None:
                    await self.meanwhile()
                raise ConnectionLossError("reply lost")
            return await real_commit()

        txn.commit = commit
        return txn


@pytest.mark.parametrize("applied", [True, False])
async def test_an_update_whose_reply_was_lost_counts_once(
    session: Session, monkeypatch: pytest.MonkeyPatch, applied: bool
) -> None:
    counter = Counter(session, "/c")
    assert await counter.add(1) == 1
    lost = _LostReply(session, applied)
    monkeypatch.setattr(session, "transaction", lost.transaction)
    assert await counter.add(1) == 2
    monkeypatch.undo()
    assert await counter.get() == 2
    assert lost.calls == (1 if applied else 2)  # settled by its receipt, or sent again


@pytest.mark.parametrize("first", [True, False])
@pytest.mark.parametrize("applied", [True, False])
async def test_a_lost_reply_is_settled_exactly_however_many_updates_came_meanwhile(
    zk_hosts: str, chroot: str, session: Session, monkeypatch: pytest.MonkeyPatch,
    applied: bool, first: bool,
) -> None:
    """More updates by others than the node keeps receipts of, between the lost reply and
    the reconnection (a leader change with busy writers): the session's receipt node still
    tells, so the update counts once (the ring alone could not tell).  ``first``: the lost
    update is the session's first, whose multi creates the receipt node."""
    others = RECEIPTS + 20
    counter = Counter(session, "/c")
    if not first:
        assert await counter.add(1) == 1
    async with Session(zk_hosts, chroot=chroot) as other:
        async def busy() -> None:
            theirs = Counter(other, "/c")
            for _ in range(others):
                await theirs.add(1)

        lost = _LostReply(session, applied, busy)
        monkeypatch.setattr(session, "transaction", lost.transaction)
        await counter.add(1)
        monkeypatch.undo()
    _data, stat = await session.get("/c")
    assert stat.version > RECEIPTS  # the ring alone would have said it cannot be told
    assert await counter.get() == (0 if first else 1) + 1 + others
    assert lost.calls == (1 if applied else 2)


async def test_an_outcome_that_cannot_be_told_says_so(session: Session) -> None:
    """Only when the session expired with the write in flight (its receipt node went with
    it) does the update fall back to the node's ring of receipts, which has a limit."""
    counter = Counter(session, "/c")
    await counter.add(1)
    _data, stat = await session.get("/c")
    for _ in range(RECEIPTS + 1):  # more updates than the node keeps receipts of
        await Counter(session, "/c").add(1)
    expired = 0  # a session that is not the current one
    with pytest.raises(ConnectionLossError, match="cannot be told"):
        await counter._landed("0123456789ab", stat.version, expired)
    data, now = await session.get("/c")
    state = decode("/c", data, now.version)
    assert len(state.receipts) == RECEIPTS
    assert await counter._landed(state.receipts[-1], now.version - 1, expired)
    assert not await counter._landed("0123456789ab", now.version - 1, expired)
    current = session.session_id
    assert current is not None
    assert await counter._landed(state.receipts[-1], stat.version, current)  # exact
    assert not await counter._landed("0123456789ab", stat.version, current)


async def test_an_adder_paused_past_its_session_counts_exactly_once(
    zk_hosts: str, chroot: str, session: Session
) -> None:
    """SIGSTOP mid-run past the session timeout: the server expires the session (updates
    may be in flight); after SIGCONT every update is settled in a new session, none lost
    or doubled, while others counted meanwhile."""
    times = 30
    argv = python_argv(HELPER, zk_hosts, chroot, "counter", times, "--timeout", 1.0)
    with trio.fail_after(40):
        async with spawn(argv, pipe_stdout=True) as adder:
            assert adder.lines is not None
            await adder.lines.until(lambda line: line == "READY")
            [alive] = await session.children("/alive")
            await adder.lines.until(lambda line: line == "ADDED")
            adder.pause()
            counter = Counter(session, "/counter")
            for _ in range(10):
                await counter.add(1)
            await wait_gone(session, f"/alive/{alive}")  # its session has expired
            adder.resume()
            await adder.lines.until(lambda line: line == "DONE")
    assert await counter.get() == 4 * times + 10


async def test_a_killed_adder_leaves_a_consistent_counter(
    zk_hosts: str, chroot: str, session: Session
) -> None:
    """kill -9 mid-run: the node still reads as a counter holding every acknowledged
    increment, plus at most the updates that were in flight (one per task)."""
    argv = python_argv(HELPER, zk_hosts, chroot, "counter", 1000)
    with trio.fail_after(40):
        async with spawn(argv, pipe_stdout=True) as adder:
            assert adder.lines is not None
            await adder.lines.until(lambda line: line == "READY")
            for _ in range(20):
                await adder.lines.until(lambda line: line == "ADDED")
            adder.kill()
            acknowledged = 20 + (await adder.lines.rest()).count("ADDED")
    value = await Counter(session, "/counter").get()
    assert acknowledged <= value <= acknowledged + 4
    assert await Counter(session, "/counter").add(1) == value + 1
