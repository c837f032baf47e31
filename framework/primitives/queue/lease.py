"""Claim leases of a work queue: a visibility timeout that a stuck owner cannot outlive.

Guarantees:

* A claim made with a lease carries it in its data (a :class:`ClaimToken`).  Its owner
  renews it from the trio side, rewriting the claim node at its current version every
  ``lease / 3`` seconds, until the take's ``renew_for`` runs out; an owner whose trio loop is
  blocked renews nothing.
* A consumer with nothing to take breaks a claim it has seen at one version for a whole
  lease, by its own monotonic clock (no clocks are compared across machines): it deletes the
  claim *at that version*, so a renewal that got in first wins, and the item is delivered
  again.  Only idle consumers look: a busy queue pays nothing.
* The late owner's ack is refused by the server (the claim or the item moved on): its block
  ends with :class:`~framework.errors.ClaimLost` and its result is not the delivery's.
* SUSPENDED: a renewal whose reply was lost reads the claim back before going on.  LOST: the
  claim went with the session; nothing is renewed.

Why the queue needs leases at all (a session stays alive while a handler is stuck in its thread) and
their cost: ``docs/architecture.md`` ("Leases (visibility timeout)").
"""

from __future__ import annotations

import math
from typing import Mapping

import attrs
import trio

from framework import errors, records
from framework.logs import get_logger
from framework.primitives.queue.view import claim_name_of
from framework.zk import Session

log = get_logger(__name__)

@attrs.frozen
class ClaimToken:
    """A claim node's record: who claimed the item (``owner``, host:pid), this delivery's
    ``nonce`` (so a claim tells itself from any later one) and the ``lease`` in seconds
    within which it must be renewed (``None``: no lease)."""

    owner: str
    nonce: str
    lease: float | None = None


def claim_token(owner: str, nonce: str, lease: float | None) -> bytes:
    """A claim node's data (a :class:`ClaimToken`)."""
    return records.encode(ClaimToken(owner, nonce, lease))


def lease_of(data: bytes) -> float | None:
    """The lease written in a claim's data (``None``: the claim has none, or its data is
    not a claim token)."""
    try:
        lease = records.decode(data, ClaimToken).lease
    except records.CorruptRecord:
        return None
    return lease if lease is not None and lease > 0 and math.isfinite(lease) else None


@attrs.define
class Renewal:
    """How long a claim's lease is renewed: until trio time ``until`` (may be changed while
    the claim is held, by :meth:`WorkQueue.renew_for`)."""

    until: float = math.inf
    stopped: bool = False  # renew() let the lease lapse: nothing renews the claim any more


class Renewals:
    """The renewals of the claims one queue object holds, by item name: made when a claim
    round hands a claim to a take, changed by ``renew_for``, forgotten when the delivery
    ends (a later delivery of the same item to another take of the object has its own)."""

    def __init__(self) -> None:
        self._of: dict[str, Renewal] = {}

    def start(self, key: str) -> Renewal:
        """A new renewal for the claim of item ``key`` (replacing any)."""
        renewal = self._of[key] = Renewal()
        return renewal

    def held(self, key: str) -> Renewal:
        """The renewal of item ``key``'s claim (made now if it has none)."""
        return self._of.setdefault(key, Renewal())

    def extend(self, key: str, seconds: float) -> None:
        """Renew item ``key``'s claim for at most ``seconds`` more (nothing if none)."""
        renewal = self._of.get(key)
        if renewal is not None:
            renewal.until = trio.current_time() + seconds

    def forget(self, key: str, renewal: Renewal | None) -> None:
        """Drop this delivery's ``renewal`` (not a later delivery's of the same item)."""
        if renewal is not None and self._of.get(key) is renewal:
            del self._of[key]

    def renewing(self) -> dict[str, float]:
        """The claims renewed now (claim names), each with the trio time its renewal
        stops (see :func:`renew`): the lease breaker does not read those."""
        now = trio.current_time()
        return {claim_name_of(key): renewal.until for key, renewal in self._of.items()
                if now < renewal.until and not renewal.stopped}


async def renew(
    session: Session, claim_path: str, token: bytes, lease: float, renewal: Renewal
) -> str | None:
    """Keep the claim's lease alive until ``renewal.until`` (then let it lapse); return
    why the claim was lost if it was (broken by another consumer, or re-made by one)."""
    version = 0
    interval = lease / 3
    while True:
        await trio.sleep(interval)
        if trio.current_time() >= renewal.until:
            break
        try:
            stat = await session.set(claim_path, token, version=version)
            version = stat.version
            continue
        except (errors.BadVersionError, errors.NoNodeError):
            return "lease broken: not renewed in time"
        except errors.ConnectionLossError:
            pass
        # the renewal's reply was lost: read back which version our claim is at
        while True:
            try:
                data, stat = await session.get(claim_path)
            except errors.NoNodeError:
                return "lease broken: not renewed in time"
            except errors.ConnectionLossError:
                await session.wait_connected()
                continue
            break
        if data != token:
            return "lease broken: the item was claimed again"
        version = stat.version
    renewal.stopped = True  # a later renew_for cannot restart it
    await trio.sleep_forever()  # past the owner's limit: the lease lapses
    return None


@attrs.define
class _Seen:
    version: int
    at: float  # trio time when this version was first seen
    lease: float | None


class LeaseBreaker:
    """An idle consumer's view of the claims' leases (see the module doc)."""

    def __init__(self, session: Session, claims_root: str) -> None:
        self.session = session
        self.claims_root = claims_root
        self._seen: dict[str, _Seen] = {}

    async def check(self, claims: frozenset[str],
                    renewing: Mapping[str, float] | None = None) -> float:
        """Break every lease seen unrenewed for its whole length; return the trio time at
        which the next one could expire (``inf``: none can).  ``renewing``: claims this
        consumer holds and renews, each with the trio time its renewal stops; until then
        it cannot run out, so it is not read, and that time is when to look again."""
        now = trio.current_time()
        soonest = math.inf
        if renewing:
            claims = claims - renewing.keys()
            soonest = min(renewing.values())
        for gone in set(self._seen) - claims:
            del self._seen[gone]
        for name in claims:
            seen = self._seen.get(name)
            if seen is not None and (seen.lease is None or now < seen.at + seen.lease):
                if seen.lease is not None:
                    soonest = min(soonest, seen.at + seen.lease)
                continue
            try:
                data, stat = await self.session.get(f"{self.claims_root}/{name}")
            except errors.NoNodeError:
                self._seen.pop(name, None)
                continue
            if seen is None or stat.version != seen.version:
                seen = self._seen[name] = _Seen(stat.version, now, lease_of(data))
                if seen.lease is not None:
                    soonest = min(soonest, now + seen.lease)
                continue
            await self._break(name, seen)
        return soonest

    async def _break(self, name: str, seen: _Seen) -> None:
        try:
            await self.session.delete(f"{self.claims_root}/{name}", version=seen.version)
        except (errors.BadVersionError, errors.NoNodeError):
            return  # renewed, acked or released meanwhile
        finally:
            self._seen.pop(name, None)
        log.warning("queue.lease_expired", claim=name, lease=seen.lease,
                    note="not renewed in time: the item is delivered again")
