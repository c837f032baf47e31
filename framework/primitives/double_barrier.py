"""A double barrier (seed recipe): ``count`` participants enter together and leave together.

Layout under the barrier's path::

    p-<name>-<guid>-NNNNNNNNNN   one ephemeral sequential node per participant
    ready                        persistent; between rounds empty, during one a :class:`Go`
                                 record: the names of that round's members

Guarantees:

* A round's bodies start once ``count`` participants have registered, and every member of
  the round starts, even one that looks after others have already left.  ``ready`` never
  counts as a participant.
* A participant arriving after "go" is not a member of that round: it waits for the next, so
  one path serves round after round.  A stale writer can never clear a newer round's marker.
* Leaving is the seed's, herd-free: the lowest member watches the highest, every other member
  deletes its node and watches the lowest, and the lowest leaves last, ending the round.
* A crashed member's node vanishes with its session and the others carry on without it;
  until its session expires it still counts towards ``count`` (nobody can tell it from a
  slow one before).

Why "go" names the members, why ``ready`` is never deleted, and the watches it costs:
``docs/architecture.md`` ("The double barrier").
"""

from __future__ import annotations

import os
import re
import socket
from contextlib import asynccontextmanager
from typing import AsyncIterator

import attrs
import trio

from framework import errors, records
from framework.errors import ConfigurationError
from framework.logs import get_logger
from framework.primitives.lock import release_node
from framework.zk import (
    Session,
    basename,
    cleanup_scope,
    create_protected,
    delete_guid_nodes,
    new_guid,
    sequence_of,
    validate_name,
    validate_path,
)

log = get_logger("framework.primitives.double_barrier")

READY = "ready"
_PREFIX = "p-"


@attrs.frozen
class Go:
    """The record in ``ready`` while a round runs: its members' node names."""

    members: tuple[str, ...]


@attrs.frozen
class _Round:
    """The content of ``ready``: this round's members (empty: no round) at ``version``."""

    members: frozenset[str]
    version: int


def _round_of(data: bytes, version: int) -> _Round:
    members = records.decode(data, Go).members if data else ()
    return _Round(frozenset(members), version)


def _participants(names: list[str]) -> list[str]:
    """Participant nodes (never ``ready``), lowest sequence first."""
    kids = [n for n in names if n.startswith(_PREFIX) and n[-10:].isdigit()]
    return sorted(kids, key=sequence_of)


def _default_name() -> str:
    return re.sub(r"[^A-Za-z0-9_.]", "_", f"{socket.gethostname()}.{os.getpid()}")


