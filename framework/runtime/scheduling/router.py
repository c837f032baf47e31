"""Routing the tasks submitted before their type's queue was known (issue #39, named queues).

A submitter learns a type's queue from the app's catalog, which a worker writes when it
registers its types.  A task submitted while the catalog is empty, without ``queue=``, goes to
the default queue with a marker ``unrouted/<task id>`` (data: its type's name) created in the
same multi as its item (:mod:`framework.runtime.submission`).  :class:`Router` moves such
tasks into their type's queue once the catalog says which.

**Who.**  The app's duty holder (:mod:`framework.runtime.worker_parts.duties`), one worker
process, whether or not a master leads (a master has no router); its term fences the moves:
the router's target queues are siblings of the holder's fenced default queue, so a deposed
holder's move is refused by the server.

**When.**  It follows the children of ``unrouted/`` and the catalog's node (two watches, no
polling) and sweeps at each change: a marker created after a sweep - a submitter that read an
empty catalog, then a worker registered, then the router swept, then the submitter's put
landed - is a change of ``unrouted/`` and wakes it.

**A sweep.**  For each marker: its type not in the catalog: left for later.  Its type routes to
``default``: the task is where it belongs, the marker is deleted.  Its type routes to a named
queue: the default queue is scanned for the task (its items' data read once each and kept by
name: an item's data never changes while queued), and each item of that task is moved with
:meth:`WorkQueue.move <framework.primitives.queue.WorkQueue.move>` - one multi that puts it
into the target queue (its ``Task.queue`` written in, so a retry, a requeue or a rerun keeps
it) and deletes it from the default queue only if nobody holds it.  Then the marker is
deleted.  An item held by a consumer is not moved: a default-serving worker with the type took
it first, it runs there (a retry stays there), and the marker is deleted.  An item not found
is gone (run, revoked or moved); its marker is deleted.

**Guarantees.**  A task is in exactly one queue at every moment (the move is one multi), so it
is never lost and the move never makes it run twice; a marker lives on past a crash between a
move and its delete, and the next sweep (by this holder or the next) finds its task no longer
in the default queue and deletes it.  A keyed task's ``pending/`` marker is pointed at the
moved item after the move (by the next sweep, if the holder died in between: it finds the
task's items in the target queue first); until the ``unrouted/`` marker is deleted, a keyed
submit counts the task as queued by that marker (:meth:`Submitter.existing
<framework.runtime.submission.Submitter.existing>`).  **SUSPENDED / LOST**: the router runs
inside the holder's term and is cancelled with it; a lost connection is waited for, then it
sweeps again.

Costs: nothing while ``unrouted/`` is empty but its watch and the catalog's.  A sweep with
markers to move: a listing of the default queue's buckets, one read per item not read before,
then one read and one multi per task moved, one delete per marker.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import attrs
import trio

from framework import errors, records
from framework.logs import get_logger
from framework.primitives.queue import WorkQueue
from framework.runtime.app import DEFAULT_QUEUE, App
from framework.runtime.queues import QueueSet
from framework.runtime.results.result_index import mark_queued
from framework.runtime.task_types import CatalogRecord
from framework.runtime.tasks import Task
from framework.zk import Session, gather, wait_exists

log = get_logger("framework.runtime.scheduling.router")


class Router:
    """Moves the app's unrouted tasks into their types' queues (see the module doc).
    ``queue``: the holder's default queue (fenced by its term).  ``moved`` counts the tasks
    this object moved; ``cleared`` the markers it deleted."""

    def __init__(self, session: Session, app: App, queue: WorkQueue) -> None:
        self.session = session
        self.app = app
        self.queue = queue
        self.queues = QueueSet(app, queue)
        self.moved = 0
        self.cleared = 0
        self._ids: dict[str, str] = {}  # default-queue item name -> its task's id

    async def run(self) -> None:
        """Sweep at every change of ``unrouted/`` or of the catalog, until cancelled."""
        session = self.session
        await session.ensure_path(self.app.unrouted)
        while True:
            changed = trio.Event()
            try:
                markers = await session.children(self.app.unrouted,
                                                 watch=session.waker(changed))
                catalog = await self._catalog(changed)
                if markers:
                    await self.sweep(markers, catalog)
            except (errors.ConnectionLossError, errors.SessionExpiredError):
                await session.wait_connected()
                continue
            except errors.NoNodeError:  # the app deleted under us: never made again here
                await wait_exists(session, self.app.unrouted)
                continue
            await changed.wait()

    async def _catalog(self, changed: trio.Event) -> CatalogRecord:
        """The catalog now, watched (its creation, if it does not exist yet)."""
        wake = self.session.waker(changed)
        try:
            data, _stat = await self.session.get(self.app.types, watch=wake)
        except errors.NoNodeError:
            if await self.session.exists(self.app.types, watch=wake) is None:
                return CatalogRecord()
            changed.set()  # made between the two reads: read it again
            return CatalogRecord()
        try:
            return records.decode(data, CatalogRecord) if data else CatalogRecord()
        except records.CorruptRecord as exc:
            log.warning("record.corrupt", path=self.app.types, error=str(exc))
            return CatalogRecord()

    async def sweep(self, markers: list[str], catalog: CatalogRecord) -> None:
        """Route the tasks of ``markers`` (task ids) whose types ``catalog`` lists."""
        types = await self._marker_types(markers)
        targets: dict[str, str] = {}  # task id -> its type's named queue
        for task_id, name in types.items():
            info = catalog.types.get(name)
            if info is None:
                continue  # not registered yet: a later change of the catalog wakes us
            if info.queue == DEFAULT_QUEUE:
                await self._clear(task_id, "default")  # it is where it belongs
            else:
                targets[task_id] = info.queue
        if not targets:
            return
        found = await self._find(set(targets))
        for task_id, queue in targets.items():
            for item in found.get(task_id, []):
                await self._move(item, queue)
            if task_id not in found:  # moved by a holder that died before re-pointing?
                await self._repoint(task_id, queue)
            await self._clear(task_id, queue)

    async def _marker_types(self, markers: list[str]) -> dict[str, str]:
        """Each marker's task type (markers gone meanwhile left out), read together."""
        types: dict[str, str] = {}

        async def read(task_id: str) -> None:
            try:
                data, _stat = await self.session.get(self.app.unrouted_path(task_id))
            except errors.NoNodeError:
                return
            types[task_id] = data.decode(errors="replace")

        await gather(*[_bind(read, m) for m in markers])
        return types

    async def _find(self, ids: set[str]) -> dict[str, list[str]]:
        """The default queue's items of the tasks ``ids`` (see :func:`_items_of`; the ids
        read are kept by item name for the next sweeps)."""
        return await _items_of(self.queue, ids, self._ids)

    async def _move(self, item: str, queue: str) -> None:
        target = self.queues.get(queue)
        moved: list[Task] = []

        def rewrite(data: bytes) -> bytes:
            task = attrs.evolve(Task.decode(data), queue=queue)
            moved.append(task)
            return task.encode()

        name = await self.queue.move(item, target, rewrite=rewrite)
        self._ids.pop(item, None)
        if name is None:
            log.info("router.taken", app=self.app.name, item=item)
            return
        task = moved[-1]
        if task.key is not None:
            await mark_queued(self.session, self.app,
                              [(task.key, self.app.item_ref(queue, name))])
        self.moved += 1
        log.info("router.moved", app=self.app.name, task=task.id, name=task.name,
                 queue=queue)

    async def _repoint(self, task_id: str, queue: str) -> None:
        """A marked task no longer in the default queue (run, revoked, or moved by a holder
        that died before its ``pending/`` marker was re-pointed): if it has a key (then its
        id) and a ``pending/`` marker, point the marker at its items in ``queue`` (a listing
        of that queue and a read of each item: only after such a crash or a run)."""
        try:
            await self.session.get(self.app.pending_path(task_id))
        except errors.NoNodeError:
            return  # no key, or its marker trimmed: nothing to keep true
        found = await _items_of(self.queues.get(queue), {task_id}, {})
        marks = [(task_id, self.app.item_ref(queue, name)) for name in found.get(task_id, [])]
        if marks:
            await mark_queued(self.session, self.app, marks)
            log.info("router.repointed", app=self.app.name, task=task_id, queue=queue)

    async def _clear(self, task_id: str, queue: str) -> None:
        await self.session.delete(self.app.unrouted_path(task_id), missing_ok=True)
        self.cleared += 1
        log.debug("router.cleared", app=self.app.name, task=task_id, queue=queue)


async def _items_of(queue: WorkQueue, ids: set[str], known: dict[str, str]
                    ) -> dict[str, list[str]]:
    """The items of ``queue`` whose tasks have the ids ``ids``, by id: a listing of its
    buckets and a read of each item ``known`` (item name -> task id, kept current here: an
    item's data never changes while queued) does not name yet."""
    names = await queue.item_names()
    listed = set(names)
    for gone in [name for name in known if name not in listed]:
        del known[gone]

    async def read(name: str) -> None:
        data = await queue.item_data(name)
        if data is None:
            return
        try:
            known[name] = Task.decode(data).id
        except Exception:  # not a task: never ours to move
            known[name] = ""

    await gather(*[_bind(read, n) for n in names if n not in known])
    found: dict[str, list[str]] = {}
    for name in names:
        task_id = known.get(name)
        if task_id in ids:
            found.setdefault(task_id, []).append(name)
    return found


def _bind(fn: Callable[[str], Awaitable[None]], arg: str) -> Callable[[], Awaitable[None]]:
    async def call() -> None:
        await fn(arg)

    return call
