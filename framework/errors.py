"""Typed errors raised by the framework.

Every error a user can cause or observe is a :class:`FrameworkError`, so a CLI can catch that
one class and print a clear message instead of a stack trace.  Errors that come from the
ZooKeeper server keep the kazoo exception they were made from as ``__cause__``.
"""

from __future__ import annotations

from typing import Any


class FrameworkError(Exception):
    """Base class of every error this package raises on purpose."""


class ConfigurationError(FrameworkError):
    """Bad user input: a path, a size, a setting or a class name that cannot work."""


class InvalidPathError(ConfigurationError, ValueError):
    """A znode path that ZooKeeper would reject (relative, trailing slash, ``..`` ...)."""


class DataTooLargeError(ConfigurationError, ValueError):
    """Node data larger than ZooKeeper accepts in one packet."""


class ZooKeeperError(FrameworkError):
    """An operation failed on the ZooKeeper server or on the way to it."""


class NoNodeError(ZooKeeperError):
    """The node (or, for a create, its parent) does not exist."""


class NodeExistsError(ZooKeeperError):
    """A create found the node already there."""


class BadVersionError(ZooKeeperError):
    """A conditional set/delete/check saw another version: someone else wrote first."""


class NotEmptyError(ZooKeeperError):
    """A delete found children under the node."""


class NoChildrenForEphemeralsError(ZooKeeperError):
    """Ephemeral nodes cannot have children."""


class NoAuthError(ZooKeeperError):
    """The node's ACL does not give this client the permission the operation needs."""


class ConnectionLossError(ZooKeeperError):
    """The connection dropped while a request was in flight.

    The outcome of a *write* is unknown: it may or may not have been applied.  Reads may be
    retried.  The session itself may still be alive.
    """


class SessionExpiredError(ZooKeeperError):
    """The server expired the session: every ephemeral node and watch of it is gone."""


class NotConnectedError(ZooKeeperError):
    """The session is not connected (closed, or never started)."""


class TransactionFailedError(ZooKeeperError):
    """A multi-op transaction was rejected; nothing in it was applied.

    ``results`` holds one entry per operation: the result of an operation that would have
    succeeded, or the error of the one that failed (the others carry ``RolledBackError``).
    ``failed_index`` is the position of the first real failure and ``cause`` its error.
    """

    def __init__(self, results: list[Any]):
        self.results = results
        self.failed_index = next(
            (i for i, r in enumerate(results)
             if isinstance(r, ZooKeeperError) and not isinstance(r, RolledBackError)),
            -1,
        )
        self.cause = results[self.failed_index] if self.failed_index >= 0 else None
        super().__init__(
            f"transaction failed at operation {self.failed_index}: {self.cause!r}"
        )


class RolledBackError(ZooKeeperError):
    """An operation in a failed transaction that was rolled back because another failed."""


class SessionInterrupted(FrameworkError):
    """A guarded block was cancelled because the session could no longer be trusted.

    ``reason`` is ``"suspended"`` (connection lost longer than the allowed grace) or
    ``"lost"`` (session expired or closed).
    """

    def __init__(self, reason: str):
        self.reason = reason
        super().__init__(f"ZooKeeper session {reason}; guarded work was cancelled")


class OwnershipLost(FrameworkError):
    """An ownership scope (a leadership term, a lock holding, a queue claim) ended because
    it could no longer be proven; its body was cancelled before this was raised.  ``reason``
    says why (``"node deleted"``, ``"suspended"``, ``"lost"``...)."""

    kind = "ownership"

    def __init__(self, reason: str):
        self.reason = reason
        super().__init__(f"{self.kind} lost: {reason}")


class LeadershipLost(OwnershipLost):
    """A leadership term ended (or a fenced write was refused: we are no longer leader)."""

    kind = "leadership"


class ConcurrentUpdateError(ZooKeeperError):
    """Another writer changed the same recipe state meanwhile (e.g. two configuration
    writers at once); nothing of ours was committed past the point of conflict."""


class LockLost(OwnershipLost):
    """A lock holding ended because the lock could no longer be proven: its node was deleted,
    the session was SUSPENDED past its trust deadline or LOST.  The body of the ``async
    with`` was cancelled before this was raised."""

    kind = "lock"


class LockRevoked(LockLost):
    """Another client asked the holder of a revocable lock to give it up."""


class LockTimeout(FrameworkError, TimeoutError):
    """A lock was not acquired within the given timeout (no contender node is left behind)."""


class ClaimLost(OwnershipLost):
    """A work-queue item's claim could no longer be proven (claim node gone, session SUSPENDED
    or LOST, or the item was handed to another consumer); the item will be delivered again."""

    kind = "queue claim"


class PermanentFailure(FrameworkError):
    """Raise it from a ``WorkQueue.take()`` block (or a worker's ``handle``) when retrying
    cannot help: the item is dead-lettered at once instead of being delivered again, and a
    worker records the task as failed for good with this message."""


class TwoPhaseTimeout(FrameworkError, TimeoutError):
    """A two-phase commit site waited longer than its timeout for the transaction to
    appear."""


class UnsupportedByServerError(ZooKeeperError):
    """The ZooKeeper server does not offer what the request needs (TTL nodes on a server
    without ``extendedTypesEnabled=true``, a feature of a newer release); the message says
    what to enable."""


class LeaseLost(OwnershipLost):
    """A semaphore lease ended because it could no longer be proven (its node was deleted,
    the session was SUSPENDED past its trust deadline or LOST); the body was cancelled."""

    kind = "semaphore lease"


class LeaseTimeout(FrameworkError, TimeoutError):
    """A semaphore lease was not acquired within the given timeout (no node is left)."""