class DoubleBarrier:
    """``async with DoubleBarrier(session, path, count).enter():`` runs the body once
    ``count`` participants (in any processes) have entered, and returns from the block once
    every member of the round has left.

    If the body raises (or is cancelled) the participant leaves at once without waiting for
    the others (its node is deleted, so it does not hold them up).  A bad path, name or
    ``count`` raises :class:`ConfigurationError`.

    SUSPENDED: waiting continues after reconnection (our node lives as long as the session).
    LOST: our ephemeral node is gone; while entering we register again in the new session;
    inside the body or while leaving, the others count us as having left.
    """

    def __init__(
        self, session: Session, path: str, count: int, name: str | None = None
    ) -> None:
        validate_path(path, allow_root=False)
        if not isinstance(count, int) or count < 1:
            raise ConfigurationError(f"a double barrier needs count >= 1, got {count!r}")
        name = _default_name() if name is None else name
        validate_name("participant name", name, dashes=False)
        self.session = session
        self.path = path
        self.count = count
        self.name = name
        self._ready = f"{path}/{READY}"

    @asynccontextmanager
    async def enter(self) -> AsyncIterator[None]:
        me, round_ = await self._enter()
        left = False
        try:
            yield
            await self._leave(me, round_)
            left = True
        finally:
            if not left:
                await self._abandon(me, round_)

    # ------------------------------------------------------------------ enter

    async def _register(self, guid: str) -> str:
        """Create our participant node; a session lost meanwhile is survived by creating it
        in the new session (the GUID finds a node whose create reply was lost)."""
        while True:
            try:
                node = await create_protected(
                    self.session, self.path, f"{_PREFIX}{self.name}-", guid=guid
                )
                return basename(node)
            except errors.SessionExpiredError:
                await self.session.wait_connected()

    async def _enter(self) -> tuple[str, _Round]:
        session = self.session
        guid = new_guid()
        try:
            me = await self._register(guid)
            while True:
                fired = trio.Event()
                try:
                    # Read without a watch: a member that finds itself in "go" enters with no
                    # watch left armed on ``ready`` (it would fire uselessly when the round
                    # is cleared).  The watch is armed only right before waiting.
                    round_ = await self._read_ready()
                    if me in round_.members:
                        log.debug("double_barrier.entered", path=self.path, node=me)
                        return me, round_
                    kids = _participants(await session.children(self.path))
                    if me not in kids:  # our node vanished (expired session): register again
                        await delete_guid_nodes(session, self.path, guid)
                        guid = new_guid()
                        me = await self._register(guid)
                        continue
                    if round_.members:
                        # A previous round is still leaving (or its last member crashed).
                        # Waiting here watches the children: every node the leaving round
                        # deletes wakes the next round's early arrivals (a small herd, only
                        # while rounds overlap on one path).
                        if not round_.members.intersection(kids):
                            await self._clear(round_)
                            continue
                        await session.children(self.path, watch=session.waker(fired))
                    elif len(kids) >= self.count:
                        await session.set(
                            self._ready, records.encode(Go(tuple(kids))), version=round_.version
                        )
                        log.info("double_barrier.go", path=self.path, participants=len(kids))
                        continue
                    if not await self._ready_unchanged(round_, fired):
                        continue
                except (errors.BadVersionError, errors.NodeExistsError):
                    continue
                except (errors.ConnectionLossError, errors.SessionExpiredError):
                    await session.wait_connected()
                    continue
                await fired.wait()
        except BaseException:
            await delete_guid_nodes(session, self.path, guid)
            raise

    async def _read_ready(self) -> _Round:
        session = self.session
        while True:
            try:
                data, stat = await session.get(self._ready)
                return _round_of(data, stat.version)
            except errors.NoNodeError:
                try:
                    await session.create(self._ready, makepath=True)
                except errors.NodeExistsError:
                    pass

    async def _ready_unchanged(self, round_: _Round, fired: trio.Event) -> bool:
        """Arm a watch on ``ready`` (setting ``fired``); false if ``ready`` changed since
        ``round_`` was read (then the caller decides again instead of waiting).  In that
        race the watch stays armed and costs one spare notification later."""
        session = self.session
        try:
            data, stat = await session.get(self._ready, watch=session.waker(fired))
        except errors.NoNodeError:
            return False
        if _round_of(data, stat.version) == round_:
            return True
        log.debug("double_barrier.watch_left_armed", path=self.path,
                  session=hex(session.session_id or 0))
        return False

    async def _clear(self, round_: _Round) -> None:
        """End ``round_`` (only if ``ready`` still holds it)."""
        try:
            await self.session.set(self._ready, b"", version=round_.version)
        except (errors.BadVersionError, errors.NoNodeError):
            pass

    # ------------------------------------------------------------------ leave

    async def _leave(self, me: str, round_: _Round) -> None:
        session = self.session
        while True:
            fired = trio.Event()
            try:
                kids = [
                    k for k in _participants(await session.children(self.path))
                    if k in round_.members
                ]
                if not kids:
                    await self._clear(round_)  # the last member crashed: end the round
                    break
                if kids == [me]:
                    await self._last_out(me, round_)
                    break
                if me == kids[0]:
                    target = kids[-1]
                else:
                    if me in kids:
                        await session.delete(f"{self.path}/{me}", missing_ok=True)
                    target = kids[0]
                if await session.exists(f"{self.path}/{target}", watch=session.waker(fired)):
                    await fired.wait()
            except (errors.ConnectionLossError, errors.SessionExpiredError):
                await session.wait_connected()
        log.debug("double_barrier.left", path=self.path, node=me)

    async def _last_out(self, me: str, round_: _Round) -> None:
        """The last member removes its node and ends the round atomically."""
        txn = self.session.transaction()
        txn.delete(f"{self.path}/{me}").set(self._ready, b"", version=round_.version)
        try:
            await txn.commit()
        except errors.TransactionFailedError:
            await self.session.delete(f"{self.path}/{me}", missing_ok=True)

    async def _abandon(self, me: str, round_: _Round) -> None:
        """Leave without waiting (shielded): delete our node, and end the round too if we
        are its last member, so nobody is held up by us."""
        with cleanup_scope(self.session):
            try:
                kids = _participants(await self.session.children(self.path))
                if [k for k in kids if k in round_.members] == [me]:
                    await self._last_out(me, round_)
            except errors.ZooKeeperError:
                pass
        await release_node(self.session, f"{self.path}/{me}")
        log.info("double_barrier.abandoned", path=self.path, node=me)
