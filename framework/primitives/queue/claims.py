"""Claim rounds of :class:`~framework.primitives.queue.WorkQueue`: the takes waiting in one
object are served by one round that reads their items at once and claims them in one
transaction; idle takes wait in the line (:mod:`.line`); a claim made by an interrupted take
is undone (its delivery count restored); an item whose deliveries were used up by consumers
that died is dead-lettered unclaimed.  See :mod:`.consumer` for ``take`` itself."""

from __future__ import annotations

import functools
import math
import random
import uuid
from typing import Any

import attrs
import trio

from framework import errors
from framework.logs import get_logger
from framework.primitives.queue.acks import Acker, Ending
from framework.primitives.queue.core import QueueCore
from framework.primitives.queue.items import BATCH as _BATCH
from framework.primitives.queue.items import Claim, ClaimExtras, QueueItem
from framework.primitives.queue.lease import LeaseBreaker, Renewal, Renewals, claim_token
from framework.primitives.queue.line import WaitingLine
from framework.primitives.queue.view import Entry, QueueView
from framework.zk import Transaction, cleanup_scope, gather

log = get_logger(__name__)

#: Items ``accept`` refused are remembered (and passed over); past this many, those no
#: longer listed are forgotten.
FOREIGN_PRUNE = 1024

#: Most items a claim round reads while passing over items ``accept`` refuses.
_PROBE = 64

