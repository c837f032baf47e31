"""A counting semaphore: at most ``max_leases`` holders at once, in any number of processes.

Layout: the semaphore's path is a persistent node whose data is ``max_leases`` in decimal
(every client must ask for the same number; another one is refused with
:class:`ConfigurationError`).  Each contender creates an ephemeral sequential node
``lease-{guid}-NNNNNNNNNN`` under it (a protected create: a lost reply is recovered by its
GUID, never duplicated), whose data is the contender's identifier.

Rule: a contender holds a lease while fewer than ``max_leases`` contender nodes sort below
its own.  Nodes are only ever added *above* existing ones, so a contender's rank never
grows: once a holder, it stays one until its node goes, and at most ``max_leases`` nodes can
rank below ``max_leases`` at any moment.

Waiting without a herd (no watch on the parent, so a release never wakes every waiter):

* the *first* waiter (exactly ``max_leases`` nodes below it) watches those holders' nodes
  (``exists``): any release promotes it, and only it;
* every other waiter watches only its predecessor's node (``get``): it is woken when the
  predecessor goes away, or when the predecessor is promoted, which writes its node once
  (version 0 -> 1) whenever some contender followed it; the woken waiter is then the first.

State machine of one contender::

    create node -> list -> rank < max_leases ------------------------> HOLDING -> released
                             | first waiter: watch the holders  ^  (signal the successor)
                             | other waiter: watch predecessor  |
                             +---- woken: list again -----------+

Costs: an uncontended acquire is a create and a list (plus a read of the semaphore's node
once per object), and the lease's scope sets one ``exists`` watch on its node; a release is
a delete.  A promotion costs a list and, with waiters behind,
one write; the new first waiter then sets ``max_leases`` exists-watches.

A lease is a scope (:func:`framework.primitives.holding.node_scope`):
``async with semaphore.acquire(timeout=5) as lease:``.  SUSPENDED: a waiter keeps waiting
and resumes after reconnection; a holder's body is cancelled after the session's
``suspended_grace`` (at its trust deadline at the latest) and :class:`LeaseLost` is raised.
LOST: a waiter contends again in the new session; a holder's body is cancelled and
:class:`LeaseLost` raised (its node went with the session).  Deleting the lease node (by
anyone) ends the lease too.  :class:`LeaseTimeout` when not acquired in time.  The contender
node never leaks: a cancelled, timed-out or failed acquire deletes it before the error
leaves ``acquire``.
"""

from __future__ import annotations

import functools
from contextlib import asynccontextmanager
from typing import AsyncIterator

import attrs
import trio

from framework import errors
from framework.errors import ConfigurationError, LeaseLost, LeaseTimeout
from framework.logs import get_logger
from framework.primitives.holding import node_scope
from framework.primitives.lock import release_node
from framework.zk import (
    Session,
    Transaction,
    basename,
    create_protected,
    delete_guid_nodes,
    gather,
    new_guid,
    sequence_of,
    validate_path,
)

log = get_logger("framework.primitives.semaphore")

PREFIX = "lease-"


@attrs.frozen(eq=False)
class Lease:
    """Proof of holding one of the semaphore's leases, valid inside its ``async with``.

    ``node`` is the lease's znode; :meth:`fence` adds a check of it to a transaction, so a
    write made under the lease is refused by the server once the lease is gone."""

    semaphore_path: str
    node: str
    session_id: int

    def fence(self, txn: Transaction) -> Transaction:
        return txn.check(self.node, -1)


class _Vanished(Exception):
    """Our contender node disappeared while we waited (deleted, or the session expired)."""


def _contenders(names: list[str]) -> list[str]:
    return sorted((n for n in names if n.startswith(PREFIX) and n[-10:].isdigit()),
                  key=sequence_of)


def check_leases(max_leases: object) -> int:
    if isinstance(max_leases, bool) or not isinstance(max_leases, int) or max_leases < 1:
        raise ConfigurationError(f"max_leases must be an int >= 1, got {max_leases!r}")
    return max_leases


