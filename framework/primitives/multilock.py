"""Several exclusive locks held as one: all of them, or none.

Layout: none of its own; each path is an ordinary :class:`~framework.primitives.lock.Lock`
(so a ``MultiLock`` over ``/a`` and ``/b`` excludes a plain ``Lock`` on ``/a``).

Protocol: the locks are acquired one after another in sorted path order, whatever order the
caller gave: two multi-locks over overlapping paths then wait for each other in the same
order and can never deadlock (Curator's ``InterProcessMultiLock`` takes the caller's order).
A failure or timeout on any lock releases those already held, in reverse order, before the
error leaves ``acquire``; the timeout covers the whole acquisition.

The holding is one scope: the body is cancelled, and :class:`LockLost` raised, as soon as
*any* of the locks can no longer be proven (its node deleted, the session SUSPENDED past its
trust deadline or LOST: the locks share the session, so a session fault ends them all).
SUSPENDED while acquiring: the waits resume after reconnection.  LOST while acquiring:
the lock being waited for is contended again in the new session, but a lock already held
is gone with the old one, so the holding raises :class:`LockLost` at once.

Costs: the sum of its locks' (a create and a list each when free, a delete each on release).
"""

from __future__ import annotations

from contextlib import AsyncExitStack, asynccontextmanager
from typing import AsyncIterator, Iterable

import attrs
import trio

from framework.errors import ConfigurationError, LockTimeout
from framework.logs import get_logger
from framework.primitives.lock import Lock, LockHolding
from framework.zk import Session, Transaction, validate_path

log = get_logger("framework.primitives.multilock")


@attrs.frozen(eq=False)
class MultiLockHolding:
    """Proof of holding every lock of a :class:`MultiLock` (sorted by path)."""

    holdings: tuple[LockHolding, ...]

    @property
    def tokens(self) -> dict[str, int]:
        """Each lock's fencing token (the sequence number of its holder node), by path."""
        return {h.lock_path: h.token for h in self.holdings}

    def fence(self, txn: Transaction) -> Transaction:
        """Add a check of every lock node to ``txn``: applied only while all are held."""
        for holding in self.holdings:
            holding.fence(txn)
        return txn


class MultiLock:
    """Exclusive locks on ``paths`` taken together (duplicates are one lock).  Contract and
    costs: see the module.  ``async with multilock.acquire(timeout=5) as holding:``."""

    def __init__(self, session: Session, paths: Iterable[str], identifier: bytes = b"") -> None:
        if isinstance(paths, str):
            raise ConfigurationError("MultiLock takes a list of paths, not one path string")
        unique = sorted(set(paths))
        if not unique:
            raise ConfigurationError("MultiLock needs at least one path")
        for path in unique:
            validate_path(path, allow_root=False)
        self.session = session
        self.paths = tuple(unique)
        self.identifier = identifier

    @asynccontextmanager
    async def acquire(self, timeout: float | None = None) -> AsyncIterator[MultiLockHolding]:
        """Hold every lock for the block; :class:`LockTimeout` if not all in time."""
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout < 0
        ):
            raise ConfigurationError(
                f"lock timeout must be a number of seconds >= 0 or None, got {timeout!r}"
            )
        deadline = trio.current_time() + (timeout if timeout is not None else float("inf"))
        async with AsyncExitStack() as stack:
            holdings = []
            for path in self.paths:
                left = max(0.0, deadline - trio.current_time())
                try:
                    holding = await stack.enter_async_context(
                        Lock(self.session, path, self.identifier).acquire(
                            None if timeout is None else left)
                    )
                except LockTimeout:
                    log.info("multilock.timeout", paths=list(self.paths), waiting_for=path,
                             timeout=timeout)
                    raise LockTimeout(
                        f"locks {', '.join(self.paths)} not all acquired within {timeout:g}s "
                        f"(waiting for {path})"
                    ) from None
                holdings.append(holding)
            log.debug("multilock.acquired", paths=list(self.paths))
            yield MultiLockHolding(tuple(holdings))
