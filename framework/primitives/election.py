"""Leader election: sequential-ephemeral contenders, each watching only its predecessor.

Every contender creates ``{path}/c_{guid}-NNNNNNNNNN`` (ephemeral, sequential, GUID in the
name so a lost create reply is recovered instead of leaving an orphan).  The contender with the
lowest sequence number leads; every other contender watches only the node just before its own
(no herd effect: when the leader goes, exactly one waiter is woken).  Because sequence numbers
only grow, a node that is lowest stays lowest while it exists: "our node exists" is a proof of
leadership that the server itself can check.  That is what fencing uses.

The fencing token of a term is the ``czxid`` of the leader's node: later terms always carry
larger tokens, so workers can reject orders from an older leader.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import attrs
import trio

from framework import errors
from framework.logs import get_logger
from framework.zk import (
    Session,
    Transaction,
    basename,
    cleanup_scope,
    create_protected,
    delete_guid_nodes,
    gather,
    new_guid,
    sequence_of,
    single_body_error,
    validate_data,
    validate_path,
    wait_gone,
)

log = get_logger("framework.primitives.election")

PREFIX = "c_"


@attrs.frozen
class LeaderInfo:
    """A contender as observers see it: its node, the identifier it published, its token."""

    node: str
    identifier: bytes
    token: int


@attrs.frozen
class Term:
    """One leadership term.

    ``node`` is the full path of our election node, ``token`` its ``czxid`` (monotonic across
    terms), ``session_id`` the session that owns the node.  :meth:`fenced` starts a
    transaction that first checks the node, so a write made by a deposed leader (whose node is
    gone) is rejected by the server instead of corrupting state.
    """

    node: str
    token: int
    session_id: int
    version: int = 0
    session: Session = attrs.field(repr=False, eq=False, kw_only=True)

    def ensure_trusted(self) -> None:
        """Raise :class:`SessionInterrupted` unless this term's session is still provably
        alive (see :meth:`Session.ensure_trusted`): call it right before an effect outside
        ZooKeeper that only the leader may cause."""
        self.session.ensure_trusted(self.session_id)

    def fenced(self) -> Transaction:
        """A transaction pre-loaded with ``check(node, version)``; add ops, then ``commit()``.

        A failed fence shows as :class:`TransactionFailedError` with ``failed_index == 0``.
        """
        return self.session.transaction().check(self.node, self.version)

    async def commit(self, build: Callable[[Transaction], object]) -> list[Any]:
        """Run ``build(txn)`` on a fenced transaction and commit it.

        Returns the results of the caller's operations (the fence check left out).  Raises
        :class:`LeadershipLost` when the fence fails (we are no longer the leader); other
        failures raise :class:`TransactionFailedError` as usual.
        """
        txn = self.fenced()
        build(txn)
        try:
            results = await txn.commit()
        except errors.TransactionFailedError as exc:
            if is_fence_failure(exc):
                raise errors.LeadershipLost("fenced write rejected: our election node is gone") \
                    from exc
            raise
        return results[1:]


def is_fence_failure(exc: errors.TransactionFailedError) -> bool:
    """True when a fenced transaction failed on its fence (the first operation)."""
    return exc.failed_index == 0


class Election:
    """Elect one leader among the contenders under ``path``.

    ``async with election.leadership() as term:`` returns once this contender leads.  The body
    runs only while leadership can be proven; it is cancelled, and :class:`LeadershipLost` is
    raised from the ``async with`` with ``reason``:

    * ``"suspended"`` - the connection stayed SUSPENDED past the session's trust deadline
      (:meth:`Session.trusted_until`: the send time of the newest request answered through
      the leader plus 2/3 of the session timeout) or past ``suspended_grace``, if that is
      set and shorter.  The server cannot expire the session sooner than a third of the
      session timeout after that deadline, so the body is cancelled *before* any other
      contender can be elected, even when the body keeps sending requests into a partition
      or its follower is cut off from the leader.  A ZooKeeper leader change (a stall of
      about a second) is ridden through without cancelling anything.
    * ``"lost"`` - the session expired (LOST) or was closed: our node is gone.
    * ``"node deleted"`` - someone deleted our node.

    While *waiting*, a SUSPENDED connection just delays us; after an expiry (LOST) our
    contender node is recreated in the new session (we go to the back of the line).  Leaving
    the block, normally or not, deletes our node at once so the next contender takes over;
    cancelling a wait never leaks the node.  While disconnected, that delete waits for the
    connection (at most the session timeout, shielded) before the ``async with`` exits: the
    body itself is cancelled at once, only the exit is delayed.

    One ``leadership()`` at a time per ``Election`` object (make one object per contender).
    """

    def __init__(
        self,
        session: Session,
        path: str,
        identifier: bytes = b"",
        *,
        suspended_grace: float | None = None,
    ) -> None:
        validate_path(path, allow_root=False)
        self.session = session
        self.path = path
        self.identifier = validate_data(identifier)
        self.suspended_grace = (
            session.suspended_grace if suspended_grace is None else suspended_grace
        )
        if self.suspended_grace is not None and self.suspended_grace < 0:
            raise errors.ConfigurationError("suspended_grace must be >= 0")
        #: the contender node we are watching while waiting in :meth:`leadership`, else None
        self.predecessor: str | None = None
        self._in_line = trio.Event()

    async def wait_in_line(self) -> None:
        """Return once a (possibly not yet started) :meth:`leadership` has its node in place
        and either leads or has armed the watch on its predecessor (for observability and
        tests)."""
        await self._in_line.wait()

    # ------------------------------------------------------------------ contending

    @asynccontextmanager
    async def leadership(self) -> AsyncIterator[Term]:
        """Lead for the duration of the block (see the class docstring)."""
        guid = new_guid()
        holder: list[str] = []
        try:
            term = await self._campaign(guid, holder)
            self.predecessor = None
            self._in_line.set()
            log.info("election.elected", path=self.path, node=term.node, token=term.token)
            reason: list[str] = []
            with single_body_error():
                async with trio.open_nursery() as nursery:
                    scope = nursery.cancel_scope
                    try:
                        with self.session.trusting(scope, term.session_id,
                                                   self.suspended_grace) as trust:
                            nursery.start_soon(self._cancel_when_untrusted, term, reason, scope)
                            nursery.start_soon(self._cancel_when_deleted, term, reason, scope)
                            yield term
                    finally:
                        scope.cancel()  # after the trust is settled (see Trust)
            if not reason and trust.expired:
                reason.append(self.session.expired_reason(term.session_id))
            if reason:
                log.warning("election.lost", path=self.path, node=term.node, reason=reason[0])
                raise errors.LeadershipLost(reason[0])
            log.info("election.resigned", path=self.path, node=term.node)
        finally:
            self.predecessor = None
            self._in_line = trio.Event()  # the next leadership() will set it again
            await self._withdraw(guid, holder[-1] if holder else None)

    async def _campaign(self, guid: str, holder: list[str]) -> Term:
        """Create our node (again after an expiry) and wait until it is the lowest."""
        session = self.session
        while True:
            try:
                node = await create_protected(
                    session, self.path, PREFIX, self.identifier, guid=guid
                )
            except errors.SessionExpiredError:
                continue
            holder.append(node)
            try:
                # read the token now, so that taking over later costs no extra round trip
                stat = await session.exists(node)
                if stat is not None:
                    term = Term(node, stat.czxid, stat.ephemeralOwner, stat.version,
                                session=session)
                    if await self._wait_until_first(term):
                        return term
            except (errors.SessionExpiredError, errors.NoNodeError):
                pass
            log.info("election.requeued", path=self.path, node=node)

    async def _wait_until_first(self, term: Term) -> bool:
        """Watch predecessors until our node leads; ``False`` if it vanished (expiry).

        Our node is in a listing only while our session lives, so being first in one proves
        leadership at that moment; the watchdog of :meth:`leadership` takes it from there.
        """
        session = self.session
        node, name = term.node, basename(term.node)
        while True:
            line = contenders_of(await session.children(self.path))
            if name not in line:
                return False
            index = line.index(name)
            if index == 0:
                return True
            predecessor = f"{self.path}/{line[index - 1]}"
            fired = trio.Event()
            try:
                # get (not exists): a missing node sets no watch, so nothing is left behind
                await session.get(predecessor, watch=session.waker(fired))
            except errors.NoNodeError:
                continue
            if self.predecessor != predecessor:
                log.info("election.waiting", path=self.path, node=node, predecessor=predecessor)
            self.predecessor = predecessor
            self._in_line.set()
            await fired.wait()

    async def _cancel_when_untrusted(
        self, term: Term, reason: list[str], scope: trio.CancelScope
    ) -> None:
        reason.append(await self.session.wait_untrusted(
            term.session_id, self.suspended_grace, scope=scope))
        scope.cancel()

    async def _cancel_when_deleted(
        self, term: Term, reason: list[str], scope: trio.CancelScope
    ) -> None:
        await wait_gone(self.session, term.node)
        reason.append("lost" if self.session.session_id != term.session_id else "node deleted")
        scope.cancel()

    async def _withdraw(self, guid: str, node: str | None) -> None:
        """Delete our contender node now (shielded, bounded by the session timeout)."""
        session = self.session
        with cleanup_scope(session):
            if node is not None:
                try:
                    await session.delete(node, missing_ok=True)
                    return
                except (errors.ConnectionLossError, errors.SessionExpiredError):
                    pass
                except errors.NotConnectedError:
                    return
            await delete_guid_nodes(session, self.path, guid)

    # ------------------------------------------------------------------ observing

    async def leader(self) -> LeaderInfo | None:
        """The current leader, or ``None`` when nobody contends."""
        while True:
            try:
                line = contenders_of(await self.session.children(self.path))
            except errors.NoNodeError:
                return None
            if not line:
                return None
            try:
                data, stat = await self.session.get(f"{self.path}/{line[0]}")
            except errors.NoNodeError:
                continue
            return LeaderInfo(f"{self.path}/{line[0]}", data, stat.czxid)

    async def contenders(self) -> list[LeaderInfo]:
        """Every contender in line order (the leader first)."""
        try:
            line = contenders_of(await self.session.children(self.path))
        except errors.NoNodeError:
            return []
        found: dict[str, LeaderInfo] = {}

        async def fetch(name: str) -> None:
            try:
                data, stat = await self.session.get(f"{self.path}/{name}")
            except errors.NoNodeError:
                return
            found[name] = LeaderInfo(f"{self.path}/{name}", data, stat.czxid)

        await gather(*[functools.partial(fetch, name) for name in line])
        return [found[name] for name in line if name in found]

    async def watch_leaders(self) -> AsyncIterator[LeaderInfo | None]:
        """Yield the current leader (``None``: nobody), then every change of leader.

        Watches only the leader's node while there is one (the leader changes only when that
        node goes), and the children list while there is none.  A burst of changes collapses
        into the latest leader.
        """
        last: object = object()
        while True:
            try:
                info, fired = await self._observe()
            except (errors.ConnectionLossError, errors.SessionExpiredError):
                await self.session.wait_connected()
                continue
            key = None if info is None else info.token
            if key != last:
                last = key
                yield info
            await fired.wait()

    async def _observe(self) -> tuple[LeaderInfo | None, trio.Event]:
        session = self.session
        while True:
            fired = trio.Event()
            wake = session.waker(fired)
            try:
                line = contenders_of(await session.children(self.path))
                if not line:
                    line = contenders_of(await session.children(self.path, watch=wake))
                    if not line:
                        return None, fired
                    continue
                first = f"{self.path}/{line[0]}"
                data, stat = await session.get(first, watch=wake)
                return LeaderInfo(first, data, stat.czxid), fired
            except errors.NoNodeError:
                if await session.exists(self.path, watch=wake) is None:
                    return None, fired


def contenders_of(names: list[str] | tuple[str, ...]) -> list[str]:
    """Contender node names among ``names``, in line order (others are ignored)."""
    line = [n for n in names if n.startswith(PREFIX) and n[-10:].isdigit()]
    line.sort(key=sequence_of)
    return line
