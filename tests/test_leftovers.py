"""Clean-ups that gave up while the ensemble had no quorum finish once it is back (#13).

With two of three members down, no session can expire (nobody leads), so a session lives
through an outage longer than its clean-ups' bound.  A lock released during the outage keeps
its contender node, held by a live session, which would block the lock for everyone; the
session deletes it as soon as it is connected again, in the same session.
"""

from __future__ import annotations

import outcome
import pytest
import trio
import trio.testing
from kazoo import exceptions as kz

from framework import Lock, Session, ZooKeeperEnsemble
from framework.zk import wait_gone
from framework.zk.leftovers import Leftover

pytestmark = pytest.mark.ensemble

TIMEOUT = 3.0


async def test_a_release_that_gave_up_during_an_outage_is_done_once_zookeeper_is_back(
    ensemble: ZooKeeperEnsemble,
) -> None:
    async with Session(ensemble.connect_string, session_timeout=TIMEOUT) as owner, \
            Session(ensemble.connect_string, session_timeout=TIMEOUT) as other:
        await owner.ensure_path("/locks/a")
        session_id = owner.session_id
        with trio.fail_after(120):
            async with Lock(owner, "/locks/a").acquire() as holding:
                node = holding.node
                down = [m.sid for m in ensemble.members][:2]
                for sid in down:
                    ensemble.kill(sid)  # quorum lost: the release below cannot reach it
            # the release gave up after its bound and left the node to the session
            assert [leftover.path for leftover in owner.leftovers] == [node]
            await trio.to_thread.run_sync(ensemble.restart, down[0])
            await owner.wait_connected()
            assert owner.session_id == session_id  # the session lived through the outage
            await wait_gone(other, node)  # deleted by the owner's session, not expired
            await owner.wait_leftovers_done()  # its reply may come after other's watch
        assert owner.leftovers == []
        with trio.fail_after(30):
            async with Lock(other, "/locks/a").acquire():  # nobody blocks it any more
                pass


async def test_a_leftover_deletes_only_a_node_this_session_owns_holding_what_it_held(
    zk_hosts: str, chroot: str, session: Session
) -> None:
    """A claim node of the same name made since (by another consumer, or by us with a new
    token) is never deleted by a leftover; ours, unchanged, is."""
    async with Session(zk_hosts, chroot=chroot) as other:
        await other.create("/theirs", b"token-a", ephemeral=True)
        await session.create("/reclaimed", b"token-b", ephemeral=True)
        await session.create("/ours", b"token-c", ephemeral=True)
        session.delete_later("/theirs", data=b"token-a")  # owned by the other session
        session.delete_later("/reclaimed", data=b"token-old")  # ours, but a new claim
        session.delete_later("/ours", data=b"token-c")
        with trio.fail_after(10):
            await wait_gone(session, "/ours")
        # their reads were answered before ours (one connection, in order): settled, kept
        assert {left.path for left in session.leftovers} <= {"/ours"}
        assert await session.exists("/theirs") is not None
        assert await session.exists("/reclaimed") is not None


@pytest.mark.parametrize("reconnected_since", [True, False])
async def test_a_step_lost_after_the_reconnection_was_seen_is_sent_again_at_once(
    session: Session, reconnected_since: bool
) -> None:
    """The race found by a full run: a step's reply (ConnectionLoss) is handled after the
    reconnection that would have re-sent it, whose sweep skipped it as in flight.  It is
    sent again at once, once; a step lost on the current connection waits for the next."""
    await session.create("/ghost", ephemeral=True)
    leftovers = session._leftovers
    ghost = Leftover("/ghost", session.session_id or 0, step="get", in_flight=True)
    ghost.sent_in = leftovers._connections - (1 if reconnected_since else 0)
    leftovers._pending.append(ghost)
    leftovers._replied(ghost, outcome.Error(kz.ConnectionLoss()))
    if reconnected_since:
        with trio.fail_after(10):
            await session.wait_leftovers_done()
        assert await session.exists("/ghost") is None
    else:
        await session.sync("/")  # anything sent would have been answered by now
        await trio.testing.wait_all_tasks_blocked()
        assert session.leftovers == [ghost] and not ghost.in_flight
        assert await session.exists("/ghost") is not None


async def test_leftovers_are_forgotten_when_the_session_closes(zk_hosts: str) -> None:
    """A node of another session waits (it is never this connection's to delete); closing
    the session forgets it, so nobody waits for it for ever."""
    async with Session(zk_hosts) as session:
        session.delete_later("/elsewhere", session_id=0x1234)
        assert [left.path for left in session.leftovers] == ["/elsewhere"]
    with trio.fail_after(5):
        await session.wait_leftovers_done()
