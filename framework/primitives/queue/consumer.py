"""The consumer half of :class:`~framework.primitives.queue.WorkQueue`: claims, acks,
releases, dead letters and leases (at-least-once, acks checked by the server)."""

from __future__ import annotations

import functools
import math
import random
import uuid
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Awaitable, Callable

import attrs
import trio

from framework import errors
from framework.errors import ClaimLost, PermanentFailure
from framework.logs import get_logger
from framework.primitives.holding import node_scope
from framework.primitives.queue.items import Claim, ClaimExtras, Finisher, QueueItem
from framework.primitives.queue.lease import LeaseBreaker, Renewal, lease_token, renew
from framework.primitives.queue.line import WaitingLine
from framework.primitives.queue.view import Entry, QueueView, claim_name_of
from framework.zk import Session, Transaction, cleanup_scope, gather

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
    claim_with: Callable[[QueueItem], ClaimExtras | None] | None
    _owner: str
    _setup: Callable[[], Awaitable[None]]
    _view: QueueView | None
    _claiming: set[str]
    _contended: int
    _breaker: LeaseBreaker
    _renewals: dict[str, Renewal]
    _finishers: dict[str, Finisher]
    _tickets: list[_Ticket]
    _round: _Round | None
    _line: WaitingLine
    _turn: tuple[trio.Event, list[bool]] | None
    _acks: list[_Ack]
    _committing: trio.Event | None

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

    async def _claim(self) -> Claim:
        """Claim the first unclaimed item of an up-to-date list, for this task.

        Concurrent takes of one queue object are combined: the first to arrive while no
        claim round is in flight leads one, for itself and every take waiting then (up to
        ``_BATCH``): it reads their items at once (pipelined) and claims them all in one
        transaction; a take that arrives meanwhile is served by the next round.  A round
        runs in its leader's task (nothing outlives the takes).

        A take with nothing to take waits in the line of idle consumers
        (:mod:`.line`): only the first few in line wait for the queue to change, the others
        for their place to come, so a put wakes a few consumers, not all of them.  A take
        handed a claim by another take's round stops waiting at once.

        Competing consumers read the same list and go for the same head.  The one that loses
        (its claim's create finds the claim node) tries the round's other items once more
        without it, and its next ``_SPREAD_ROUNDS`` rounds start at a random place among the
        first items of the head's priority, so consumers spread out instead of colliding in
        lockstep (measured: 4 workers x 4 slots made 2.7 claim rounds per task when every
        round after a lost race went back to the head).  A lone consumer never collides and
        so takes items in strict order.
        """
        ticket = _Ticket()
        self._tickets.append(ticket)
        try:
            while ticket.claim is None:
                current = self._round
                if current is not None:
                    await current.over.wait()
                    continue
                current = self._round = _Round()
                try:
                    await self._lead_round(current)
                finally:
                    self._round = None
                    current.over.set()
                if ticket.claim is None and current.idle is not None:
                    with trio.CancelScope() as ticket.idle:  # cancelled when handed a claim
                        if await self._my_turn():
                            with trio.move_on_at(current.expiry):
                                await current.idle.wait()
                    ticket.idle = None
        except BaseException:
            if ticket in self._tickets:
                self._tickets.remove(ticket)
            if ticket.claim is not None:  # handed to us as we were cancelled: undo it
                self._forget_renewal(ticket.claim.entry.key, ticket.renewal)
                await self._abandon(ticket.claim)
            if not any(t.claim is None for t in self._tickets):
                await self._line.leave()  # no take of ours waits any more
            raise
        self._tickets.remove(ticket)
        if self._line.node is not None and not any(t.claim is None for t in self._tickets):
            # handed a claim by another take's round while our join was in flight (that
            # round's multi could not include our place): nobody of ours waits any more
            await self._line.leave()
        return ticket.claim

    async def _my_turn(self) -> bool:
        """:meth:`WaitingLine.turn`, once for all the takes of this object waiting now."""
        if self._turn is not None:
            done, answer = self._turn
            await done.wait()
            return answer[0]
        done, answer = trio.Event(), [False]
        self._turn = (done, answer)
        try:
            answer[0] = await self._line.turn()
        finally:
            self._turn = None
            done.set()
        return answer[0]

    async def _lead_round(self, current: _Round) -> None:
        """One claim round: claims for the waiting takes, or ``current.idle`` set to the
        event to wait for when there is nothing to take."""
        view = self._get_view()
        try:
            changed = view.changed
            entries = await view.candidates(self._claiming)
            if not entries:
                # nothing to take: the moment to break leases that ran out (if any
                # can run out, wake up when the next one could)
                current.idle = changed
                if self.lease is not None:
                    current.expiry = await self._breaker.check(await view.claims(),
                                                               self._renewing())
                return
            waiting = [t for t in self._tickets if t.claim is None][:_BATCH]
            chosen = _choose(entries, len(waiting), self._contended > 0)
            self._contended = max(self._contended - 1, 0)
            keys = {entry.key for entry in chosen}
            self._claiming |= keys
            try:
                claims = await self._claim_many(view, chosen)
            finally:
                self._claiming -= keys
        except (errors.ConnectionLossError, errors.SessionExpiredError):
            view.invalidate_all()
            await self.session.wait_connected()
            return
        for ticket in self._tickets:
            if not claims:
                break
            if ticket.claim is None:
                ticket.claim = claims.pop(0)
                if self.lease is not None:  # renewed from now on: no breaker reads it
                    ticket.renewal = self._renewals[ticket.claim.entry.key] = Renewal()
                if ticket.idle is not None:
                    ticket.idle.cancel()
        for claim in claims:  # the takes that wanted them left meanwhile
            await self._abandon(claim)

    async def _claim_many(self, view: QueueView, entries: list[Entry]) -> list[Claim]:
        """Claim ``entries`` in one transaction (their items read at once first); return
        the claims made.  An entry claimed by someone else first is dropped and the rest
        tried again; one whose item is gone is forgotten.  Cancelled while claims may
        exist: they are undone before the cancellation goes on.  If this object waits in
        the line of idle consumers, the same transaction deletes its node there: it leaves
        the line exactly when it gets work (so the worker that just started a handler,
        which may block its event loop, is never left a head)."""
        session = self.session
        found: dict[str, tuple[bytes, Any]] = {}

        async def read(entry: Entry) -> None:
            try:
                found[entry.key] = await session.get(f"{self.items_root}/{entry.key}")
            except errors.NoNodeError:
                view.forget(entry)

        await gather(*[functools.partial(read, entry) for entry in entries])
        session_id = await session.wait_connected()
        claims: list[Claim] = []
        for entry in entries:
            if entry.key not in found:
                continue
            data, stat = found[entry.key]
            if self.max_attempts is not None and stat.version >= self.max_attempts:
                await self._bury_unclaimed(entry, data, stat.version)
                continue
            extras = self._extras_for(QueueItem(entry.key, data, entry.priority,
                                                stat.version + 1))
            claims.append(Claim(
                entry, data, stat.version + 1, f"{self.claims_root}/{entry.claim_name}",
                session_id, lease_token(f"{self._owner}:{uuid.uuid4().hex[:16]}", self.lease),
                extras,
            ))
        place = self._line.place() if session_id == self._line.session_id else None
        races_lost = 0
        try:
            while claims:
                txn = session.transaction()
                spans = []  # per claim: where its extras start, where it ends
                for claim in claims:
                    txn.create(claim.claim_path, claim.token, ephemeral=True)
                    txn.set(f"{self.items_root}/{claim.entry.key}", claim.data,
                            version=claim.version - 1)
                    extras_at = len(txn.operations)
                    if claim.extras is not None:
                        claim.extras.build(txn)
                    spans.append((extras_at, len(txn.operations)))
                if place is not None:
                    txn.delete(place)
                try:
                    await txn.commit()
                except errors.TransactionFailedError as exc:
                    failed = exc.failed_index
                    if place is not None and failed == len(txn.operations) - 1:
                        place = None  # our place in line is gone: claim without it
                        self._line.left()
                        continue
                    culprit = next((k for k, (_, end) in enumerate(spans) if failed < end), 0)
                    if failed >= spans[culprit][0]:
                        # its extras were refused (the server says why only to the
                        # holder, who does that work itself): claim it without them
                        claims[culprit] = attrs.evolve(claims[culprit], extras=None)
                        continue
                    lost = claims.pop(culprit)
                    if isinstance(exc.cause, errors.NoNodeError):
                        view.forget(lost.entry)  # gone (acked): claim the others
                        continue
                    # claimed by another consumer first: from now on rounds start at a
                    # random place near the head, so competitors spread out; the others
                    # are tried again once, then a new round reads a fresh list
                    self._contended = _SPREAD_ROUNDS
                    races_lost += 1
                    if races_lost > 1:
                        return []
                    continue
                except errors.SessionExpiredError:
                    return []  # whatever it made went with that session
                except errors.ConnectionLossError:
                    claims = [claim for claim in claims if await self._holds(claim)]
                    if place is not None and claims:
                        self._line.left()  # applied: our place went with it
                    _applied(claims)
                    return claims
                if place is not None:
                    self._line.left()
                _applied(claims)
                for claim in claims:
                    log.debug("queue.claimed", path=self.path, item=claim.entry.key,
                              attempt=claim.version)
                return claims
            return []
        except BaseException:
            # interrupted (cancelled, most likely) while claims may exist: a claim left
            # behind would block its item for everyone as long as this session lives
            for claim in claims:
                await self._abandon(claim)
            raise

    def _extras_for(self, item: QueueItem) -> ClaimExtras | None:
        """``claim_with``'s extras for ``item``, built once here to catch what could never
        be sent (a malformed item yields a path the client refuses): such an item is
        claimed without extras, and its holder's block sees the problem, where a failure is
        counted and the item can be dead-lettered, instead of every claim round failing
        on it before anything is sent."""
        if self.claim_with is None:
            return None
        try:
            extras = self.claim_with(item)
            if extras is not None:
                extras.build(self.session.transaction())
        except Exception as exc:
            log.warning("queue.claim_extras_refused", path=self.path, item=item.name,
                        error=f"{type(exc).__name__}: {exc}")
            return None
        return extras

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
                    _applied([claim])  # made in one transaction with the claim
                    why = await self._finish(
                        claim, functools.partial(self._restore_transaction, claim)
                    )
            except errors.ZooKeeperError:
                why = "lost"  # the session ended: so did the claim
        if scope.cancelled_caught:
            log.warning("queue.claim_left", path=self.path, item=claim.entry.key,
                        note="not removed in time: deleted when the connection is back, "
                             "or with the session")
            self.session.delete_later(claim.claim_path, data=claim.token,
                                      session_id=claim.session_id)
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
        if claim.extras is not None and claim.extras.applied:
            claim.extras.undo(txn)
        if before > _RESTORE_MAX:
            return txn.check(item_path, claim.version).delete(claim.claim_path)
        txn.delete(claim.claim_path).delete(item_path, version=claim.version)
        txn.create(item_path, claim.data if before == 0 else b"")
        for version in range(before):
            txn.set(item_path, claim.data if version == before - 1 else b"", version=version)
        return txn

    async def _finish(self, claim: Claim, build: Callable[[], Transaction], *,
                      sent: bool = False,
                      refused: Callable[[errors.TransactionFailedError], str] | None = None,
                      ) -> str | None:
        """Commit ``build()`` - a transaction that ends our claim and holds only while the
        item is at our version - and confirm it.  ``None`` once it is proven applied, else
        why not: ``"lost"`` (the session, and so the claim, ended first), ``"ended"`` (the
        claim ended, or what ``refused`` says of the refusal), ``"unknown"`` (the reply was
        lost and the session changed before we could look).  ``sent``: such a transaction
        was sent already and its reply lost (look before sending it again).  Callers bound
        it in time."""
        while True:
            if self.session.session_id != claim.session_id:
                return "lost"
            try:
                if sent:
                    sent = False
                else:
                    await build().commit()
                    return None
            except errors.TransactionFailedError as exc:
                return refused(exc) if refused is not None else "ended"
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

    def _ack_operations(self, claim: Claim, finisher: Finisher | None,
                        txn: Transaction) -> Transaction:
        """Add to ``txn`` the finisher's operations, then the ack: delete claim and item,
        which holds only while the claim is ours (the item at our version)."""
        if finisher is not None:
            finisher.build(txn)
        return txn.delete(claim.claim_path).delete(
            f"{self.items_root}/{claim.entry.key}", version=claim.version
        )

    async def _ack(self, claim: Claim, finisher: Finisher | None = None) -> None:
        """Acknowledge (with ``finisher``'s operations); raise :class:`ClaimLost` unless the
        ack is proven applied.

        Concurrent acks of one queue object are combined into one transaction (group
        commit): the first to arrive while none is in flight commits its own and every
        ack waiting then; if that is refused, the one refused is settled alone and the
        others are committed again together; after a lost reply each confirms its own."""
        why: str | None = "unconfirmed"
        with cleanup_scope(self.session) as scope:
            ack = _Ack(claim, finisher)
            self._acks.append(ack)
            try:
                while ack.why is _PENDING:
                    if self._committing is not None:
                        await self._committing.wait()
                        continue
                    self._committing = trio.Event()
                    try:
                        await self._commit_acks()
                    finally:
                        self._committing.set()
                        self._committing = None
            finally:
                if ack in self._acks:
                    self._acks.remove(ack)
            why = ack.why
            if why is _ALONE:
                why = await self._ack_alone(ack, sent=False)
            elif why is _SENT:
                why = await self._ack_alone(ack, sent=True)
        if scope.cancelled_caught:
            why = "unconfirmed"
            # if the ack was not applied, our claim still holds the item while this session
            # lives: let it go as soon as ZooKeeper is back (then it is delivered again)
            self.session.delete_later(claim.claim_path, data=claim.token,
                                      session_id=claim.session_id)
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
            "unconfirmed": "the acknowledgement was not confirmed before the session "
                           "could have expired (ZooKeeper unreachable); unless it was "
                           "applied, the item is delivered again",
        }[why]
        log.warning("queue.claim_lost", path=self.path, item=claim.entry.key, during="ack",
                    why=why)
        raise ClaimLost(reason)

    async def _commit_acks(self) -> None:
        """Commit the waiting acks (up to ``_BATCH``) in one transaction and settle them:
        ``None`` (applied), ``_ALONE`` (refused because of it: it settles itself) or
        ``_SENT`` (reply lost: it confirms its own).  A refusal caused by one ack leaves
        the others waiting for the next commit."""
        batch = [a for a in self._acks if a.why is _PENDING][:_BATCH]
        if len(batch) == 1:
            batch[0].why = _ALONE
            return
        txn = self.session.transaction()
        ends = []
        for ack in batch:
            self._ack_operations(ack.claim, ack.finisher, txn)
            ends.append(len(txn.operations))
        try:
            await txn.commit()
        except errors.TransactionFailedError as exc:
            culprit = next(i for i, end in enumerate(ends) if exc.failed_index < end)
            batch[culprit].why = _ALONE
            return
        except errors.ConnectionLossError:
            for ack in batch:
                ack.why = _SENT
            return
        except (errors.SessionExpiredError, errors.NotConnectedError):
            for ack in batch:
                ack.why = "lost" if self.session.session_id != ack.claim.session_id \
                    else "unknown"
            return
        for ack in batch:
            if ack.finisher is not None:
                ack.finisher.applied = True
            ack.why = None

    async def _ack_alone(self, ack: _Ack, *, sent: bool) -> str | None:
        """Settle one ack by itself: with its finisher's operations, and if those are what
        the server refused (the claim still ours), after running its fallback instead."""
        claim, finisher = ack.claim, ack.finisher

        def refused(exc: errors.TransactionFailedError) -> str:
            if finisher is None:
                return "ended"
            txn = self.session.transaction()
            finisher.build(txn)  # its operations come first in the transaction
            return "finisher" if 0 <= exc.failed_index < len(txn.operations) else "ended"

        why = await self._finish(
            claim, lambda: self._ack_operations(claim, finisher, self.session.transaction()),
            sent=sent, refused=refused,
        )
        if why is None and finisher is not None:
            finisher.applied = True
        if why == "finisher":
            assert finisher is not None
            await finisher.fallback()
            why = await self._finish(
                claim, lambda: self._ack_operations(claim, None, self.session.transaction()))
        return why

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
        with cleanup_scope(self.session) as scope:
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
        if scope.cancelled_caught:  # the release was not confirmed: free the item later
            self.session.delete_later(claim.claim_path, data=claim.token,
                                      session_id=claim.session_id)
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


