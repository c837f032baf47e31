"""The consumer half of :class:`~framework.primitives.queue.WorkQueue`: claims, acks,
releases, dead letters and leases (at-least-once, acks checked by the server)."""

from __future__ import annotations

import functools
import math
import random
import uuid
from contextlib import asynccontextmanager
from typing import AsyncIterator, Awaitable, Callable

import trio

from framework import errors
from framework.errors import ClaimLost, PermanentFailure
from framework.logs import get_logger
from framework.primitives.holding import node_scope
from framework.primitives.queue.items import Claim, QueueItem
from framework.primitives.queue_lease import LeaseBreaker, Renewal, lease_token, renew
from framework.primitives.queue_view import Entry, QueueView
from framework.zk import Session, Transaction, cleanup_bound, cleanup_scope

log = get_logger("framework.primitives.queue")

#: An abandoned claim restores its item's delivery count exactly up to this many deliveries
#: (one operation per delivery); beyond that the lost delivery stays counted.
_RESTORE_MAX = 64


class Consumer:
    """Takes (see the package doc for the guarantees)."""

    # state shared with the other halves of WorkQueue (set in its __init__)
    session: Session
    path: str
    items_root: str
    claims_root: str
    puts_root: str
    dead_letter: str
    bucket_size: int
    max_item_bytes: int
    max_attempts: int | None
    lease: float | None
    _owner: str
    _setup: Callable[[], Awaitable[None]]
    _view: QueueView | None
    _claiming: set[str]
    _contended: bool
    _breaker: LeaseBreaker
    _renewals: dict[str, Renewal]

    @asynccontextmanager
    async def take(self, *, renew_for: float | None = None) -> AsyncIterator[QueueItem]:
        """Wait for an item, claim it and run the block with it (see the module doc).

        With a ``lease``, the claim is renewed while the block runs, for at most
        ``renew_for`` seconds (default: as long as it runs); a claim not renewed for a whole
        lease is broken by an idle consumer, the block is cancelled with :class:`ClaimLost`
        and the item is delivered again (:mod:`framework.primitives.queue_lease`)."""
        await self._setup()
        claim = await self._claim()
        entry = claim.entry
        item = QueueItem(entry.key, claim.data, entry.priority, claim.version)
        keepalive = None
        if self.lease is not None:
            renewal = self._renewals[entry.key] = Renewal()
            if renew_for is not None:
                renewal.until = trio.current_time() + renew_for
            keepalive = functools.partial(
                renew, self.session, claim.claim_path, claim.token, self.lease, renewal
            )
        started = False
        try:
            async with node_scope(
                self.session, claim.claim_path, session_id=claim.session_id, error=ClaimLost,
                keepalive=keepalive,
            ):
                started = True
                yield item
        except BaseException as exc:
            self._renewals.pop(entry.key, None)
            await self._fail(claim, exc, started=started)
            raise
        self._renewals.pop(entry.key, None)
        await self._ack(claim)

    def renew_for(self, item: QueueItem, seconds: float) -> None:
        """Renew the lease of ``item`` (held by this queue object) for at most ``seconds``
        more: a holder that cannot stop a stuck handler still lets the item go."""
        renewal = self._renewals.get(item.name)
        if renewal is not None:
            renewal.until = trio.current_time() + seconds

    def _get_view(self) -> QueueView:
        if self._view is None:
            self._view = QueueView(self.session, self.items_root, self.claims_root)
        return self._view

    async def _claim(self) -> Claim:
        """Claim the first unclaimed item of an up-to-date list.

        Competing consumers read the same list and go for the same head.  The one that loses
        (its claim's create finds the claim node) does not re-read and race again for the
        next head: it tries a random item among the next few of the same priority, and starts
        its next take the same way, so consumers spread out instead of colliding in lockstep.
        A lone consumer never collides and so takes items in strict order.
        """
        view = self._get_view()
        while True:
            changed = view.changed
            try:
                entries = await view.candidates(self._claiming)
                if not entries:
                    # nothing to take: the moment to break leases that ran out (if any
                    # can run out, wake up when the next one could)
                    expiry = math.inf
                    if self.lease is not None:
                        expiry = await self._breaker.check(await view.claims())
                    with trio.move_on_at(expiry):
                        await changed.wait()
                    continue
                # after a contended take, start at a random item near the head right away
                index = _spread(entries, -1) if self._contended else 0
                self._contended = False
                while index < len(entries):
                    entry = entries[index]
                    if entry.key in self._claiming:
                        index += 1
                        continue
                    self._claiming.add(entry.key)
                    try:
                        claim = await self._try_claim(view, entry)
                    finally:
                        self._claiming.discard(entry.key)
                    if isinstance(claim, Claim):
                        return claim
                    if claim is _GONE:  # our list was older than that item's end: next one
                        index += 1
                        continue
                    self._contended = True
                    index = _spread(entries, index)
            except (errors.ConnectionLossError, errors.SessionExpiredError):
                view.invalidate_all()
                await self.session.wait_connected()

    async def _try_claim(self, view: QueueView, entry: Entry) -> Claim | object | None:
        """Our claim; ``_GONE`` if the item is gone (acked, or dead-lettered now); ``None``
        if another consumer claimed it first."""
        session = self.session
        item_path = f"{self.items_root}/{entry.key}"
        try:
            data, stat = await session.get(item_path)
        except errors.NoNodeError:
            view.forget(entry)
            return _GONE
        if self.max_attempts is not None and stat.version >= self.max_attempts:
            await self._bury_unclaimed(entry, data, stat.version)
            return _GONE
        session_id = await session.wait_connected()
        claim = Claim(
            entry, data, stat.version + 1, f"{self.claims_root}/{entry.claim_name}",
            session_id, lease_token(f"{self._owner}:{uuid.uuid4().hex[:16]}", self.lease),
        )
        txn = session.transaction()
        txn.create(claim.claim_path, claim.token, ephemeral=True)
        txn.set(item_path, data, version=stat.version)
        try:
            try:
                await txn.commit()
            except errors.TransactionFailedError:
                return None  # claimed (or changed) by someone else
            except errors.SessionExpiredError:
                return None  # whatever it made went with that session
            except errors.ConnectionLossError:
                if not await self._holds(claim):
                    return None
        except BaseException:
            # interrupted (cancelled, most likely) while the claim may exist: a claim left
            # behind would block the item for everyone as long as this session lives
            await self._abandon(claim)
            raise
        log.debug("queue.claimed", path=self.path, item=entry.key, attempt=claim.version)
        return claim

    async def _holds(self, claim: Claim) -> bool:
        """Whether our claim node exists, in the session that made it (after a lost reply)."""
        if await self.session.wait_connected() != claim.session_id:
            return False
        await self.session.sync(claim.claim_path)
        try:
            data, stat = await self.session.get(claim.claim_path)
        except errors.NoNodeError:
            return False
        return data == claim.token and stat.ephemeralOwner == claim.session_id

    async def _abandon(self, claim: Claim) -> None:
        """Undo a claim that may have been made by an interrupted take (shielded, bounded):
        if it exists, delete it and restore the item's delivery count."""
        why: str | None = "absent"
        with cleanup_scope(self.session) as scope:
            try:
                if await self._holds(claim):
                    why = await self._finish(
                        claim, functools.partial(self._restore_transaction, claim)
                    )
            except errors.ZooKeeperError:
                why = "lost"  # the session ended: so did the claim
        if scope.cancelled_caught:
            log.warning("queue.claim_left", path=self.path, item=claim.entry.key,
                        note="not removed within the session timeout; goes with the session")
        elif why is None:
            log.info("queue.claim_abandoned", path=self.path, item=claim.entry.key)

    def _restore_transaction(self, claim: Claim) -> Transaction:
        """Delete our claim and put the item back as it was before it: a node's version
        cannot go down, so the item is recreated (same name, same data) and set again up to
        the delivery count it had.  Atomic, and valid only while the item is at our
        version (so only while the claim is ours)."""
        item_path = f"{self.items_root}/{claim.entry.key}"
        before = claim.version - 1
        txn = self.session.transaction()
        if before > _RESTORE_MAX:
            return txn.check(item_path, claim.version).delete(claim.claim_path)
        txn.delete(claim.claim_path).delete(item_path, version=claim.version)
        txn.create(item_path, claim.data if before == 0 else b"")
        for version in range(before):
            txn.set(item_path, claim.data if version == before - 1 else b"", version=version)
        return txn

    async def _finish(self, claim: Claim, build: Callable[[], Transaction]) -> str | None:
        """Commit ``build()`` - a transaction that ends our claim and holds only while the
        item is at our version - and confirm it.  ``None`` once it is proven applied, else
        why not: ``"lost"`` (the session, and so the claim, ended first), ``"ended"`` (the
        claim ended), ``"unknown"`` (the reply was lost and the session changed before we
        could look).  Callers bound it in time."""
        while True:
            if self.session.session_id != claim.session_id:
                return "lost"
            try:
                await build().commit()
                return None
            except errors.TransactionFailedError:
                return "ended"
            except (errors.SessionExpiredError, errors.NotConnectedError):
                return "unknown"
            except errors.ConnectionLossError:
                pass
            # The reply was lost.  While our session lives, the claim node is ours and only
            # our own transaction removes it: gone means applied.  In another session, an
            # item gone could also be another consumer's ack: we cannot tell.
            try:
                if await self.session.wait_connected() != claim.session_id:
                    return "unknown"
                await self.session.sync(claim.claim_path)
                stat = await self.session.exists(claim.claim_path)
            except (errors.SessionExpiredError, errors.NotConnectedError):
                return "unknown"
            except errors.ConnectionLossError:
                continue
            if stat is None:
                return None
            if stat.ephemeralOwner != claim.session_id:
                return "ended"
            # not applied: send it again

    def _ack_transaction(self, claim: Claim) -> Transaction:
        """Delete claim and item in one transaction that holds only while the claim is ours."""
        txn = self.session.transaction()
        return txn.delete(claim.claim_path).delete(
            f"{self.items_root}/{claim.entry.key}", version=claim.version
        )

    async def _ack(self, claim: Claim) -> None:
        """Acknowledge; raise :class:`ClaimLost` unless the ack is proven applied."""
        why: str | None = "unconfirmed"
        with cleanup_scope(self.session) as scope:
            why = await self._finish(claim, functools.partial(self._ack_transaction, claim))
        if scope.cancelled_caught:
            why = "unconfirmed"
        if why is None:
            log.debug("queue.acked", path=self.path, item=claim.entry.key)
            return
        reason = {
            "lost": "the session ended before the item was acknowledged; it will be "
                    "delivered again",
            "ended": "the claim ended before the item was acknowledged; it will be "
                     "delivered again",
            "unknown": "the session changed while the acknowledgement was in flight: it may "
                       "or may not have been applied (if not, the item is delivered again)",
            "unconfirmed": "the acknowledgement was not confirmed within "
                           f"{cleanup_bound(self.session):g}s "
                           "(ZooKeeper unreachable); unless it was applied, the item is "
                           "delivered again",
        }[why]
        log.warning("queue.claim_lost", path=self.path, item=claim.entry.key, during="ack",
                    why=why)
        raise ClaimLost(reason)

    async def _fail(self, claim: Claim, exc: BaseException, *, started: bool) -> None:
        """End a delivery that did not succeed: release the claim (the item is delivered
        again), dead-letter the item after ``max_attempts``, or - if the block never started
        - undo the delivery altogether."""
        entry = claim.entry
        bury = (
            started
            and isinstance(exc, Exception)
            and not isinstance(exc, ClaimLost)
            and (
                isinstance(exc, PermanentFailure)
                or (self.max_attempts is not None and claim.version >= self.max_attempts)
            )
        )
        why: str | None = "unconfirmed"
        with cleanup_scope(self.session):
            try:
                if bury:
                    await self.session.ensure_path(self.dead_letter)
                    build = self._bury_transaction
                elif started:
                    build = self._release_transaction
                else:
                    build = self._restore_transaction
                why = await self._finish(claim, functools.partial(build, claim))
            except errors.ZooKeeperError:
                why = "lost"
        if why is not None:
            log.info("queue.claim_already_ended", path=self.path, item=entry.key, why=why,
                     error=type(exc).__name__)
        elif bury:
            log.warning("queue.dead_lettered", path=self.path, item=entry.key,
                        attempts=claim.version, error=repr(exc))
        else:
            log.info("queue.released", path=self.path, item=entry.key,
                     attempt=claim.version, error=type(exc).__name__, restored=not started)

    def _release_transaction(self, claim: Claim) -> Transaction:
        txn = self.session.transaction()
        return txn.check(f"{self.items_root}/{claim.entry.key}", claim.version).delete(
            claim.claim_path
        )

    def _bury_transaction(self, claim: Claim) -> Transaction:
        txn = self.session.transaction()
        txn.delete(claim.claim_path)
        txn.delete(f"{self.items_root}/{claim.entry.key}", version=claim.version)
        return txn.create(self._dead_path(claim.entry, claim.version), claim.data)

    async def _bury_unclaimed(self, entry: Entry, data: bytes, deliveries: int) -> None:
        """Dead-letter an item already delivered ``max_attempts`` times (its last consumer
        crashed), atomically and only if nobody holds a claim on it."""
        await self.session.ensure_path(self.dead_letter)
        claim_path = f"{self.claims_root}/{entry.claim_name}"
        txn = self.session.transaction()
        txn.create(claim_path, self._owner.encode(), ephemeral=True).delete(claim_path)
        txn.delete(f"{self.items_root}/{entry.key}", version=deliveries)
        txn.create(self._dead_path(entry, deliveries), data)
        try:
            await txn.commit()
            log.warning("queue.dead_lettered", path=self.path, item=entry.key,
                        attempts=deliveries, error="consumer crashed")
        except errors.TransactionFailedError:
            pass

    def _dead_path(self, entry: Entry, attempts: int) -> str:
        return f"{self.dead_letter}/{entry.claim_name}.{attempts}"


#: What ``_try_claim`` returns for an item that is gone.
_GONE = object()

#: After a lost race, the next attempt is drawn from this many following items.
_SPREAD = 8


def _spread(entries: list[Entry], lost: int) -> int:
    """The index to try after losing the race for ``entries[lost]``: a random one among
    the next ``_SPREAD`` items of the same priority (or simply the next one)."""
    priority = entries[max(lost, 0)].priority
    end = lost + 1
    while end < len(entries) and end - lost <= _SPREAD and entries[end].priority == priority:
        end += 1
    return random.randrange(lost + 1, end) if end > lost + 1 else lost + 1