class Semaphore:
    """A counting semaphore at ``path`` with ``max_leases`` leases (the recipe owns the
    path's children).  Contract, layout and costs: see the module."""

    def __init__(
        self, session: Session, path: str, max_leases: int, identifier: bytes = b""
    ) -> None:
        validate_path(path, allow_root=False)
        self.session = session
        self.path = path
        self.max_leases = check_leases(max_leases)
        self.identifier = identifier
        self._checked = False

    @asynccontextmanager
    async def acquire(self, timeout: float | None = None) -> AsyncIterator[Lease]:
        """Hold one lease for the block; :class:`LeaseTimeout` if not acquired in time."""
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout < 0
        ):
            raise ConfigurationError(
                f"semaphore timeout must be a number of seconds >= 0 or None, got {timeout!r}"
            )
        with trio.move_on_after(timeout if timeout is not None else float("inf")) as waited:
            await self._check_max()
            node, session_id = await self._acquire_node()
        if waited.cancelled_caught:
            log.info("semaphore.timeout", path=self.path, timeout=timeout)
            raise LeaseTimeout(f"no lease of semaphore {self.path} within {timeout:g}s")
        lease = Lease(self.path, node, session_id)
        log.debug("semaphore.acquired", path=self.path, node=basename(node))
        try:
            async with node_scope(self.session, node, session_id=session_id, error=LeaseLost):
                yield lease
        except LeaseLost as exc:
            log.warning("semaphore.lost", path=self.path, node=basename(node), reason=exc.reason)
            raise
        finally:
            await release_node(self.session, node)
            log.debug("semaphore.released", path=self.path, node=basename(node))

    async def holders(self) -> list[bytes]:
        """The identifiers of the current lease holders, oldest first (a snapshot)."""
        try:
            ordered = _contenders(await self.session.children(self.path))
        except errors.NoNodeError:
            return []
        out: list[bytes] = []
        for name in ordered[: self.max_leases]:
            try:
                data, _stat = await self.session.get(f"{self.path}/{name}")
            except errors.NoNodeError:
                continue
            out.append(data)
        return out

    async def _check_max(self) -> None:
        """Create the semaphore's node with ``max_leases`` or check that it agrees."""
        if self._checked:
            return
        wanted = str(self.max_leases).encode()
        while True:
            try:
                data, stat = await self.session.get(self.path)
            except errors.SessionExpiredError:
                continue  # a read: made again in the new session
            except errors.NoNodeError:
                try:
                    await self.session.create(self.path, wanted, makepath=True)
                except (errors.NodeExistsError, errors.ConnectionLossError,
                        errors.SessionExpiredError):
                    pass
                continue
            if not data:  # made by someone else's ensure_path: claim it
                try:
                    await self.session.set(self.path, wanted, version=stat.version)
                except (errors.BadVersionError, errors.ConnectionLossError,
                        errors.SessionExpiredError):
                    pass
                continue
            if data != wanted:
                raise ConfigurationError(
                    f"semaphore {self.path} has {data.decode(errors='replace')} leases; this "
                    f"client asked for {self.max_leases} (every client must use the same)"
                )
            self._checked = True
            return

    async def _acquire_node(self) -> tuple[str, int]:
        while True:
            guid = new_guid()
            try:
                before = await self.session.wait_connected()
                node = await create_protected(
                    self.session, self.path, PREFIX, self.identifier, guid=guid
                )
                if self.session.session_id != before:
                    raise _Vanished(node)
                await self._wait_turn(basename(node))
                return node, before
            except (_Vanished, errors.SessionExpiredError):
                await delete_guid_nodes(self.session, self.path, guid)
                continue
            except BaseException:
                await delete_guid_nodes(self.session, self.path, guid)
                raise

    async def _wait_turn(self, me: str) -> None:
        session, limit = self.session, self.max_leases
        while True:
            ordered = _contenders(await session.children(self.path))
            if me not in ordered:
                raise _Vanished(me)
            rank = ordered.index(me)
            if rank < limit:
                if rank + 1 < len(ordered):  # someone behind may watch us: tell it
                    await self._signal(me)
                return
            fired = trio.Event()
            if rank == limit:  # the first waiter: any holder's release promotes us
                if not await self._watch_all(ordered[:limit], fired):
                    continue
            else:
                try:
                    _data, stat = await session.get(
                        f"{self.path}/{ordered[rank - 1]}", watch=session.waker(fired))
                except errors.NoNodeError:
                    continue
                if stat.version > 0:  # promoted since our listing: we may be first now
                    continue
            await fired.wait()

    async def _watch_all(self, names: list[str], fired: trio.Event) -> bool:
        """Set an exists-watch on each of ``names`` (pipelined); False if one is gone."""
        session = self.session
        missing: list[str] = []

        async def watch(name: str) -> None:
            if await session.exists(f"{self.path}/{name}", watch=session.waker(fired)) is None:
                missing.append(name)

        await gather(*[functools.partial(watch, name) for name in names])
        return not missing

    async def _signal(self, me: str) -> None:
        """Write our node once so the waiter behind us (watching it) looks again."""
        while True:
            try:
                await self.session.set(f"{self.path}/{me}", self.identifier)
                return
            except errors.ConnectionLossError:
                await self.session.wait_connected()
            except errors.NoNodeError:
                raise _Vanished(me) from None
