"""The consumer part of :class:`~framework.primitives.queue.WorkQueue`: ``take`` (a claim
held for the block, renewed with a lease), and what its end commits.  Claim rounds are
:mod:`.claims`' (a :class:`~.claims.Claimer`), acknowledgements, releases and dead letters
:mod:`.acks`' (an :class:`~.acks.Acker`), leases' renewals :mod:`.lease`'s."""

from __future__ import annotations

import functools
from contextlib import asynccontextmanager
from typing import AsyncIterator, Callable

import trio

from framework.errors import ClaimLost
from framework.primitives.holding import node_scope
from framework.primitives.queue.acks import Acker
from framework.primitives.queue.claims import Claimer
from framework.primitives.queue.core import QueueCore
from framework.primitives.queue.items import Finisher, QueueItem
from framework.primitives.queue.lease import Renewals, renew

#: A claim's node is watched (for a deletion by someone else) only once its block has run
#: this long.  Nobody else deletes a younger claim: a lease breaker waits a whole lease
#: (longer than this) without a renewal, and a claim without a lease ends with its session,
#: which the block's guard watches from the start.  Short tasks so cost no watch at all.
_CLAIM_WATCH_AFTER = 1.0


class NotAdmitted(Exception):
    """A claim the take's ``admit`` refused (handed back as never delivered)."""


class Consumer:
    """The takes of one queue object (see the package doc for the guarantees): ``claimer``
    claims an item for each, ``acker`` ends the claim when its block ends, ``renewals``
    keeps its lease.  Its own state: the finishers to ack each item held with."""

    def __init__(self, core: QueueCore, claimer: Claimer, acker: Acker,
                 renewals: Renewals) -> None:
        self.core = core
        self.claimer = claimer
        self.acker = acker
        self.renewals = renewals
        self._finishers: dict[str, Finisher] = {}  # item -> operations to ack it with

    @asynccontextmanager
    async def take(self, *, renew_for: float | None = None,
                   admit: Callable[[QueueItem], bool] | None = None
                   ) -> AsyncIterator[QueueItem]:
        """Wait for an item, claim it and run the block with it (``WorkQueue.take``)."""
        core = self.core
        await core.ensure_layout()
        while True:
            claim = await self.claimer.claim()
            entry = claim.entry
            extras = claim.extras if claim.extras is not None and claim.extras.applied \
                else None
            item = QueueItem(entry.key, claim.data, entry.priority, claim.version, extras)
            if admit is None or admit(item):  # no checkpoint between the claim and this
                break
            # refused: undone as a take cancelled before its block (no delivery counted)
            held = self.renewals.held(entry.key) if core.lease is not None else None
            try:
                await self.acker.fail(claim, NotAdmitted(), started=False)
            finally:
                self.renewals.forget(entry.key, held)
        self._finishers.pop(entry.key, None)
        keepalive = None
        renewal = None
        if core.lease is not None:  # made when the claim was handed to this take
            renewal = self.renewals.held(entry.key)
            if renew_for is not None:
                renewal.until = trio.current_time() + renew_for
            keepalive = functools.partial(
                renew, core.session, claim.claim_path, claim.token, core.lease, renewal
            )
        started = False
        try:
            async with node_scope(
                core.session, claim.claim_path, session_id=claim.session_id, error=ClaimLost,
                keepalive=keepalive, watch_after=_CLAIM_WATCH_AFTER,
            ):
                started = True
                yield item
        except BaseException as exc:
            self._finishers.pop(entry.key, None)
            try:
                await self.acker.fail(claim, exc, started=started)
            finally:
                self.renewals.forget(entry.key, renewal)
            raise
        try:  # until the ack is done, no breaker of ours reads the claim we are deleting
            await self.acker.ack(claim, self._finishers.pop(entry.key, None))
        finally:
            self.renewals.forget(entry.key, renewal)

    def finish_with(self, item: QueueItem, finisher: Finisher) -> None:
        """Ack ``item`` with ``finisher``'s operations (``WorkQueue.finish_with``)."""
        self._finishers[item.name] = finisher
