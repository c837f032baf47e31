"""Locks: exclusive, revocable, and the contender engine shared with the read/write lock.

The seed recipe: every contender creates an ephemeral sequential node under the lock's path,
with a GUID in its name (a lost create reply is recovered, never duplicated).  A contender
holds the lock when no node it must wait for sorts below its own; otherwise it watches
*only* the one node that blocks it (its predecessor), so a release wakes one client, not the
herd.  Contender nodes never leak: a cancelled, timed-out or failed acquire deletes its node
(shielded) before the error leaves ``acquire``.

A holding is a scope (:func:`framework.primitives.holding.node_scope`): the body is
cancelled, and :class:`LockLost` raised, as soon as the lock can no longer be proven.  Writes
that must never come from a deposed holder go through :meth:`LockHolding.fence`, which adds a
``check`` of the holder's node to a transaction, so the server rejects them.
"""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Callable

import attrs
import trio

from framework import errors
from framework.errors import ConfigurationError, LockLost, LockRevoked, LockTimeout
from framework.logs import get_logger
from framework.primitives.holding import DataCheck, node_scope
from framework.zk import (
    Session,
    Transaction,
    basename,
    cleanup_scope,
    create_protected,
    delete_guid_nodes,
    new_guid,
    sequence_of,
    validate_path,
)

log = get_logger("framework.primitives.lock")

#: Data written into a holder's node to ask it to give up a revocable lock.
UNLOCK = b"unlock"

#: Given the sorted contender names and our own, the name we must wait for (or ``None``).
Blocker = Callable[[list[str], str], "str | None"]


@attrs.frozen(eq=False)
class LockHolding:
    """Proof of holding a lock, valid only inside the ``async with`` that produced it.

    ``token`` is the sequence number of the holder's node: it grows with every holder, so a
    resource can reject writes carrying an older token (a fencing token).
    """

    lock_path: str
    node: str
    session_id: int
    token: int
    revoke_requested: trio.Event = attrs.field(factory=trio.Event)

    def fence(self, txn: Transaction) -> Transaction:
        """Add a check of our lock node to ``txn``: the server applies the transaction only
        while this holder's node still exists."""
        return txn.check(self.node, -1)


def _contenders(names: list[str]) -> list[str]:
    """Sequential contender names (``lock-``, ``read-``, ``write-``), lowest first."""
    out = []
    for name in names:
        if name.startswith(("lock-", "read-", "write-")) and name[-10:].isdigit():
            out.append(name)
    return sorted(out, key=sequence_of)


def predecessor(ordered: list[str], me: str) -> str | None:
    """Exclusive (and write) rule: wait for the node just below ours."""
    index = ordered.index(me)
    return ordered[index - 1] if index > 0 else None


def last_writer_below(ordered: list[str], me: str) -> str | None:
    """Read rule: wait for the closest ``write-`` node below ours."""
    index = ordered.index(me)
    for name in reversed(ordered[:index]):
        if name.startswith("write-"):
            return name
    return None


class _Vanished(Exception):
    """Our contender node disappeared while we waited (deleted, or the session expired)."""


async def _wait_turn(session: Session, path: str, me: str, blocker: Blocker) -> None:
    """Wait until nothing blocks ``me``.

    As in the seed, the children are read *without* a watch (a watch on the parent would
    notify every waiter of every change: the herd effect); each waiter watches only the one
    node that blocks it."""
    while True:
        ordered = _contenders(await session.children(path))
        if me not in ordered:
            raise _Vanished(me)
        wait_for = blocker(ordered, me)
        if wait_for is None:
            return
        fired = trio.Event()
        if await session.exists(f"{path}/{wait_for}", watch=session.waker(fired)) is None:
            continue
        await fired.wait()


async def acquire_node(
    session: Session, path: str, prefix: str, data: bytes, blocker: Blocker
) -> tuple[str, int]:
    """Create our contender node and wait for our turn; return ``(node path, session id)``.

    A session that expires while we wait is survived: the (vanished) node is re-created in the
    new session.  On any error or cancellation our node is deleted before re-raising.
    """
    while True:
        guid = new_guid()
        try:
            before = await session.wait_connected()
            node = await create_protected(session, path, prefix, data, guid=guid)
            if session.session_id != before:
                raise _Vanished(node)
            await _wait_turn(session, path, basename(node), blocker)
            return node, before
        except (_Vanished, errors.SessionExpiredError):
            await delete_guid_nodes(session, path, guid)
            continue
        except BaseException:
            await delete_guid_nodes(session, path, guid)
            raise


async def release_node(session: Session, node: str) -> None:
    """Delete our node; shielded, and bounded by the session timeout (by then the node is
    deleted or the session that owned it has usually expired; if it has not, the node is
    deleted when the connection is back: :meth:`Session.delete_later`)."""
    with cleanup_scope(session) as scope:
        while True:
            try:
                await session.delete(node, missing_ok=True)
                return
            except errors.ConnectionLossError:
                continue
            except (errors.SessionExpiredError, errors.NotConnectedError):
                return
    if scope.cancelled_caught:
        session.delete_later(node)


def _lost(reason: str) -> BaseException:
    return LockLost(reason)


