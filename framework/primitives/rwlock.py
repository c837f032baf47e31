"""A shared read/write lock (the seed's protocol).

Readers create ``read-<guid>-N`` and writers ``write-<guid>-N`` (ephemeral, sequential) under
the lock's path.  A reader holds the lock when no ``write-`` node sorts below its own and
watches only the closest such writer; a writer holds it when its node is the lowest of all and
watches only its immediate predecessor.  So readers share, writers are exclusive, and waiting
is FIFO with no herd effect.
"""

from __future__ import annotations

from typing import Any

from framework.primitives.lock import _LockRecipe, last_writer_below, predecessor
from framework.zk import Session


class ReadWriteLock(_LockRecipe):
    """``async with rw.read_lock():`` (shared) / ``async with rw.write_lock():`` (exclusive).

    Both yield a :class:`~framework.primitives.lock.LockHolding` and take an optional
    ``timeout`` (:class:`LockTimeout`).  SUSPENDED / LOST behave as for
    :class:`~framework.primitives.lock.Lock`: a waiter keeps waiting (re-contending in a new
    session after LOST); a holder's body is cancelled and :class:`LockLost` raised.
    """

    def __init__(self, session: Session, path: str, identifier: bytes = b"") -> None:
        super().__init__(session, path, identifier)

    def read_lock(self, timeout: float | None = None) -> Any:
        """Shared: held together with other readers, never with a writer."""
        return self._hold("read-", last_writer_below, timeout)

    def write_lock(self, timeout: float | None = None) -> Any:
        """Exclusive: held alone."""
        return self._hold("write-", predecessor, timeout)
