"""A node kept in place for as long as its scope runs (Curator's ``PersistentNode``).

``async with PersistentNode(session, path, data).run() as node:`` creates ``path`` and
keeps it there: when someone deletes it, or when the session is LOST (an ephemeral node goes
with it), the node is created again as soon as the session serves; when the scope ends it is
deleted.  ``await node.set_data(b"...")`` changes the data, also for every later re-creation.

Layout: the one node at ``path`` (ephemeral by default; ``ephemeral=False`` for a persistent
node, ``ttl=`` seconds for a persistent TTL node the server reaps once idle after this
process stops keeping it).

State machine::

    ABSENT --create--> PRESENT --deleted / session LOST (watch fires)--> ABSENT
       ^  \\--node of another live session: wait until it goes----------/   |
       +---------------------------------------------------------------------+

Protocol: an ``exists`` watch on the node, and a create when it is missing (then one more
``exists``, woken by our own create); every wake-up looks again with one ``exists``.  A node
already there is adopted when it is ours (an ephemeral node of this session: a create whose
reply was lost, recovered by reading) or persistent (its data is overwritten); an ephemeral
node of *another* session is never taken over: we wait until it goes (its session ends),
so two keepers of one path never both believe they hold it.

SUSPENDED: nothing is done (the node may still exist; the watch is set again by the
session on reconnection).  LOST: every watch fires; the node is created in the new session.
:attr:`present` is set while the node is known to exist as ours; ``await
node.wait_present()`` waits for that.  Errors other than connection faults (NoAuth, a
missing parent with ``makepath=False``...) end the scope with that error.

Costs: a create and two ``exists`` on start and after each loss, one ``exists`` per data
change; a delete at the end.
"""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import AsyncIterator

import trio

from framework import errors
from framework.logs import get_logger
from framework.primitives.lock import release_node
from framework.zk import Session, Stat, validate_data, validate_path

log = get_logger("framework.primitives.persistent_node")


class PersistentNode:
    """Keep ``path`` (with ``data``) present while :meth:`run`'s scope runs; see the module."""

    def __init__(
        self,
        session: Session,
        path: str,
        data: bytes = b"",
        *,
        ephemeral: bool = True,
        ttl: float | None = None,
        makepath: bool = True,
    ) -> None:
        validate_path(path, allow_root=False)
        if ttl is not None and ephemeral:
            raise errors.ConfigurationError(
                "a TTL node cannot be ephemeral: pass ephemeral=False with ttl="
            )
        self.session = session
        self.path = path
        self.data = validate_data(data)
        self.ephemeral = ephemeral
        self.ttl = ttl
        self.makepath = makepath
        self.present = False
        self._changed = trio.Event()
        self.recreated = 0  # how many times the node was created again after a loss
        self._failure: errors.FrameworkError | None = None

    async def wait_present(self) -> None:
        """Return once the node exists as ours (immediately if it does now)."""
        while not self.present:
            await self._changed.wait()

    async def set_data(self, data: bytes) -> None:
        """Write ``data`` now (when present) and on every later re-creation."""
        self.data = validate_data(data)
        if not self.present:
            return
        try:
            await self.session.set(self.path, self.data)
        except errors.NoNodeError:
            pass  # gone meanwhile: the keeper creates it again with the new data

    @asynccontextmanager
    async def run(self) -> AsyncIterator[PersistentNode]:
        """Keep the node in place inside the block; delete it afterwards."""
        body_error: BaseException | None = None
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._keep_or_fail, nursery.cancel_scope)
                try:
                    yield self
                except trio.Cancelled:
                    raise
                except BaseException as exc:  # the body's own error, kept out of the nursery
                    body_error = exc
                finally:
                    nursery.cancel_scope.cancel()
        finally:
            self._mark(False)
            await self._remove()  # shielded
        if body_error is not None:
            raise body_error
        if self._failure is not None:
            raise self._failure

    async def _keep_or_fail(self, scope: trio.CancelScope) -> None:
        """Keep the node; an error no retry can help (NoAuth, a closed session...) ends the
        scope and is raised from it, as itself rather than inside an exception group."""
        try:
            await self._keep()
        except errors.FrameworkError as exc:
            log.warning("persistent_node.failed", path=self.path, error=str(exc))
            self._failure = exc
            scope.cancel()

    async def _remove(self) -> None:
        if self.ephemeral:
            await release_node(self.session, self.path)
        else:
            with trio.CancelScope(shield=True):
                try:
                    await self.session.delete(self.path, missing_ok=True)
                except errors.ZooKeeperError as exc:
                    log.warning("persistent_node.delete_failed", path=self.path, error=str(exc))

    def _mark(self, present: bool) -> None:
        if present != self.present:
            self.present = present
            self._changed.set()
            self._changed = trio.Event()

    async def _keep(self) -> None:
        ever = False
        while True:
            try:
                ours, fired = await self._ensure()
            except (errors.ConnectionLossError, errors.SessionExpiredError):
                await self.session.wait_connected()
                continue
            if ours and not self.present:
                if ever:
                    self.recreated += 1
                    log.info("persistent_node.recreated", path=self.path)
                ever = True
            self._mark(ours)
            await fired.wait()  # deleted, changed, or the session lost: look again

    def _ours(self, stat: Stat) -> bool:
        if not self.ephemeral:
            return True
        return bool(stat.ephemeralOwner == self.session.session_id)

    async def _ensure(self) -> tuple[bool, trio.Event]:
        """Look (arming a watch), creating the node when missing; return whether it is ours
        and the event its watch sets.  Another session's node is not ours: wait for it."""
        session = self.session
        while True:
            await session.wait_connected()
            fired = trio.Event()
            stat = await session.exists(self.path, watch=session.waker(fired))
            if stat is not None:
                if not self.ephemeral and not self.present:  # adopt it with our data
                    try:
                        data, _stat = await session.get(self.path)
                        if data != self.data:
                            await session.set(self.path, self.data)
                    except errors.NoNodeError:
                        continue  # deleted meanwhile: create it
                if not self._ours(stat):
                    log.info("persistent_node.waiting", path=self.path,
                             owner=f"{stat.ephemeralOwner:#x}")
                return self._ours(stat), fired
            self._mark(False)
            try:
                await session.create(self.path, self.data, ephemeral=self.ephemeral,
                                     makepath=self.makepath, ttl=self.ttl)
            except errors.NodeExistsError:
                if not self.ephemeral:  # a persistent node left by someone: make it ours
                    try:
                        await session.set(self.path, self.data)
                    except errors.NoNodeError:
                        pass
            except errors.ConnectionLossError:
                pass  # created or not: look again
