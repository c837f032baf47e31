"""Acknowledgements whose replies are lost, against a real server: an ack applied is
reported applied even when the check that proves it is cut by another connection loss."""

from __future__ import annotations

import pytest
import trio

from framework import ConnectionLossError, Session
from framework.primitives.queue import WorkQueue
from framework.zk import session as zk_session


async def test_an_applied_ack_whose_reply_and_check_are_lost_is_not_sent_again(
        session: Session, monkeypatch: pytest.MonkeyPatch) -> None:
    queue = WorkQueue(session, "/q")
    await queue.put(b"work")
    commit = zk_session.Transaction.commit
    sync = Session.sync
    commits: list[int] = []
    syncs: list[int] = []

    async def applied_but_reply_lost(self: zk_session.Transaction) -> object:
        result = await commit(self)
        commits.append(1)
        if len(commits) == 1:  # the ack: applied, its reply lost
            raise ConnectionLossError("reply lost (test)")
        return result

    async def first_check_cut(self: Session, path: str) -> None:
        syncs.append(1)
        if len(syncs) == 1:
            raise ConnectionLossError("check cut (test)")
        await sync(self, path)

    with trio.fail_after(30):
        async with queue.take() as item:
            assert item.data == b"work"
            monkeypatch.setattr(zk_session.Transaction, "commit", applied_but_reply_lost)
            monkeypatch.setattr(Session, "sync", first_check_cut)
        # leaving the block acked without ClaimLost: applied once, proven by the 2nd check
    assert len(commits) == 1 and len(syncs) == 2  # sent once, checked twice
    assert await queue.size() == 0
