"""The line of idle consumers: only the first few wait for the queue to change (no herd).

Layout: ``<queue>/waiting/w-<guid>-NNNNNNNNNN``, ephemeral and sequential, one per
:class:`~framework.primitives.queue.WorkQueue` object that has a take with nothing to take;
consumers of one kind (``WorkQueue(line=...)``: they accept the same items) wait in their
own line, ``<queue>/waiting/<line>/w-...``, with its own heads.

Guarantees:

* The first :data:`HEADS` nodes in sequence order (the *heads*) wait on the queue's watched
  lists; every later waiter watches only the :data:`HEADS` nodes just ahead of it.  A node's
  deletion wakes at most :data:`HEADS` waiters however long the line, so a put wakes a few
  consumers, not all of them.
* A head stays a head (nodes ahead of it only ever go) and does not list the line again.
* A consumer leaves the line in the transaction that claims work (its node's delete is one
  more operation of the claim's multi), even with other takes still idle; the next waiter
  becomes a head only once the item is claimed, and a head that loses the race keeps its
  place.  It joins again at the back the next time it finds nothing; busy consumers never
  join.
* Creates are protected by the GUID in the name (a lost reply is recovered by
  :func:`~framework.zk.create_protected`); an interrupted join deletes what it may have made.
* SUSPENDED: the waits go on (the watches fire when the connection is back, or the caller
  looks again).  LOST: the node went with the session; the next wait joins again.

Why two heads, why a claim leaves the line, and the measured cost: ``docs/architecture.md``
("Idle consumers wait in line").
"""

from __future__ import annotations

import attrs
import trio

from framework import errors
from framework.zk import (
    Session,
    basename,
    cleanup_scope,
    create_protected,
    delete_guid_nodes,
    new_guid,
    sort_sequential,
)

#: Waiters that watch the queue itself (see the module doc).
HEADS = 2


@attrs.define(eq=False)
class WaitingLine:
    """One queue object's place in the line of idle consumers under ``root``."""

    session: Session
    root: str
    node: str | None = None  # our node's full path, while in line
    session_id: int | None = None  # the session that made it
    head: str | None = None  # our node, once seen among the heads (it stays one)

    async def turn(self) -> bool:
        """Join the line if not in it; return ``True`` at once if we are a head (the caller
        waits for the queue to change), else wait until one of the waiters we watch is gone
        and return ``False`` (the caller looks at the queue again)."""
        try:
            if self.node is None or self.session.session_id != self.session_id:
                await self._join()
            node = self.node
            if node is None:
                return False
            if self.head == node:  # nodes ahead only ever go: a head stays a head
                return True
            names = sort_sequential(
                [n for n in await self.session.children(self.root) if n.startswith("w-")]
            )
            if self.node != node:  # left meanwhile (another take's claim): look again
                return False
            mine = basename(node)
            if mine not in names:  # gone with an old session: join again next time
                self.node = None
                return False
            index = names.index(mine)
            if index < HEADS:
                self.head = node
                return True
            fired = trio.Event()
            wake = self.session.waker(fired)  # one callback object: one watcher per node
            for ahead in names[index - HEADS:index]:
                if await self.session.exists(f"{self.root}/{ahead}", watch=wake) is None:
                    return False  # gone already: look again
            await fired.wait()
            return False
        except (errors.ConnectionLossError, errors.SessionExpiredError):
            await self.session.wait_connected()
            return False

    async def _join(self) -> None:
        guid = new_guid()
        made = False
        try:
            with cleanup_scope(self.session):  # a cancelled join must not leave a ghost
                self.node = await create_protected(
                    self.session, self.root, "w-", guid=guid, ephemeral=True
                )
                self.session_id = self.session.session_id
                made = True
        finally:
            if not made:
                self.node = None
                await delete_guid_nodes(self.session, self.root, guid)

    def place(self) -> str | None:
        """Our node, if we are in line in the current session (for a claim to delete)."""
        if self.node is not None and self.session.session_id == self.session_id:
            return self.node
        return None

    def left(self) -> None:
        """Our node was deleted (by a claim transaction that included it)."""
        self.node = None

    async def leave(self) -> None:
        """Leave the line (shielded, bounded); nothing to do when not in it."""
        node, self.node = self.node, None
        if node is None or self.session.session_id != self.session_id:
            return
        with cleanup_scope(self.session) as scope:
            try:
                await self.session.delete(node, missing_ok=True)
            except errors.ZooKeeperError:
                pass  # the session ended: so did the node
        if scope.cancelled_caught:  # ZooKeeper unreachable: do it when it is back
            self.session.delete_later(node, session_id=self.session_id)
