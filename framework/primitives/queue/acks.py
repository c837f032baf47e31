"""Acknowledgements, releases and dead letters of :class:`~framework.primitives.queue.WorkQueue`.

An ack deletes the claim and the item only while the claim is ours (the item at our
version), with a finisher's operations in the same transaction; the acks of one object
that arrive together are combined into one transaction (group commit).  A failed delivery
releases its claim, or dead-letters the item after ``max_attempts``; one whose block never
started is undone.  Every way of ending a claim reports an :class:`Ending`."""

from __future__ import annotations

import enum
import functools
from typing import Callable

import attrs
import trio

from framework import errors
from framework.errors import ClaimLost
from framework.logs import get_logger
from framework.primitives.queue.core import QueueCore
from framework.primitives.queue.items import BATCH as _BATCH
from framework.primitives.queue.items import Claim, Finisher
from framework.primitives.queue.view import Entry
from framework.zk import Transaction, cleanup_scope

log = get_logger(__name__)

#: An abandoned claim restores its item's delivery count exactly up to this many deliveries
#: (one operation per delivery); beyond that the lost delivery stays counted.
_RESTORE_MAX = 64

def failure_text(exc: BaseException) -> str:
    """``Type: message`` of the failure behind ``exc``: an exception without a message of
    its own that was raised from (or while handling) another stands for that one (a
    consumer's marker for "given up" carries no text: its cause is the error)."""
    seen: set[int] = set()
    while not str(exc) and id(exc) not in seen:
        seen.add(id(exc))
        inner = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
        if inner is None:
            break
        exc = inner
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class Ending(enum.Enum):
    """How an attempt to end a claim (ack, release, dead letter, undo) came out."""

    APPLIED = "applied"          # proven applied
    LOST = "lost"                # the session, and so the claim, ended first
    ENDED = "ended"              # the claim had ended (or the transaction was refused)
    UNKNOWN = "unknown"          # reply lost, and the session changed before we could look
    UNCONFIRMED = "unconfirmed"  # not confirmed before the session could have expired
    FINISHER = "finisher"        # the finisher's operations were refused (the claim holds)
    ABSENT = "absent"            # there was no claim to undo


class AckStage(enum.Enum):
    """Where an ack waiting for a combined commit stands."""

    PENDING = "pending"  # waiting for a commit
    ALONE = "alone"      # refused because of it: it settles itself
    SENT = "sent"        # sent with its reply lost: it confirms its own
    SETTLED = "settled"  # its ``ending`` is known


@attrs.define(eq=False)
class _Ack:
    """An acknowledgement waiting for a combined commit."""

    claim: Claim
    finisher: Finisher | None
    stage: AckStage = AckStage.PENDING
    ending: Ending = Ending.UNCONFIRMED

    def settle(self, ending: Ending) -> None:
        self.stage, self.ending = AckStage.SETTLED, ending