def _applied(claims: list[Claim]) -> None:
    """Mark the extras of claims proven made as committed (they went in one transaction)."""
    for claim in claims:
        if claim.extras is not None:
            claim.extras.applied = True


#: After a lost race, this many claim rounds start at a random place near the head.
_SPREAD_ROUNDS = 32


#: At most this many takes are served by one claim round, and acks by one commit.
_BATCH = 16

#: A claim's node is watched (for a deletion by someone else) only once its block has run
#: this long.  Nobody else deletes a younger claim: a lease breaker waits a whole lease
#: (longer than this) without a renewal, and a claim without a lease ends with its session,
#: which the block's guard watches from the start.  Short tasks so cost no watch at all.
_CLAIM_WATCH_AFTER = 1.0


@attrs.define(eq=False)
class _Ticket:
    """A take waiting for a claim round to hand it a claim."""

    claim: Claim | None = None
    idle: trio.CancelScope | None = None  # its wait while there is nothing to take
    renewal: Renewal | None = None  # its claim's (with a lease), from the hand-out on


@attrs.define(eq=False)
class _Round:
    """A claim round in flight.  ``idle``: the queue had nothing to take; wait for this
    event (a watched list changed) or until ``expiry`` (a lease may run out)."""

    over: trio.Event = attrs.field(factory=trio.Event)
    idle: trio.Event | None = None
    expiry: float = math.inf


#: An ack's state: waiting for a commit, to be settled by itself, or sent with its reply lost.
_PENDING, _ALONE, _SENT = "pending", "alone", "sent"


@attrs.define(eq=False)
class _Ack:
    """An acknowledgement waiting for a combined commit; ``why`` as ``_finish`` says it, or
    one of the states above."""

    claim: Claim
    finisher: Finisher | None
    why: str | None = _PENDING


def _choose(entries: list[Entry], count: int, spread: bool) -> list[Entry]:
    """``count`` distinct entries to claim: the first ones, or - while competitors are
    about (``spread``) - a run starting at a random place among the first items of the
    head's priority (at most the view's window), so consumers reading the same list go
    for different items."""
    start = 0
    if spread:
        same = 1
        while same < len(entries) and entries[same].priority == entries[0].priority:
            same += 1
        start = random.randrange(max(same - count, 0) + 1)
    chosen = entries[start:start + count]
    if len(chosen) < count:
        chosen += entries[:min(start, count - len(chosen))]
    return chosen
