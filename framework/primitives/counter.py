"""A shared counter: optimistic versioned updates that are never lost and never doubled.

Layout: one persistent node at the counter's path.  Its data is the value in decimal on the
first line and, on the second, the *receipts* of the last :data:`RECEIPTS` updates (a random
token each, oldest first), for instance ``b"42\\n9f3c0a1b2c3d 0d1e2f3a4b5c"``.  Below it, one
ephemeral node per session that updated it, ``receipt-<session id>``, holding the token of
that session's last applied update.

Protocol of ``add(delta)``: read the value and version (once; later updates reuse what the
previous one wrote), then, in one multi, ``set`` ``value + delta`` with a new receipt,
conditional on that version, and write the token into the session's receipt node.
``BadVersion`` (someone else updated first): read again and retry.  So concurrent increments
from any number of processes are serialised by the server and none is lost.  The updates of
one session to one counter are sent one at a time (a lock shared by its ``Counter`` objects):
they would only race each other for the same version, and one at a time the session's
receipt node names the one update that can be in doubt.

A write's outcome is unknown after ``ConnectionLoss`` (or an expiry while it was in flight):
retrying blindly could count it twice (kazoo's ``Counter`` does).  Here the update reads again
once connected:

* same session (a connection loss, such as a ZooKeeper leader change): the session's receipt
  node holds our token exactly when the multi was applied, however many updates others made
  meanwhile.  Exact, always.
* the session expired (its receipt node went with it): our token among the node's receipts
  means the write landed; its absence means it did not, provided at most :data:`RECEIPTS`
  writes happened since the version we wrote against (each left a receipt, so ours would
  still be listed).  Past that the outcome cannot be told and :class:`ConnectionLossError`
  is raised, saying so: only when the session expired with the write in flight *and* more
  than :data:`RECEIPTS` updates were made before the new session read the node.

The ring alone (the design before) could not tell after a mere connection loss either, as
soon as other clients made more than :data:`RECEIPTS` updates before the reconnection (a
leader change with busy writers): the receipt node closes that window.  This holds while
every writer of the node is a ``Counter``: a bare value written by something else clears the
receipts.  An ``add`` *cancelled* while its write is in flight may or may not have been
applied, like any write (the caller chose not to wait for the answer).

Costs: an uncontended ``add`` is one round trip (a multi of two writes in one transaction;
plus a read for the first one); each lost race adds a ``get``; settling an update in doubt is
a ``sync`` and one or two reads.  ``get()`` is one read.  One small ephemeral node per
session that updates the counter.

SUSPENDED: requests wait for the connection (nothing is sent meanwhile).  LOST: the value is
a persistent node, so nothing is lost with the session; an update in flight is settled by
its receipt in the new session.  Raises :class:`ConfigurationError` for a bad path or a
non-integer delta, :class:`ConcurrentUpdateError` when the node holds something that is not
a counter.
"""

from __future__ import annotations

import secrets
import weakref

import attrs
import trio

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


@attrs.define(eq=False)
class _Writer:
    """What one session knows of one counter: shared by its ``Counter`` objects."""

    lock: trio.Lock = attrs.field(factory=trio.Lock)
    last: CounterState | None = None  # the state its last write produced or read
    receipt_of: int | None = None  # the session id whose receipt node is known to exist


_writers: weakref.WeakKeyDictionary[Session, dict[str, _Writer]] = (
    weakref.WeakKeyDictionary()
)


def _writer_of(session: Session, path: str) -> _Writer:
    return _writers.setdefault(session, {}).setdefault(path, _Writer())


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
        self._writer = _writer_of(session, path)

    async def get(self) -> int:
        """The current value (one read; the default while the node does not exist)."""
        try:
            data, stat = await self.session.get(self.path)
        except errors.NoNodeError:
            return self.default
        state = decode(self.path, data, stat.version)
        if not self._writer.lock.locked():  # an add in progress keeps its own view
            self._writer.last = state
        return state.value

    def _receipt(self, session_id: int) -> str:
        return f"{self.path}/receipt-{session_id:016x}"

    async def add(self, delta: int) -> int:
        """Add ``delta`` (negative to subtract) exactly once; return the new value."""
        if isinstance(delta, bool) or not isinstance(delta, int):
            raise errors.ConfigurationError(f"counter delta must be an int, got {delta!r}")
        async with self._writer.lock:
            return await self._add(delta, self._writer)

    async def _add(self, delta: int, writer: _Writer) -> int:
        token = secrets.token_hex(6)
        retries = 0
        while True:
            state = writer.last if writer.last is not None else await self._read()
            value = state.value + delta
            receipts = (*state.receipts, token)[-RECEIPTS:]
            session_id = await self.session.wait_connected()
            receipt = self._receipt(session_id)
            txn = self.session.transaction()
            txn.set(self.path, encode(value, receipts), version=state.version)
            if writer.receipt_of == session_id:
                txn.set(receipt, token.encode())
            else:
                txn.create(receipt, token.encode(), ephemeral=True)
            try:
                results = await txn.commit()
            except errors.TransactionFailedError as exc:
                if exc.failed_index == 1:  # our receipt node: made already, or gone
                    writer.receipt_of = (
                        session_id if isinstance(exc.cause, errors.NodeExistsError) else None
                    )
                    continue
                writer.last = None  # BadVersion (someone updated first) or NoNode (the
                retries += 1  # counter was deleted: start again from the default)
                continue
            except (errors.ConnectionLossError, errors.SessionExpiredError):
                writer.last = None
                writer.receipt_of = None  # made or not: a create finding it tells
                if await self._landed(token, state.version, session_id):
                    log.info("counter.settled", path=self.path, applied=True)
                    return value
                log.info("counter.settled", path=self.path, applied=False)
                continue
            writer.last = CounterState(value, results[0].version, receipts)
            writer.receipt_of = session_id
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

    async def _landed(self, token: str, version: int, session_id: int) -> bool:
        """Whether the update carrying ``token``, sent in session ``session_id`` against
        ``version``, was applied (see the module); raises :class:`ConnectionLossError` when
        that cannot be told (the session expired and too many updates happened since)."""
        while True:
            await self.session.wait_connected()
            try:
                await self.session.sync(self.path)  # a lagging follower may not have it yet
                if self.session.session_id == session_id:
                    try:  # read in the session that wrote it: the receipt node is exact
                        mine: bytes | None = (await self.session.get(
                            self._receipt(session_id)))[0]
                    except errors.NoNodeError:
                        mine = None  # never made: no update of this session applied
                    if self.session.session_id == session_id:  # answered in that session
                        if mine is not None:
                            self._writer.receipt_of = session_id  # the next add sets it
                        return mine is not None and mine.decode() == token
                    continue  # it expired as we read: the receipts in the node tell
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
            f"counter {self.path}: the session expired during an update and "
            f"{stat.version - version} updates happened since; whether ours was applied "
            f"cannot be told (the node keeps {RECEIPTS} receipts)"
        )
