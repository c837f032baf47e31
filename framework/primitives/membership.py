"""Group membership: ephemeral member nodes under one parent, watched as complete snapshots.

``async with group.join("w1", data) as me:`` keeps an ephemeral ``{path}/w1`` for the duration
of the block (``name=None``: ``{path}/m_{guid}-NNNNNNNNNN``, sequential and protected).
Membership survives a session expiry: a background task in the join's own nursery notices
that the node is gone and creates it again in the new session, with the latest data given to
:meth:`Membership.update`.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import attrs
import trio
from kazoo.protocol.states import EventType

from framework import errors
from framework.logs import get_logger
from framework.zk import (
    Session,
    basename,
    cleanup_scope,
    create_protected,
    delete_guid_nodes,
    gather,
    new_guid,
    single_body_error,
    validate_component,
    validate_data,
    validate_path,
    wait_gone,
)

log = get_logger("framework.primitives.membership")

PREFIX = "m_"


@attrs.define(eq=False)
class Membership:
    """Our place in a group.  ``name`` and ``path`` are those of our node; for a sequential
    member they change when the member rejoins after a session expiry."""

    name: str
    path: str
    data: bytes
    guid: str | None = None
    _group: Group | None = attrs.field(default=None, repr=False, alias="group")
    _lock: trio.Lock = attrs.field(factory=trio.Lock, repr=False)

    async def update(self, data: bytes) -> None:
        """Replace our member data.  If the node is momentarily gone (expired session), the
        rejoin carries the new data instead."""
        data = validate_data(data)
        assert self._group is not None
        session = self._group.session
        async with self._lock:
            self.data = data
            while True:
                try:
                    await session.set(self.path, data)
                    return
                except errors.ConnectionLossError:
                    await session.wait_connected()  # the same data again: safe to repeat
                except (errors.NoNodeError, errors.SessionExpiredError):
                    return


class Group:
    """The members under ``path``.

    * SUSPENDED: a joined member's node stays as long as the session lives; nothing is done.
      Watchers keep their last snapshot and read again when the connection is back.
    * LOST (session expired): the server removed our node; the join's background task creates
      it again as soon as the new session is connected (logged as ``membership.rejoined``).
      A named member whose name was taken meanwhile by another live session waits until that
      node goes.  Watchers read the complete state again in the new session.
    """

    def __init__(self, session: Session, path: str) -> None:
        validate_path(path, allow_root=False)
        self.session = session
        self.path = path

    # ------------------------------------------------------------------ joining

    @asynccontextmanager
    async def join(
        self, name: str | None = None, data: bytes = b"", *, wait_if_taken: bool = False
    ) -> AsyncIterator[Membership]:
        """Be a member for the duration of the block (see the class docstring).

        A named join whose name is held by another live session raises
        :class:`NodeExistsError`, or with ``wait_if_taken`` waits until it is free (e.g. the
        previous incarnation of a restarted process, until its session expires).
        """
        if name is not None:
            validate_component("member name", name)
        data = validate_data(data)
        member = Membership(
            name or "", f"{self.path}/{name}" if name else "", data,
            guid=None if name else new_guid(), group=self,
        )
        created = False
        try:
            async with member._lock:
                await self._create(member, initial=not wait_if_taken)
            created = True
            log.info("membership.joined", group=self.path, member=member.name)
            with single_body_error():
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._keep, member)
                    try:
                        yield member
                    finally:
                        nursery.cancel_scope.cancel()
        finally:
            await self._leave(member, created)

    async def _create(self, member: Membership, *, initial: bool) -> None:
        """Create our node; called with ``member._lock`` held."""
        session = self.session
        if member.guid is not None:
            while True:
                try:
                    node = await create_protected(
                        session, self.path, PREFIX, member.data, guid=member.guid
                    )
                except errors.SessionExpiredError:
                    continue
                member.path, member.name = node, basename(node)
                return
        while True:
            try:
                await session.create(member.path, member.data, ephemeral=True, makepath=True)
                return
            except errors.SessionExpiredError:
                continue
            except (errors.ConnectionLossError, errors.NodeExistsError):
                await session.wait_connected()
            stat = await session.exists(member.path)
            if stat is None:
                continue
            if stat.ephemeralOwner == session.session_id:
                return  # our create went through before the reply was lost
            if initial:
                raise errors.NodeExistsError(
                    f"member name {member.name!r} in {self.path} is held by another session"
                )
            log.warning("membership.name_taken", group=self.path, member=member.name)
            await wait_gone(session, member.path)

    async def _keep(self, member: Membership) -> None:
        """Recreate our node whenever it disappears (session expiry, or deleted by hand)."""
        while True:
            await wait_gone(self.session, member.path)
            async with member._lock:
                await self._create(member, initial=False)
            log.warning("membership.rejoined", group=self.path, member=member.name,
                        session_id=self.session.session_id)

    async def _leave(self, member: Membership, created: bool) -> None:
        session = self.session
        with cleanup_scope(session):
            if member.guid is not None:
                await delete_guid_nodes(session, self.path, member.guid)
            else:
                try:
                    stat = await session.exists(member.path)
                    if stat is not None and stat.ephemeralOwner == session.session_id:
                        await session.delete(member.path, version=stat.version,
                                             missing_ok=True)
                except errors.ZooKeeperError:
                    return  # the session is going: the server removes the node anyway
        if created:
            log.info("membership.left", group=self.path, member=member.name)

    # ------------------------------------------------------------------ observing

    async def members(self) -> dict[str, bytes]:
        """Every member's name and data right now (sorted by name)."""
        try:
            names = await self.session.children(self.path)
        except errors.NoNodeError:
            return {}
        found: dict[str, bytes] = {}

        async def fetch(name: str) -> None:
            try:
                found[name], _ = await self.session.get(f"{self.path}/{name}")
            except errors.NoNodeError:
                pass

        await gather(*[functools.partial(fetch, name) for name in names])
        return dict(sorted(found.items()))

    async def watch(self) -> AsyncIterator[dict[str, bytes]]:
        """Yield the members now, then every later distinct state (joins, leaves, updates).

        One children watch on the group and one data watch per member; after a notification
        only what changed is read again, and the watch that fired is re-armed by that read,
        so nothing is missed and a burst collapses into the latest state.  After a connection
        loss everything is read again.
        """
        session = self.session
        pending = _Pending()

        def notifier(name: str | None) -> Callable[[Any], None]:
            def fire(event: Any) -> None:
                pending.mark(name, event.type)
            return fire

        # one callback object per path: the session keeps watch callbacks in a set, so re-arming a
        # watch with the same object never piles up callbacks
        on_children = notifier(None)
        on_data: dict[str, Callable[[Any], None]] = {}
        cache: dict[str, bytes] = {}
        last: dict[str, bytes] | None = None
        while True:
            full, children_changed, changed, wake = pending.take()
            try:
                if full:
                    children_changed, changed = True, set(cache)
                if children_changed:
                    names = set(await self._children(on_children))
                    for gone in set(cache) - names:
                        del cache[gone]
                        on_data.pop(gone, None)
                    changed |= names - set(cache)
                    changed &= names
                await self._fetch(sorted(changed), cache, on_data, notifier)
            except (errors.ConnectionLossError, errors.SessionExpiredError):
                pending.everything()
                await session.wait_connected()
                continue
            snapshot = dict(sorted(cache.items()))
            if snapshot != last:
                last = snapshot
                yield dict(snapshot)
            await wake.wait()

    async def _children(self, watch: Callable[[Any], None]) -> list[str]:
        while True:
            try:
                return await self.session.children(self.path, watch=watch)
            except errors.NoNodeError:
                if await self.session.exists(self.path, watch=watch) is None:
                    return []

    async def _fetch(
        self,
        names: list[str],
        cache: dict[str, bytes],
        on_data: dict[str, Callable[[Any], None]],
        notifier: Callable[[str | None], Callable[[Any], None]],
    ) -> None:
        async def fetch(name: str) -> None:
            callback = on_data.setdefault(name, notifier(name))
            try:
                cache[name], _ = await self.session.get(f"{self.path}/{name}", watch=callback)
            except errors.NoNodeError:
                cache.pop(name, None)
                on_data.pop(name, None)

        await gather(*[functools.partial(fetch, name) for name in names])


@attrs.define
class _Pending:
    """What the watch callbacks reported since the last read (owned by one watcher)."""

    full: bool = True
    children: bool = True
    names: set[str] = attrs.field(factory=set)
    wake: trio.Event = attrs.field(factory=trio.Event)

    def mark(self, name: str | None, event_type: Any) -> None:
        if event_type == EventType.NONE:
            self.full = True
        elif name is None:
            self.children = True
        else:
            self.names.add(name)
        self.wake.set()

    def everything(self) -> None:
        self.full = True
        self.wake.set()

    def take(self) -> tuple[bool, bool, set[str], trio.Event]:
        taken = (self.full, self.children, self.names)
        self.full, self.children, self.names = False, False, set()
        self.wake = trio.Event()
        return (*taken, self.wake)
