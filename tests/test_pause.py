"""Process pauses (SIGSTOP, as a GC pause or a VM migration would do) of real owners.

A child process holds a lock, leadership, a queue claim or a served shard and runs a body of
steps (``tests/helpers/pause_owner.py``).  A pause shorter than the trust window changes
nothing: the steps go on after SIGCONT.  A pause past the session timeout lets the server
expire the session and another client take over; after SIGCONT the child must start no new
step: trio cancels the scope at the trust deadline before running any of its tasks, and the
owner's synchronous ``ensure_trusted`` refuses the effect of a step woken before the pause.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

from framework import LockLost, Session, SessionInterrupted
from framework.primitives import Election, Lock, WorkQueue
from framework.runtime import App
from framework.testing import Lines, TcpProxy, python_argv, spawn
from framework.zk import wait_exists, wait_gone

HELPER = Path(__file__).parent / "helpers" / "pause_owner.py"
OWNER_TIMEOUT = 2.0  # the paused process's session timeout (trust window 1.33 s)
SHORT_PAUSE = 0.15  # well inside the trust window, even with a ping due


async def read_until(lines: Lines, done: Callable[[str, str], bool]) -> list[tuple[str, str]]:
    """Read the owner's ``KIND value`` lines until ``done(kind, value)``; return them."""
    read = []
    while True:
        kind, _, value = (await lines.next()).partition(" ")
        read.append((kind, value))
        if done(kind, value):
            return read


def after(lines: list[tuple[str, str]], kind: str, moment: float) -> list[float]:
    return [float(v) for k, v in lines if k == kind and float(v) > moment]


@asynccontextmanager
async def taken_over(session: Session, mode: str) -> AsyncIterator[None]:
    """Hold what the paused child held, once the server has expired its session."""
    if mode == "lock":
        async with Lock(session, "/lock").acquire():
            yield
    elif mode == "leader":
        async with Election(session, "/election", b"successor").leadership():
            yield
    elif mode == "claim":
        async with WorkQueue(session, "/q").take() as item:
            assert item.attempts == 2  # delivered again: the paused claim is gone
            yield
    else:
        await wait_gone(session, f"{App('pause').workers}/w")  # its membership expired
        yield


@pytest.mark.parametrize(("mode", "checked"), [
    ("lock", False), ("leader", False), ("claim", False), ("shard", False), ("lock", True),
])
async def test_a_paused_owner_starts_no_step_past_its_trust_deadline(
    zk_hosts: str, chroot: str, session: Session, mode: str, checked: bool
) -> None:
    """Unchecked: a busy body that never calls ``ensure_trusted`` starts no step after
    SIGCONT (trio's deadline alone).  Checked: each step waits, then checks trust before
    its effect; no effect after SIGCONT."""
    if mode == "claim":
        await WorkQueue(session, "/q").put(b"job")
    argv = python_argv(HELPER, zk_hosts, chroot, mode, "--timeout", OWNER_TIMEOUT)
    async with spawn(argv + ([] if checked else ["--unchecked"]), pipe_stdout=True) as owner:
        assert owner.lines is not None
        with trio.fail_after(40):
            if mode == "shard":
                assignments = App("pause").assignment_dir("w")
                await wait_exists(session, assignments)
                await session.create(f"{assignments}/s0", b"")
            await read_until(owner.lines, lambda kind, _: kind == "READY")
            progress = "EFFECT" if checked else "START"
            await read_until(owner.lines, lambda kind, _: kind == progress)

            # shorter than the trust window: the body goes on as if nothing happened
            owner.pause()
            await trio.sleep(SHORT_PAUSE)  # the length of the fault, not a wait for it
            resumed = time.monotonic()  # before SIGCONT: every step after it counts
            owner.resume()
            short = await read_until(owner.lines, lambda kind, value: kind == "ENDED"
                                     or (kind == progress and float(value) > resumed))
            assert short[-1][0] == progress, short[-3:]

            # past the session timeout: the server expires it and someone else takes over
            owner.pause()
            stopped = time.monotonic()
            async with taken_over(session, mode):
                resumed = time.monotonic()
                owner.resume()
                rest = await read_until(owner.lines, lambda kind, _: kind == "ENDED")
    if not checked:
        rest = [("START", t) for k, v in rest if k == "STARTS" for t in v.split()] + rest
    # a step can be both in STARTS and on a START line of its own: count it once
    started = sorted(set(after(rest, "START", resumed)))
    effects = after(rest, "EFFECT", resumed)
    body = "checked" if checked else "busy"
    print(f"{mode} {body}: paused {resumed - stopped:.2f}s; after SIGCONT {len(started)} "
          f"steps started, {len(effects)} effects; ended {rest[-1][1]}")
    # busy: a step whose wake-up trio took just before the stop may still start (the step
    # in progress), and nothing after it; checked: each step waits 50 ms, so the stop all
    # but always lands in a wait, and no step starts (nor any effect: ensure_trusted)
    assert effects == [], rest
    assert len(started) <= (0 if checked else 1), rest


