"""A shared counter: optimistic versioned updates that are never lost and never doubled.

Layout: one persistent node at the counter's path.  Its data is the value in decimal on the
first line and, on the second, the *receipts* of the last :data:`RECEIPTS` updates (a random
token each, oldest first), for instance ``b"42\\n9f3c0a1b2c3d 0d1e2f3a4b5c"``.

Protocol of ``add(delta)``: read the value and version (once; later updates reuse what the
previous one wrote), then ``set`` ``value + delta`` with a new receipt, conditional on that
version.  ``BadVersion`` (someone else updated first): read again and retry.  So concurrent
increments from any number of processes are serialised by the server and none is lost.

A write's outcome is unknown after ``ConnectionLoss`` (or an expiry while it was in flight):
retrying blindly could count it twice (kazoo's ``Counter`` does).  Here the update reads the
node again once connected: our receipt in it means the write landed; its absence means it
did not, provided at most :data:`RECEIPTS` writes happened since the version we wrote
against (every one of them left a receipt, so ours would still be listed).  Past that the
outcome cannot be told and :class:`ConnectionLossError` is raised, saying so.  This holds
while every writer of the node is a ``Counter``: a bare value written by something else
clears the receipts.  An ``add`` *cancelled* while its write is in flight may or may not
have been applied, like any write (the caller chose not to wait for the answer).

Costs: an uncontended ``add`` is one round trip (a conditional ``set``; two for the first
one, which reads); each lost race adds a ``get``.  ``get()`` is one read.

SUSPENDED: requests wait for the connection (nothing is sent meanwhile).  LOST: the counter
is a persistent node, so nothing is lost with the session; an update in flight is settled by
its receipt in the new session.  Raises :class:`ConfigurationError` for a bad path or a
non-integer delta, :class:`ConcurrentUpdateError` when the node holds something that is not
a counter.
"""

from __future__ import annotations

import secrets

import attrs

from framework import errors
from framework.logs import get_logger
from framework.zk import Session, validate_path

log = get_logger("framework.primitives.counter")

#: How many updates' receipts the node keeps (13 bytes each).
RECEIPTS = 128


@attrs.frozen
class CounterState:
    """The counter's value, its node's version and the receipts of the last updates."""

    value: int
    version: int
    receipts: tuple[str, ...]


def encode(value: int, receipts: tuple[str, ...]) -> bytes:
    return f"{value}\n{' '.join(receipts[-RECEIPTS:])}".encode()


def decode(path: str, data: bytes, version: int) -> CounterState:
    """The state in ``data`` (a bare decimal, as another library writes it, is accepted)."""
    text = data.decode(errors="replace")
    first, _, rest = text.partition("\n")
    try:
        value = int(first.strip() or "0")
    except ValueError:
        raise errors.ConcurrentUpdateError(
            f"{path} does not hold a counter (its data starts {first[:40]!r})"
        ) from None
    return CounterState(value, version, tuple(rest.split()))


class Counter:
    """An integer shared by every client of the path (``default`` until first updated).

    ``await counter.add(5)`` returns the value this update produced; ``await counter.get()``
    the current one.  Guarantees, contract per connection state and costs: see the module.
    """

    def __init__(self, session: Session, path: str, default: int = 0) -> None:
        validate_path(path, allow_root=False)
        if isinstance(default, bool) or not isinstance(default, int):
            raise errors.ConfigurationError(f"counter default must be an int, got {default!r}")
        self.session = session
        self.path = path
        self.default = default
        self._last: CounterState | None = None

    async def get(self) -> int:
        """The current value (one read; the default while the node does not exist)."""
        try:
            data, stat = await self.session.get(self.path)
        except errors.NoNodeError:
            return self.default
        self._last = decode(self.path, data, stat.version)
        return self._last.value

    async def add(self, delta: int) -> int:
        """Add ``delta`` (negative to subtract) exactly once; return the new value."""
        if isinstance(delta, bool) or not isinstance(delta, int):
            raise errors.ConfigurationError(f"counter delta must be an int, got {delta!r}")
        token = secrets.token_hex(6)
        retries = 0
        while True:
            state = self._last if self._last is not None else await self._read()
            value = state.value + delta
            receipts = (*state.receipts, token)[-RECEIPTS:]
            try:
                stat = await self.session.set(
                    self.path, encode(value, receipts), version=state.version
                )
            except errors.BadVersionError:
                self._last = None
                retries += 1
                continue
            except errors.NoNodeError:  # deleted meanwhile: start again from the default
                self._last = None
                continue
            except (errors.ConnectionLossError, errors.SessionExpiredError):
                self._last = None
                if await self._landed(token, state.version):
                    log.info("counter.settled", path=self.path, applied=True)
                    return value
                log.info("counter.settled", path=self.path, applied=False)
                continue
            self._last = CounterState(value, stat.version, receipts)
            if retries:
                log.debug("counter.contended", path=self.path, retries=retries)
            return value

    async def _read(self) -> CounterState:
        """Read the state, creating the node with the default value when missing.  The node
        is persistent, so a read cut by an expiry is simply made again in the new session."""
        while True:
            try:
                data, stat = await self.session.get(self.path)
                return decode(self.path, data, stat.version)
            except errors.NoNodeError:
                pass
            except errors.SessionExpiredError:
                await self.session.wait_connected()
                continue
            try:
                await self.session.create(self.path, encode(self.default, ()), makepath=True)
            except errors.NodeExistsError:
                pass
            except (errors.ConnectionLossError, errors.SessionExpiredError):
                await self.session.wait_connected()  # created or not: read again

    async def _landed(self, token: str, version: int) -> bool:
        """Whether the update carrying ``token``, written against ``version``, was applied
        (see the module); raises :class:`ConnectionLossError` when that cannot be told."""
        while True:
            await self.session.wait_connected()
            try:
                await self.session.sync(self.path)  # a lagging follower may not have it yet
                data, stat = await self.session.get(self.path)
                break
            except errors.NoNodeError:
                return False
            except errors.SessionExpiredError:
                continue  # reading is safe to repeat in the new session
        state = decode(self.path, data, stat.version)
        if token in state.receipts:
            return True
        if stat.version - version <= RECEIPTS:
            return False
        raise errors.ConnectionLossError(
            f"counter {self.path}: the connection dropped during an update and "
            f"{stat.version - version} updates happened since; whether ours was applied "
            f"cannot be told (the node keeps {RECEIPTS} receipts)"
        )