class _LockRecipe:
    """What every lock flavour shares: acquire with timeout, hold as a scope, release."""

    def __init__(self, session: Session, path: str, identifier: bytes = b"") -> None:
        validate_path(path, allow_root=False)
        self.session = session
        self.path = path
        self.identifier = identifier

    @asynccontextmanager
    async def _hold(
        self,
        prefix: str,
        blocker: Blocker,
        timeout: float | None,
        *,
        on_data: Callable[[LockHolding], DataCheck] | None = None,
        error: Callable[[str], BaseException] = _lost,
    ) -> AsyncIterator[LockHolding]:
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout < 0
        ):
            raise ConfigurationError(
                f"lock timeout must be a number of seconds >= 0 or None, got {timeout!r}"
            )
        with trio.move_on_after(timeout if timeout is not None else float("inf")) as waited:
            node, session_id = await acquire_node(
                self.session, self.path, prefix, self.identifier, blocker
            )
        if waited.cancelled_caught:
            log.info("lock.timeout", path=self.path, timeout=timeout)
            raise LockTimeout(f"lock {self.path} not acquired within {timeout:g}s")
        holding = LockHolding(self.path, node, session_id, sequence_of(node))
        log.debug("lock.acquired", path=self.path, node=basename(node))
        try:
            async with node_scope(
                self.session, node, session_id=session_id, error=error,
                on_data=on_data(holding) if on_data else None,
            ):
                yield holding
        except LockLost as exc:
            log.warning("lock.lost", path=self.path, node=basename(node), reason=exc.reason)
            raise
        finally:
            await release_node(self.session, node)
            log.debug("lock.released", path=self.path, node=basename(node))


class Lock(_LockRecipe):
    """An exclusive lock at ``path`` (the recipe owns that path's children).

    ``async with lock.acquire(timeout=5) as holding:`` - at most one holder at a time, in any
    number of processes.  Raises :class:`LockTimeout` if not acquired in time (our contender
    node is removed first).  ``async with lock:`` is a shorthand without timeout.

    SUSPENDED: while waiting, the wait continues after reconnection; while holding, the body
    is cancelled after the session's ``suspended_grace`` and :class:`LockLost` is raised (the
    server may already have given the lock to someone else).  LOST: a waiter re-contends in
    the new session; a holder's body is cancelled and :class:`LockLost` raised.  Deleting the
    holder's node (by anyone) also ends the holding.
    """

    _prefix = "lock-"

    def __init__(self, session: Session, path: str, identifier: bytes = b"") -> None:
        super().__init__(session, path, identifier)
        # ``async with lock:`` holdings, per task: tasks sharing this object never
        # release each other's holding.
        self._held: dict[trio.lowlevel.Task, list[Any]] = {}

    def acquire(self, timeout: float | None = None) -> Any:
        """An async context manager yielding a :class:`LockHolding`."""
        return self._hold(self._prefix, predecessor, timeout)

    async def __aenter__(self) -> LockHolding:
        manager = self.acquire()
        holding: LockHolding = await manager.__aenter__()
        self._held.setdefault(trio.lowlevel.current_task(), []).append(manager)
        return holding

    async def __aexit__(self, *exc_info: Any) -> bool | None:
        task = trio.lowlevel.current_task()
        stack = self._held[task]
        manager = stack.pop()
        if not stack:
            del self._held[task]
        suppress: bool | None = await manager.__aexit__(*exc_info)
        return suppress


class RevocableLock(Lock):
    """An exclusive lock whose holder gives it up when asked (seed: revocable locks).

    Anyone may call :meth:`revoke` (or :func:`request_revoke`): it writes ``unlock`` into the
    current holder's node.  The holder watches its node's data; by default its body is then
    cancelled, the lock released and :class:`LockRevoked` raised.  With ``cooperative=True``
    the holder is only notified: ``holding.revoke_requested`` is set and the body should
    finish soon (it keeps the lock until it leaves the block).  A contender whose node was
    marked before it got the lock is revoked as soon as it gets it.

    SUSPENDED / LOST: as for :class:`Lock`.
    """

    def __init__(
        self, session: Session, path: str, identifier: bytes = b"", *, cooperative: bool = False
    ) -> None:
        super().__init__(session, path, identifier)
        self.cooperative = cooperative

    def acquire(self, timeout: float | None = None) -> Any:
        return self._hold(
            self._prefix, predecessor, timeout, on_data=self._check_data, error=_revoked_or_lost
        )

    def _check_data(self, holding: LockHolding) -> DataCheck:
        def check(data: bytes) -> str | None:
            if data != UNLOCK:
                return None
            log.info("lock.revoke_requested", path=self.path, node=basename(holding.node))
            if self.cooperative:
                holding.revoke_requested.set()
                return None
            return "revoked"

        return check

    async def revoke(self) -> str | None:
        """Ask the current holder to release; return its node name (``None``: no holder)."""
        return await request_revoke(self.session, self.path)


def _revoked_or_lost(reason: str) -> BaseException:
    return LockRevoked(reason) if reason == "revoked" else LockLost(reason)


async def request_revoke(session: Session, path: str) -> str | None:
    """Write ``unlock`` into the node of the current holder of the lock at ``path``.

    Returns the holder's node name, or ``None`` when nobody holds the lock (or the holder
    released it meanwhile: a later holder is not revoked by this call).
    """
    try:
        ordered = _contenders(await session.children(path))
    except errors.NoNodeError:
        return None
    if not ordered:
        return None
    holder = ordered[0]
    try:
        await session.set(f"{path}/{holder}", UNLOCK)
    except errors.NoNodeError:
        return None
    log.info("lock.revoke_sent", path=path, node=holder)
    return holder