class Acker:
    """Acks, releases, dead letters and undone claims of one queue object (see the module
    doc); its state: the acks waiting for a combined commit."""

    def __init__(self, core: QueueCore) -> None:
        self.core = core
        self.session = core.session
        self._acks: list[_Ack] = []  # acks waiting for a combined commit
        self._committing: trio.Event | None = None  # set when the commit in flight ends

    async def finish(self, claim: Claim, build: Callable[[], Transaction], *,
                      sent: bool = False,
                      refused: Callable[[errors.TransactionFailedError], Ending] | None = None,
                      ) -> Ending:
        """Commit ``build()`` - a transaction that ends our claim and holds only while the
        item is at our version - and confirm it: :attr:`Ending.APPLIED` once it is proven
        applied, else why not (:attr:`~Ending.LOST`, :attr:`~Ending.ENDED` or what
        ``refused`` says of the refusal, :attr:`~Ending.UNKNOWN`).  ``sent``: such a transaction
        was sent already and its reply lost (look before sending it again).  Callers bound
        it in time."""
        while True:
            if self.session.session_id != claim.session_id:
                return Ending.LOST
            try:
                if sent:
                    sent = False
                else:
                    await build().commit()
                    return Ending.APPLIED
            except errors.TransactionFailedError as exc:
                return refused(exc) if refused is not None else Ending.ENDED
            except (errors.SessionExpiredError, errors.NotConnectedError):
                return Ending.UNKNOWN
            except errors.ConnectionLossError:
                pass
            # The reply was lost.  While our session lives, the claim node is ours and only
            # our own transaction removes it: gone means applied.  In another session, an
            # item gone could also be another consumer's ack: we cannot tell.
            try:
                if await self.session.wait_connected() != claim.session_id:
                    return Ending.UNKNOWN
                await self.session.sync(claim.claim_path)
                stat = await self.session.exists(claim.claim_path)
            except (errors.SessionExpiredError, errors.NotConnectedError):
                return Ending.UNKNOWN
            except errors.ConnectionLossError:
                sent = True  # the check was cut: look again, never send blindly again
                continue
            if stat is None:
                return Ending.APPLIED
            if stat.ephemeralOwner != claim.session_id:
                return Ending.ENDED

    def ack_operations(self, claim: Claim, finisher: Finisher | None,
                        txn: Transaction) -> Transaction:
        """Add to ``txn`` the finisher's operations, then the ack: delete claim and item,
        which holds only while the claim is ours (the item at our version)."""
        if finisher is not None:
            finisher.build(txn)
        return txn.delete(claim.claim_path).delete(
            f"{self.core.items_root}/{claim.entry.key}", version=claim.version
        )

    async def ack(self, claim: Claim, finisher: Finisher | None = None) -> None:
        """Acknowledge (with ``finisher``'s operations); raise :class:`ClaimLost` unless the
        ack is proven applied.

        Concurrent acks of one queue object are combined into one transaction (group
        commit): the first to arrive while none is in flight commits its own and every
        ack waiting then; if that is refused, the one refused is settled alone and the
        others are committed again together; after a lost reply each confirms its own."""
        why = Ending.UNCONFIRMED
        with cleanup_scope(self.session) as scope:
            ack = _Ack(claim, finisher)
            self._acks.append(ack)
            try:
                while ack.stage is AckStage.PENDING:
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
            if ack.stage is AckStage.ALONE:
                why = await self._ack_alone(ack, sent=False)
            elif ack.stage is AckStage.SENT:
                why = await self._ack_alone(ack, sent=True)
            else:
                why = ack.ending
        if scope.cancelled_caught:
            why = Ending.UNCONFIRMED
            # if the ack was not applied, our claim still holds the item while this session
            # lives: let it go as soon as ZooKeeper is back (then it is delivered again)
            self.session.delete_later(claim.claim_path, data=claim.token,
                                      session_id=claim.session_id)
        if why is Ending.APPLIED:
            log.debug("queue.acked", path=self.core.path, item=claim.entry.key)
            return
        reason = {
            Ending.LOST: "the session ended before the item was acknowledged; it will be "
                    "delivered again",
            Ending.ENDED: "the claim ended before the item was acknowledged; it will be "
                     "delivered again",
            Ending.UNKNOWN: "the session changed while the acknowledgement was in flight: it may "
                       "or may not have been applied (if not, the item is delivered again)",
            Ending.UNCONFIRMED: "the acknowledgement was not confirmed before the session "
                           "could have expired (ZooKeeper unreachable); unless it was "
                           "applied, the item is delivered again",
        }[why]
        log.warning("queue.claim_lost", path=self.core.path, item=claim.entry.key, during="ack",
                    why=why.value)
        raise ClaimLost(reason)

    async def _commit_acks(self) -> None:
        """Commit the waiting acks (up to ``_BATCH``) in one transaction and settle them:
        settled (with their :class:`Ending`), ``ALONE`` (refused because of it: it settles
        itself) or ``SENT`` (reply lost: it confirms its own).  A refusal caused by one ack leaves
        the others waiting for the next commit."""
        batch = [a for a in self._acks if a.stage is AckStage.PENDING][:_BATCH]
        if len(batch) == 1:  # alone: settled by itself at once (see docs: waiting for a
            batch[0].stage = AckStage.ALONE  # batch cost more than the writes it saved)
            return
        txn = self.session.transaction()
        ends = []
        for ack in batch:
            self.ack_operations(ack.claim, ack.finisher, txn)
            ends.append(len(txn.operations))
        try:
            await txn.commit()
        except errors.TransactionFailedError as exc:
            culprit = next(i for i, end in enumerate(ends) if exc.failed_index < end)
            batch[culprit].stage = AckStage.ALONE
            return
        except errors.ConnectionLossError:
            for ack in batch:
                ack.stage = AckStage.SENT
            return
        except (errors.SessionExpiredError, errors.NotConnectedError):
            for ack in batch:
                ack.settle(Ending.LOST if self.session.session_id != ack.claim.session_id
                           else Ending.UNKNOWN)
            return
        for ack in batch:
            if ack.finisher is not None:
                ack.finisher.applied = True
            ack.settle(Ending.APPLIED)

    async def _ack_alone(self, ack: _Ack, *, sent: bool) -> Ending:
        """Settle one ack by itself: with its finisher's operations, and if those are what
        the server refused (the claim still ours), after running its fallback instead."""
        claim, finisher = ack.claim, ack.finisher

        def refused(exc: errors.TransactionFailedError) -> Ending:
            if finisher is None:
                return Ending.ENDED
            txn = self.session.transaction()
            finisher.build(txn)  # its operations come first in the transaction
            return (Ending.FINISHER if 0 <= exc.failed_index < len(txn.operations)
                    else Ending.ENDED)

        why = await self.finish(
            claim, lambda: self.ack_operations(claim, finisher, self.session.transaction()),
            sent=sent, refused=refused,
        )
        if why is Ending.APPLIED and finisher is not None:
            finisher.applied = True
        if why is Ending.FINISHER:
            assert finisher is not None
            await finisher.fallback()
            why = await self.finish(
                claim, lambda: self.ack_operations(claim, None, self.session.transaction()))
        return why

    async def fail(self, claim: Claim, exc: BaseException, *, started: bool) -> None:
        """End a delivery that did not succeed: release the claim (the item is delivered
        again), dead-letter the item after ``max_attempts``, or - if the block never started
        - undo the delivery altogether."""
        entry = claim.entry
        bury = (
            started
            and isinstance(exc, Exception)
            and not isinstance(exc, ClaimLost)
            and self.core.retry.gives_up(claim.version, exc)
        )
        why = Ending.UNCONFIRMED
        with cleanup_scope(self.session) as scope:
            try:
                if bury:
                    await self.session.ensure_path(self.core.dead_letter)
                    build = self._bury_transaction
                elif started:
                    build = self._release_transaction
                else:
                    build = self.restore_transaction
                why = await self.finish(claim, functools.partial(build, claim))
            except errors.ZooKeeperError:
                why = Ending.LOST
        if scope.cancelled_caught:  # the release was not confirmed: free the item later
            self.session.delete_later(claim.claim_path, data=claim.token,
                                      session_id=claim.session_id)
        if why is not Ending.APPLIED:
            log.info("queue.claim_already_ended", path=self.core.path, item=entry.key,
                     why=why.value,
                     error=type(exc).__name__)
        elif bury:
            log.warning("queue.dead_lettered", path=self.core.path, item=entry.key,
                        attempts=claim.version, error=failure_text(exc))
        else:
            log.info("queue.released", path=self.core.path, item=entry.key,
                     attempt=claim.version, error=type(exc).__name__, restored=not started)

    def _release_transaction(self, claim: Claim) -> Transaction:
        txn = self.session.transaction()
        return txn.check(f"{self.core.items_root}/{claim.entry.key}", claim.version).delete(
            claim.claim_path
        )

    def _bury_transaction(self, claim: Claim) -> Transaction:
        txn = self.session.transaction()
        txn.delete(claim.claim_path)
        txn.delete(f"{self.core.items_root}/{claim.entry.key}", version=claim.version)
        return txn.create(self.dead_path(claim.entry, claim.version), claim.data)

    def restore_transaction(self, claim: Claim) -> Transaction:
        """Delete our claim and put the item back as it was before it: a node's version
        cannot go down, so the item is recreated (same name, same data) and set again up to
        the delivery count it had.  Atomic, and valid only while the item is at our
        version (so only while the claim is ours)."""
        item_path = f"{self.core.items_root}/{claim.entry.key}"
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

    def dead_path(self, entry: Entry, attempts: int) -> str:
        """Where item ``entry`` goes once dead after ``attempts`` deliveries."""
        return f"{self.core.dead_letter}/{entry.claim_name}.{attempts}"
