"""``TreeCache`` and ``NodeCache``: a local copy of a subtree (or one node), kept current.

A cache holds the data, stat and children of every node under its root (down to
``max_depth`` levels below it), read once and then kept current from watch events, so
readers ask the cache instead of ZooKeeper.  Curator's ``CuratorCache`` and kazoo's
``TreeCache`` are the models; unlike kazoo's, this one does not hold two watches per node.

Protocol (ZooKeeper 3.6 and newer: one persistent watch)::

    addWatch(root, PERSISTENT_RECURSIVE)     # NodeCache: addWatch(path, PERSISTENT)
    walk: getData(n) + getChildren(n) for the root, then for every child listed
    event CREATED / CHANGED p  -> getData(p)            (its children have events of their own)
    event DELETED p            -> drop p and what is below it
    reconnected (NONE, CONNECTED) -> addWatch again, walk again; nodes the walk did not
                                     find are dropped when it completes

Every reply is applied in the callback of :meth:`Session.send_read`, in the order the
connection receives replies and events: the reply to a read sent after an event describes
the tree after that event, and a reply received before an event describes the tree before
it.  So the view is never rolled back by a stale reply, and it is the server's tree as of
some moment in the order of its changes.

Without persistent watches (a server older than 3.6, or ``persistent=False``), every node
gets a one-shot data watch and a child watch, each read again with its watch when it fires
(kazoo's approach: two watches a node on the server).  The driver sets those again on a new
connection and fires the ones whose node changed meanwhile, so a reconnection needs no walk.

States: ``ready`` is set when the first walk has completed.  SUSPENDED: the view stays as
it was (stale, never wrong in order); reconnected in the same session: it is brought up to
date as above.  LOST: the view stays while a new session is made, then the watch is set
again and the tree walked again; :attr:`TreeView.session_id` tells which session the view
was last complete in.  The cache ends with its ``async with`` block (the server's watch is
removed); it raises nothing of its own while it runs.

Events (:meth:`TreeView.events`): ``("added" | "updated" | "removed", path, data)`` for each
change seen, and ``("initialized", root, None)`` once the first walk is done.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import attrs
import outcome
import trio
from kazoo.protocol.states import EventType, KeeperState, WatchedEvent

from framework import errors
from framework.logs import get_logger
from framework.zk import Session, Stat, validate_path

log = get_logger(__name__)


@attrs.frozen
class CachedNode:
    """One node as the cache last read it."""

    data: bytes
    stat: Stat


@attrs.frozen
class CacheEvent:
    """A change the cache applied: ``kind`` is ``added``, ``updated``, ``removed`` or
    ``initialized``; ``data`` is the node's data after it (``None`` when removed)."""

    kind: str
    path: str
    data: bytes | None


