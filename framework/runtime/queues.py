"""Named queues (issue #39): where a task is put, and the app's queues as a reader lists them.

A task type names its queue (``@task(queue="gpu")``, default :data:`DEFAULT_QUEUE`), a submit
may name another (``queue=``); the submitter writes the name into the task
(:attr:`Task.queue <framework.runtime.tasks.Task.queue>`, ``None`` for the default queue), so
whatever puts the task again later - the delayed mover, a dead letter's requeue, a rerun -
puts it back into the same queue.  The default queue is ``tasks/`` as it always was (existing
apps and data are unchanged); a named queue is a work queue of its own at
``queues/<name>``, made at its first put (:meth:`App.queue_path`).

:class:`QueueSet` gives a producer one :class:`WorkQueue` object per queue name, each made
like the producer's default one (its fence, dead-letter path, item bound, bucket size): a
master's or duty holder's puts into any queue are fenced by its term.  All queues share the
app's ``dead/`` (a dead letter carries its task, and so its queue).  The tasks the runtime
builds from a type's name alone (callbacks, canvas steps) go to that type's queue by the
app's catalog (:meth:`QueueSet.routed`: one read per producer, again for a name it lacks).

Nothing here waits or holds a scope; :func:`queue_names` is one listing.
"""

from __future__ import annotations

import attrs

from framework import errors
from framework.primitives.queue import WorkQueue
from framework.runtime.app import DEFAULT_QUEUE, App, check_queue_name, queue_list
from framework.runtime.task_types import Catalog
from framework.runtime.tasks import Task
from framework.zk import Session, Transaction

__all__ = ["DEFAULT_QUEUE", "QueueSet", "check_queue_name", "mark_unrouted", "queue_list",
           "queue_names", "sibling"]


def sibling(base: WorkQueue, path: str) -> WorkQueue:
    """A producer's queue object at ``path`` made like ``base`` (fence, dead letter, item
    bound, bucket size); ``base`` itself if it is at ``path``."""
    if base.path == path:
        return base
    return WorkQueue(base.session, path, bucket_size=base.bucket_size,
                     max_item_bytes=base.max_item_bytes, dead_letter=base.dead_letter,
                     fence=base.fence)


def mark_unrouted(txn: Transaction, app: App, task: Task, *, exists: bool = False) -> None:
    """Add to ``txn`` the operation that makes ``unrouted/<task id>`` name ``task``'s type
    (see :mod:`framework.runtime.scheduling.router`): its create, or (``exists``: a keyed
    task's marker is there already) its set, so that it covers this item too."""
    mark = task.name.encode()
    if exists:
        txn.set(app.unrouted_path(task.id), mark)
    else:
        txn.create(app.unrouted_path(task.id), mark)


class QueueSet:
    """The queues of ``app`` a producer puts into, by name (``None``: the default queue),
    each a :func:`sibling` of ``base`` (the producer's object for the default queue)."""

    def __init__(self, app: App, base: WorkQueue) -> None:
        self.app = app
        self.base = base
        self._made: dict[str, WorkQueue] = {DEFAULT_QUEUE: base}
        self._catalog = Catalog(base.session, app)

    def get(self, name: str | None) -> WorkQueue:
        """The queue named ``name`` (checked: a bad name is a one-line
        :class:`~framework.errors.ConfigurationError`)."""
        name = DEFAULT_QUEUE if name is None else check_queue_name(name)
        queue = self._made.get(name)
        if queue is None:
            queue = self._made[name] = sibling(self.base, self.app.queue_path(name))
        return queue

    async def queue_of_type(self, name: str) -> str | None:
        """The queue task type ``name`` goes to by the app's catalog (read once, again only
        for a name it does not list), as :attr:`Task.queue` holds it (``None``: the default
        queue); a type the catalog does not list goes to the default queue."""
        try:
            queue = (await self._catalog.check(name)).queue
        except errors.ConfigurationError:
            return None
        return None if queue == DEFAULT_QUEUE else queue

    async def listed(self, name: str) -> bool:
        """Whether the app's catalog lists task type ``name`` now (one read)."""
        return name in (await self._catalog.read()).types

    async def routed(self, task: Task) -> Task:
        """``task`` with its type's queue written in, unless it names one already (for the
        tasks the runtime builds itself: callbacks, canvas steps)."""
        if task.queue is not None:
            return task
        queue = await self.queue_of_type(task.name)
        return task if queue is None else attrs.evolve(task, queue=queue)


async def queue_names(session: Session, app: App) -> list[str]:
    """The app's queues now: ``default`` first, then the named queues made so far (one
    listing of ``queues/``), sorted."""
    try:
        named = await session.children(app.queues)
    except errors.NoNodeError:
        named = []
    return [DEFAULT_QUEUE, *sorted(n for n in named if n != DEFAULT_QUEUE)]