async def test_a_loop_blocked_past_the_read_timeout_is_a_pause(
    zk_hosts: str, chroot: str
) -> None:
    """trio's loop blocked past the trust deadline (a CPU-bound step, no ``await``): the
    session's heartbeat lives in that loop, so to the server this is a paused process.  The
    lock's body is ended at the deadline, ``ensure_trusted`` refuses before any effect, and
    the session serves again afterwards."""
    async with Session(zk_hosts, chroot=chroot, session_timeout=OWNER_TIMEOUT) as s:
        with trio.fail_after(20):
            with pytest.raises(LockLost):
                async with Lock(s, "/lock").acquire() as holding:
                    armed = trio.current_time()
                    time.sleep(s.read_timeout * 1.3)  # the whole loop is stuck, not waiting
                    assert trio.current_time() > armed + s.read_timeout  # past the deadline
                    with pytest.raises(SessionInterrupted):
                        s.ensure_trusted(holding.session_id)
                    await trio.lowlevel.checkpoint()  # trio expires due deadlines here
                    raise AssertionError("the body went on past its trust deadline")
            await s.wait_connected()
            async with Lock(s, "/lock").acquire():
                s.ensure_trusted()


async def test_a_blocking_step_shorter_than_the_read_timeout_keeps_ownership(
    zk_hosts: str, chroot: str
) -> None:
    """CPU-bound steps shorter than the read timeout (the heartbeat is late, not missing)
    end nothing, and a body that ends right after one is not reported lost."""
    async with Session(zk_hosts, chroot=chroot, session_timeout=OWNER_TIMEOUT) as s:
        with trio.fail_after(20):
            async with s.guard():
                await trio.sleep(0.05)
                time.sleep(s.read_timeout * 0.4)
            async with Lock(s, "/lock").acquire() as holding:
                for _ in range(2):  # 0.8 read timeouts in all: within the deadline
                    time.sleep(s.read_timeout * 0.4)
                    await trio.sleep(0.02)
                s.ensure_trusted(holding.session_id)


async def test_a_body_ended_by_its_trust_deadline_never_exits_normally(
    chroot: str, proxy: TcpProxy
) -> None:
    """The deadline ends the body; while the body's shielded clean-up runs, the link comes
    back and a newer proof of life arrives (the session survived).  The guard still says
    the body was interrupted: it did not finish."""
    async with Session(proxy.address, chroot=chroot, session_timeout=4.0) as s:
        finished = False
        with trio.fail_after(30), pytest.raises(SessionInterrupted):
            async with s.guard():
                try:
                    proxy.freeze()
                    await trio.sleep_forever()
                    finished = True
                finally:
                    with trio.CancelScope(shield=True):
                        proxy.unfreeze()
                        await s.exists("/")  # reconnected: a newer proof of the same session
                        assert s.is_trusted()
                        await trio.sleep(0.1)  # loop passes with the newer proof
        assert not finished


def test_trio_still_has_the_flag_the_trust_keeper_reads() -> None:
    """framework.zk.trust reads CancelScope._cancel_called (the public property cancels a
    scope past its deadline when read): a trio that renames it must fail here."""
    assert trio.CancelScope()._cancel_called is False
