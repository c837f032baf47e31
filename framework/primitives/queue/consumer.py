"""The consumer half of :class:`~framework.primitives.queue.WorkQueue`: ``take`` (a claim
held for the block, renewed with a lease), and what its end commits.  Claim rounds are in
:mod:`.claims`, acknowledgements, releases and dead letters in :mod:`.acks`."""

from __future__ import annotations

import functools
from contextlib import asynccontextmanager
from typing import AsyncIterator

import trio

from framework.errors import ClaimLost
from framework.primitives.holding import node_scope
from framework.primitives.queue.acks import Acker
from framework.primitives.queue.claims import Claimer
from framework.primitives.queue.items import Finisher, QueueItem
from framework.primitives.queue.lease import Renewal, renew
from framework.primitives.queue.view import QueueView, claim_name_of

#: A claim's node is watched (for a deletion by someone else) only once its block has run
#: this long.  Nobody else deletes a younger claim: a lease breaker waits a whole lease
#: (longer than this) without a renewal, and a claim without a lease ends with its session,
#: which the block's guard watches from the start.  Short tasks so cost no watch at all.
_CLAIM_WATCH_AFTER = 1.0


class Consumer(Claimer, Acker):
    """Takes (see the package doc for the guarantees)."""

    @asynccontextmanager
    async def take(self, *, renew_for: float | None = None) -> AsyncIterator[QueueItem]:
        """Wait for an item, claim it and run the block with it (see the module doc).

        With a ``lease``, the claim is renewed while the block runs, for at most
        ``renew_for`` seconds (default: as long as it runs); a claim not renewed for a whole
        lease is broken by an idle consumer, the block is cancelled with :class:`ClaimLost`
        and the item is delivered again (:mod:`framework.primitives.queue.lease`)."""
        await self._setup()
        claim = await self._claim()
        entry = claim.entry
        extras = claim.extras if claim.extras is not None and claim.extras.applied else None
        item = QueueItem(entry.key, claim.data, entry.priority, claim.version, extras)
        self._finishers.pop(entry.key, None)
        keepalive = None
        renewal = None
        if self.lease is not None:  # made when the claim was handed to this take (_lead_round)
            renewal = self._renewals.setdefault(entry.key, Renewal())
            if renew_for is not None:
                renewal.until = trio.current_time() + renew_for
            keepalive = functools.partial(
                renew, self.session, claim.claim_path, claim.token, self.lease, renewal
            )
        started = False
        try:
            async with node_scope(
                self.session, claim.claim_path, session_id=claim.session_id, error=ClaimLost,
                keepalive=keepalive, watch_after=_CLAIM_WATCH_AFTER,
            ):
                started = True
                yield item
        except BaseException as exc:
            self._finishers.pop(entry.key, None)
            try:
                await self._fail(claim, exc, started=started)
            finally:
                self._forget_renewal(entry.key, renewal)
            raise
        try:  # until the ack is done, no breaker of ours reads the claim we are deleting
            await self._ack(claim, self._finishers.pop(entry.key, None))
        finally:
            self._forget_renewal(entry.key, renewal)

    def finish_with(self, item: QueueItem, finisher: Finisher) -> None:
        """Commit ``finisher``'s operations in the same transaction as the acknowledgement
        of ``item`` (held by this queue object), when its block ends without an error: a
        result record written atomically with the ack, say.  If that transaction is refused
        while the claim is still ours, ``finisher.fallback()`` runs instead and the item is
        acknowledged alone after it; ``finisher.applied`` tells which happened."""
        self._finishers[item.name] = finisher

    def renew_for(self, item: QueueItem, seconds: float) -> None:
        """Renew the lease of ``item`` (held by this queue object) for at most ``seconds``
        more: a holder that cannot stop a stuck handler still lets the item go."""
        renewal = self._renewals.get(item.name)
        if renewal is not None:
            renewal.until = trio.current_time() + seconds

    def _forget_renewal(self, key: str, renewal: Renewal | None) -> None:
        """Drop this delivery's renewal (a later delivery of the same item to another take
        of ours has its own, which stays)."""
        if renewal is not None and self._renewals.get(key) is renewal:
            del self._renewals[key]

    def _renewing(self) -> dict[str, float]:
        """The claims this object holds and renews now, each with the trio time its
        renewal stops (see ``renew``)."""
        now = trio.current_time()
        return {claim_name_of(key): renewal.until for key, renewal in self._renewals.items()
                if now < renewal.until and not renewal.stopped}

    def _get_view(self) -> QueueView:
        if self._view is None:
            self._view = QueueView(self.session, self.items_root, self.claims_root)
        return self._view