class Claimer:
    """The claim rounds of one queue object (see the module doc).  Its state: the takes
    waiting, the round in flight, the watched view of the queue, its place in the line of
    idle consumers, the items ``accept`` refused, how contended the head is.  It asks
    ``acker`` to undo a claim nobody wants any more and ``renewals`` which claims of ours
    are renewed (those it hands out with a lease start renewing)."""

    def __init__(self, core: QueueCore, acker: Acker, renewals: Renewals) -> None:
        self.core = core
        self.session = core.session
        self.acker = acker
        self.renewals = renewals
        self._view: QueueView | None = None
        self._claiming: set[str] = set()  # keys of the round in flight
        self._contended = 0  # claim rounds left to start at a random place (races lost)
        self._breaker = LeaseBreaker(core.session, core.claims_root)
        self._tickets: list[_Ticket] = []  # takes waiting for a claim round
        self._round: _Round | None = None  # the claim round in flight
        self._line = WaitingLine(core.session, core.waiting)  # our place among idle takes
        self._foreign: set[str] = set()  # items ``accept`` refused (keys), passed over
        self._foreign_bound = FOREIGN_PRUNE  # forget those no longer listed past this many
        self._misses = 0  # items ``accept`` refused in the last claim round
        # the line check in flight, shared by the idle takes
        self._turn: tuple[trio.Event, list[bool]] | None = None

    def reconsider(self) -> None:
        """What ``accept`` takes changed: read again the items it refused, and wake the
        idle takes that wait on the queue (the heads of its line) to look."""
        self._foreign.clear()
        self._misses = 0
        if self._view is not None:
            self._view.wake()

    def _get_view(self) -> QueueView:
        if self._view is None:
            self._view = QueueView(self.session, self.core.items_root, self.core.claims_root)
        return self._view

    async def claim(self) -> Claim:
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
        lockstep.  A lone consumer never collides and so takes items in strict order.
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
                self.renewals.forget(ticket.claim.entry.key, ticket.renewal)
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
            if len(self._foreign) > self._foreign_bound:
                self._forget_foreign(view)
            entries = await view.candidates(self._claiming, self._foreign)
            if not entries:
                # nothing to take: the moment to break leases that ran out (if any
                # can run out, wake up when the next one could)
                current.idle = changed
                if self.core.lease is not None:
                    current.expiry = await self._breaker.check(await view.claims(),
                                                               self.renewals.renewing())
                return
            waiting = [t for t in self._tickets if t.claim is None][:_BATCH]
            # after a round that met items we do not take, read twice as many more ahead
            # (up to the view's window): a run of them is passed over in few rounds
            reading = min(len(waiting) + 2 * self._misses, max(len(waiting), _PROBE))
            chosen = _choose(entries, reading, self._contended > 0)
            self._contended = max(self._contended - 1, 0)
            keys = {entry.key for entry in chosen}
            self._claiming |= keys
            try:
                claims = await self._claim_many(view, chosen, len(waiting))
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
                if self.core.lease is not None:  # renewed from now on: no breaker reads it
                    ticket.renewal = self.renewals.start(ticket.claim.entry.key)
                if ticket.idle is not None:
                    ticket.idle.cancel()
        for claim in claims:  # the takes that wanted them left meanwhile
            await self._abandon(claim)

    async def _claim_many(self, view: QueueView, entries: list[Entry],
                          wanted: int) -> list[Claim]:
        """Claim up to ``wanted`` of ``entries`` in one transaction (their items read at once
        first; those ``accept`` refuses are passed over); return the claims made.  An entry
        claimed by someone else first is dropped and the rest tried again; one whose item is
        gone is forgotten.  Cancelled while claims may
        exist: they are undone before the cancellation goes on.  If this object waits in
        the line of idle consumers, the same transaction deletes its node there: it leaves
        the line exactly when it gets work (so the worker that just started a handler,
        which may block its event loop, is never left a head)."""
        found = await self._read_items(view, entries)
        session_id = await self.session.wait_connected()
        claims = (await self._claims_for(entries, found, session_id))[:wanted]
        place = self._line.place() if session_id == self._line.session_id else None
        try:
            return await self._commit_claims(view, claims, place)
        except BaseException:
            # interrupted (cancelled, most likely) while claims may exist: a claim left
            # behind would block its item for everyone as long as this session lives
            for claim in claims:
                await self._abandon(claim)
            raise

    async def _read_items(self, view: QueueView,
                          entries: list[Entry]) -> dict[str, tuple[bytes, Any]]:
        """The data and stat of each entry's item, read at once (gone ones forgotten)."""
        found: dict[str, tuple[bytes, Any]] = {}

        async def read(entry: Entry) -> None:
            try:
                found[entry.key] = await self.session.get(f"{self.core.items_root}/{entry.key}")
            except errors.NoNodeError:
                view.forget(entry)

        await gather(*[functools.partial(read, entry) for entry in entries])
        return found

    async def _claims_for(self, entries: list[Entry], found: dict[str, tuple[bytes, Any]],
                          session_id: int) -> list[Claim]:
        """The claims to make for the entries read (an item whose deliveries are used up
        is dead-lettered instead)."""
        claims: list[Claim] = []
        self._misses = 0
        for entry in entries:
            if entry.key not in found:
                continue
            data, stat = found[entry.key]
            if not self._accepts(QueueItem(entry.key, data, entry.priority, stat.version + 1)):
                self._foreign.add(entry.key)  # never claimed: no delivery counted
                self._misses += 1
                continue
            if self.core.retry.gives_up(stat.version):
                await self._bury_unclaimed(entry, data, stat.version)
                continue
            extras = self._extras_for(QueueItem(entry.key, data, entry.priority,
                                                stat.version + 1))
            claims.append(Claim(
                entry, data, stat.version + 1, f"{self.core.claims_root}/{entry.claim_name}",
                session_id, claim_token(self.core.owner, uuid.uuid4().hex[:16], self.core.lease),
                extras,
            ))
        return claims

    def _claim_transaction(self, claims: list[Claim], place: str | None,
                           ) -> tuple[Transaction, list[tuple[int, int]]]:
        """The multi that makes ``claims`` (and leaves the line at ``place``), and per
        claim where its extras start and where it ends."""
        txn = self.session.transaction()
        spans = []
        for claim in claims:
            txn.create(claim.claim_path, claim.token, ephemeral=True)
            txn.set(f"{self.core.items_root}/{claim.entry.key}", claim.data,
                    version=claim.version - 1)
            extras_at = len(txn.operations)
            if claim.extras is not None:
                claim.extras.build(txn)
            spans.append((extras_at, len(txn.operations)))
        if place is not None:
            txn.delete(place)
        return txn, spans

    async def _commit_claims(self, view: QueueView, claims: list[Claim],
                             place: str | None) -> list[Claim]:
        """Commit the claims (``claims`` is changed in place: what is in it when this
        raises may exist and is undone by the caller)."""
        races_lost = 0
        while claims:
            txn, spans = self._claim_transaction(claims, place)
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
                    # its extras were refused (the server says why only to the holder,
                    # who does that work itself): claim it without them
                    claims[culprit] = attrs.evolve(claims[culprit], extras=None)
                    continue
                lost = claims.pop(culprit)
                if isinstance(exc.cause, errors.NoNodeError):
                    view.forget(lost.entry)  # gone (acked): claim the others
                    continue
                # claimed by another consumer first: from now on rounds start at a random
                # place near the head, so competitors spread out; the others are tried
                # again once, then a new round reads a fresh list
                self._contended = _SPREAD_ROUNDS
                races_lost += 1
                if races_lost > 1:
                    claims.clear()
                continue
            except errors.SessionExpiredError:
                claims.clear()  # whatever it made went with that session
                return []
            except errors.ConnectionLossError:
                claims[:] = [claim for claim in claims if await self._holds(claim)]
                if place is not None and claims:
                    self._line.left()  # applied: our place went with it
                _applied(claims)
                return list(claims)
            if place is not None:
                self._line.left()
            _applied(claims)
            for claim in claims:
                log.debug("queue.claimed", path=self.core.path, item=claim.entry.key,
                          attempt=claim.version)
            return list(claims)
        return []

    def _accepts(self, item: QueueItem) -> bool:
        """Whether ``accept`` takes ``item`` (any item without it; an ``accept`` that
        raises takes it: its holder sees the problem, where a failure is counted)."""
        if self.core.accept is None:
            return True
        try:
            return bool(self.core.accept(item))
        except Exception as exc:
            log.warning("queue.accept_failed", path=self.core.path, item=item.name,
                        error=f"{type(exc).__name__}: {exc}")
            return True

    def _forget_foreign(self, view: QueueView) -> None:
        """Forget the refused items no longer listed (taken by consumers that accept
        them), so the set stays about as large as what is queued."""
        self._foreign &= view.listed_keys()
        self._foreign_bound = max(FOREIGN_PRUNE, 2 * len(self._foreign))

    def _extras_for(self, item: QueueItem) -> ClaimExtras | None:
        """``claim_with``'s extras for ``item``, built once here to catch what could never
        be sent (a malformed item yields a path the client refuses): such an item is
        claimed without extras, and its holder's block sees the problem, where a failure is
        counted and the item can be dead-lettered, instead of every claim round failing
        on it before anything is sent."""
        if self.core.claim_with is None:
            return None
        try:
            extras = self.core.claim_with(item)
            if extras is not None:
                extras.build(self.session.transaction())
        except Exception as exc:
            log.warning("queue.claim_extras_refused", path=self.core.path, item=item.name,
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
        why = Ending.ABSENT
        with cleanup_scope(self.session) as scope:
            try:
                if await self._holds(claim):
                    _applied([claim])  # made in one transaction with the claim
                    why = await self.acker.finish(
                        claim, functools.partial(self.acker.restore_transaction, claim)
                    )
            except errors.ZooKeeperError:
                why = Ending.LOST  # the session ended: so did the claim
        if scope.cancelled_caught:
            log.warning("queue.claim_left", path=self.core.path, item=claim.entry.key,
                        note="not removed in time: deleted when the connection is back, "
                             "or with the session")
            self.session.delete_later(claim.claim_path, data=claim.token,
                                      session_id=claim.session_id)
        elif why is Ending.APPLIED:
            log.info("queue.claim_abandoned", path=self.core.path, item=claim.entry.key)

    async def _bury_unclaimed(self, entry: Entry, data: bytes, deliveries: int) -> None:
        """Dead-letter an item already delivered ``max_attempts`` times (its last consumer
        crashed), atomically and only if nobody holds a claim on it."""
        await self.session.ensure_path(self.core.dead_letter)
        claim_path = f"{self.core.claims_root}/{entry.claim_name}"
        txn = self.session.transaction()
        txn.create(claim_path, self.core.owner.encode(), ephemeral=True).delete(claim_path)
        txn.delete(f"{self.core.items_root}/{entry.key}", version=deliveries)
        txn.create(self.acker.dead_path(entry, deliveries), data)
        try:
            await txn.commit()
            log.warning("queue.dead_lettered", path=self.core.path, item=entry.key,
                        attempts=deliveries, error="consumer crashed")
        except errors.TransactionFailedError:
            pass


def _applied(claims: list[Claim]) -> None:
    """Mark the extras of claims proven made as committed (they went in one transaction)."""
    for claim in claims:
        if claim.extras is not None:
            claim.extras.applied = True


#: After a lost race, this many claim rounds start at a random place near the head.
_SPREAD_ROUNDS = 32




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