class TreeView:
    """What a running :class:`TreeCache` holds; read it synchronously at any time."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.nodes: dict[str, CachedNode] = {}
        self.kids: dict[str, set[str]] = {}
        self.ready = trio.Event()
        self.session_id: int | None = None  # the session of the last completed walk
        self._listeners: list[trio.MemorySendChannel[CacheEvent]] = []

    def get(self, path: str) -> CachedNode | None:
        """The node at ``path`` as last read, or ``None``."""
        return self.nodes.get(path)

    def children(self, path: str) -> list[str]:
        """The names of the cached children of ``path`` (sorted)."""
        return sorted(self.kids.get(path, ()))

    def paths(self) -> list[str]:
        """Every cached path (sorted)."""
        return sorted(self.nodes)

    @asynccontextmanager
    async def events(self) -> AsyncIterator[trio.MemoryReceiveChannel[CacheEvent]]:
        """A channel of every :class:`CacheEvent` from now on, in order (unbounded:
        read it, or leave the block)."""
        send, receive = trio.open_memory_channel[CacheEvent](math.inf)
        self._listeners.append(send)
        try:
            async with receive:
                yield receive
        finally:
            self._listeners.remove(send)
            send.close()

    def _emit(self, kind: str, path: str, data: bytes | None) -> None:
        event = CacheEvent(kind, path, data)
        for listener in self._listeners:
            listener.send_nowait(event)


class TreeCache:
    """A local copy of the subtree at ``path`` (see the module doc).

    ``max_depth`` limits how far below ``path`` nodes are kept (0: the node alone).
    ``persistent``: ``None`` uses ZooKeeper 3.6's persistent watch when the server has it
    and per-node watches otherwise; ``True`` or ``False`` insists on one of them.

    ``async with TreeCache(session, "/apps").running() as view:`` - ``await
    view.ready.wait()`` for the first complete view.
    """

    def __init__(self, session: Session, path: str, *, max_depth: int | None = None,
                 persistent: bool | None = None) -> None:
        validate_path(path)
        if max_depth is not None and max_depth < 0:
            raise errors.ConfigurationError(f"max_depth must be 0 or more, got {max_depth}")
        self.session = session
        self.path = path
        self.max_depth = max_depth
        self._want_persistent = persistent
        self._persistent = persistent is not False
        self._view = TreeView(path)
        self._generation = 0  # one per walk
        self._seen: dict[str, int] = {}  # path -> the walk that last confirmed it
        self._walking = 0  # reads of the current walk not answered yet
        self._stale = False  # a read failed: walk again once connected
        self._wake = trio.Event()
        self._closed = False
        self._depth0 = path.count("/") if path != "/" else 0

    # ------------------------------------------------------------------ scope

    @asynccontextmanager
    async def running(self) -> AsyncIterator[TreeView]:
        """Run the cache for the block's duration; yield its :class:`TreeView`."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._keep)
            try:
                yield self._view
            finally:
                self._closed = True
                nursery.cancel_scope.cancel()
                if self._persistent:
                    with trio.CancelScope(shield=True), trio.move_on_after(1.0):
                        await self.session.remove_watch(self.path, self._on_event,
                                                        recursive=self._recursive)

    @property
    def _recursive(self) -> bool:
        return self.max_depth != 0

    async def _keep(self) -> None:
        """Set the watch and walk in each new session, and again when a read failed or a
        reconnection may have hidden changes (woken by the watch's ``NONE`` events and by
        failed reads, never by a timer)."""
        session = self.session
        seen_session: int | None = None
        while True:
            session_id = await session.wait_connected()
            self._wake = trio.Event()
            if session_id != seen_session or self._stale:
                try:
                    await self._start()
                    seen_session = session_id
                except (errors.ConnectionLossError, errors.SessionExpiredError):
                    continue
            await self._wake.wait()

    async def _start(self) -> None:
        if self._persistent:
            try:
                await self.session.add_watch(self.path, self._on_event, recursive=self._recursive)
            except errors.UnsupportedByServerError:
                if self._want_persistent:
                    raise
                log.info("cache.per_node_watches", path=self.path)
                self._persistent = False
        self._walk()

    # ------------------------------------------------------------------ reads

    def _walk(self) -> None:
        """Read the whole subtree again (a new generation)."""
        self._generation += 1
        self._stale = False
        self._walking = 0
        self._read_node(self.path, walk=True)

    def _read_node(self, path: str, *, walk: bool) -> None:
        generation = self._generation
        watch = None if self._persistent else self._on_event
        try:
            if walk:
                self._walking += 1
            self.session.send_read("get", path, lambda r: self._got_data(path, r, walk,
                                                                         generation),
                                   watch=watch)
            if self._below_limit(path):
                if walk:
                    self._walking += 1
                self.session.send_read("children", path,
                                       lambda r: self._got_children(path, r, walk, generation),
                                       watch=watch)
        except (errors.ConnectionLossError, errors.NotConnectedError):
            self._failed()

    def _below_limit(self, path: str) -> bool:
        return self.max_depth is None or self._depth(path) < self.max_depth

    def _depth(self, path: str) -> int:
        return (path.count("/") if path != "/" else 0) - self._depth0

    def _got_data(self, path: str, result: outcome.Outcome[Any], walk: bool,
                  generation: int) -> None:
        if isinstance(result, outcome.Error):
            if isinstance(result.error, errors.NoNodeError):
                self._drop(path)
                if not self._persistent and path == self.path:
                    self._watch_root_appear()
            else:
                self._failed()
        elif isinstance(result, outcome.Value):
            data, stat = result.value
            self._seen[path] = self._generation
            self._put(path, data, stat)
        self._read_done(walk, generation)

    def _got_children(self, path: str, result: outcome.Outcome[Any], walk: bool,
                      generation: int) -> None:
        if isinstance(result, outcome.Error):
            if not isinstance(result.error, errors.NoNodeError):
                self._failed()
        elif isinstance(result, outcome.Value) and path in self._view.nodes:
            base = path.rstrip("/")
            for name in result.value:
                child = f"{base}/{name}"
                # a walk reads every child again; after an event only new ones
                if walk and self._seen.get(child) != self._generation:
                    self._read_node(child, walk=True)
                elif not walk and child not in self._view.nodes:
                    self._read_node(child, walk=False)
        self._read_done(walk, generation)

    def _read_done(self, walk: bool, generation: int) -> None:
        if not walk or generation != self._generation:
            return
        self._walking -= 1
        if self._walking == 0 and not self._stale:
            self._sweep()

    def _sweep(self) -> None:
        """The walk is complete: nodes it did not confirm are gone."""
        view = self._view
        for path in [p for p in view.nodes if self._seen.get(p, 0) < self._generation]:
            self._drop(path)
        view.session_id = self.session.session_id
        if not view.ready.is_set():
            view.ready.set()
            view._emit("initialized", self.path, None)

    def _failed(self) -> None:
        """A read could not be made or failed: walk again once connected."""
        self._stale = True
        self._wake.set()

    # ------------------------------------------------------------------ the view

    def _put(self, path: str, data: bytes, stat: Stat) -> None:
        view = self._view
        old = view.nodes.get(path)
        if old is not None and old.stat.mzxid > stat.mzxid and old.stat.czxid == stat.czxid:
            return  # never older than what is held (a walk's read racing an event's)
        view.nodes[path] = CachedNode(data, stat)
        if path != self.path:
            parent = path.rsplit("/", 1)[0] or "/"
            view.kids.setdefault(parent, set()).add(path.rsplit("/", 1)[1])
        if old is None:
            view._emit("added", path, data)
        elif old.data != data or old.stat.mzxid != stat.mzxid:
            view._emit("updated", path, data)

    def _drop(self, path: str) -> None:
        view = self._view
        if path not in view.nodes:
            return
        for name in list(view.kids.get(path, ())):
            self._drop(f"{path.rstrip('/')}/{name}")
        del view.nodes[path]
        view.kids.pop(path, None)
        self._seen.pop(path, None)
        if path != self.path:
            parent = path.rsplit("/", 1)[0] or "/"
            view.kids.get(parent, set()).discard(path.rsplit("/", 1)[1])
        view._emit("removed", path, None)

    # ------------------------------------------------------------------ events

    def _on_event(self, event: WatchedEvent) -> None:
        """A watch event, in order with the replies (see the module doc)."""
        if self._closed:
            return
        kind, path = event.type, event.path
        if kind == EventType.NONE:
            if event.state == KeeperState.CONNECTED and self._persistent:
                self._stale = True  # set again but not replayed: read everything again
            self._wake.set()  # expired or closed: _keep starts again in the next session
            return
        if path is None or not self._within(path):
            return
        if kind == EventType.DELETED:
            self._drop(path)
            if not self._persistent and path == self.path:
                self._watch_root_appear()
        elif kind == EventType.CREATED and not self._persistent:
            self._read_node(path, walk=False)  # the root came back (an exists watch)
        elif kind in (EventType.CREATED, EventType.CHANGED):
            self._read_data(path)
        elif kind == EventType.CHILD and not self._persistent:
            self._read_children(path)

    def _within(self, path: str) -> bool:
        if path != self.path and not path.startswith(self.path.rstrip("/") + "/"):
            return False
        return self.max_depth is None or self._depth(path) <= self.max_depth

    def _read_data(self, path: str) -> None:
        generation = self._generation
        watch = None if self._persistent else self._on_event
        try:
            self.session.send_read("get", path,
                                   lambda r: self._got_data(path, r, False, generation),
                                   watch=watch)
        except (errors.ConnectionLossError, errors.NotConnectedError):
            self._failed()

    def _read_children(self, path: str) -> None:
        generation = self._generation
        try:
            self.session.send_read("children", path,
                                   lambda r: self._got_children(path, r, False, generation),
                                   watch=self._on_event)
        except (errors.ConnectionLossError, errors.NotConnectedError):
            self._failed()

    def _watch_root_appear(self) -> None:
        """Per-node watches: the root does not exist; an exists watch tells when it does."""
        try:
            self.session.send_read("exists", self.path, self._root_checked,
                                   watch=self._on_event)
        except (errors.ConnectionLossError, errors.NotConnectedError):
            self._failed()

    def _root_checked(self, result: outcome.Outcome[Any]) -> None:
        if isinstance(result, outcome.Error):
            self._failed()
        elif isinstance(result, outcome.Value) and result.value is not None:
            self._read_node(self.path, walk=False)  # created meanwhile: no CREATED event


class NodeCache(TreeCache):
    """A local copy of one node (``TreeCache`` with ``max_depth=0``: a persistent watch on
    the node alone).  ``view.get(path)`` is ``None`` while the node does not exist."""

    def __init__(self, session: Session, path: str, *, persistent: bool | None = None) -> None:
        super().__init__(session, path, max_depth=0, persistent=persistent)

