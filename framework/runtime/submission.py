"""Submitting one task: the one path behind ``Master``, ``Worker`` and ``Client.submit`` and
``framework submit``.

``submit(name, payload, ...)`` checks ``name`` against the app's task types
(:class:`~framework.runtime.task_types.Catalog`: an unknown name is a
:class:`~framework.errors.ConfigurationError` naming the known ones), builds the task, and
queues it now, or at its time (``countdown=`` seconds, ``eta=`` an aware datetime or epoch
seconds: :mod:`framework.runtime.delayed`).  ``priority`` defaults to the task type's.
Costs: one read of the catalog per submitter (again only for a name it does not know), then
the queue's put (one request) or the delayed node's create (one request).
"""

from __future__ import annotations

import time
from typing import Any

from framework import errors
from framework.primitives.queue import WorkQueue
from framework.runtime.app import App
from framework.runtime.delayed import delay, due_time
from framework.runtime.result_index import mark_queued
from framework.runtime.task_types import Catalog
from framework.runtime.tasks import Task, new_task
from framework.zk import Session


class Submitter:
    """Submits tasks of ``app`` into ``queue`` (the caller's: fenced for a master)."""

    def __init__(self, session: Session, app: App, queue: WorkQueue) -> None:
        self.session = session
        self.app = app
        self.queue = queue
        self.catalog = Catalog(session, app)

    async def submit(self, name: str, payload: Any = None, *, task_id: str | None = None,
                     idempotency_key: str | None = None, time_limit: float | None = None,
                     priority: int | None = None, countdown: float | None = None,
                     eta: Any = None) -> Task:
        """Queue task ``name`` (see the module doc); returns it with its id."""
        due = due_time(countdown, eta)
        info = await self.catalog.check(name)
        task = new_task(payload, name=name, task_id=task_id,
                        idempotency_key=idempotency_key, time_limit=time_limit)
        level = info.priority if priority is None else priority
        WorkQueue._check_priority(level)
        explicit = task_id is not None or idempotency_key is not None
        if due is not None and due > time.time():
            await delay(self.session, self.app, task, level, due, explicit=explicit)
        else:
            item = await self.queue.put(task.encode(), priority=level)
            if explicit:  # another task of this key may come: its record must wait
                await mark_queued(self.session, self.app, [(task.key, item)])
        return task

    async def submit_many(self, name: str, payloads: list[Any], *,
                          priority: int | None = None,
                          keys: list[str] | None = None) -> list[Task]:
        """Queue many tasks of type ``name`` in one pipelined burst (see
        ``MasterContext.submit_many``)."""
        if keys is not None and len(keys) != len(payloads):
            raise errors.ConfigurationError(
                f"submit_many: {len(keys)} keys for {len(payloads)} payloads"
            )
        info = await self.catalog.check(name)
        tasks = [new_task(p, name=name) for p in payloads] if keys is None else [
            new_task(p, name=name, task_id=k, idempotency_key=k)
            for p, k in zip(payloads, keys, strict=True)
        ]
        level = info.priority if priority is None else priority
        items = await self.queue.put_many([t.encode() for t in tasks], priority=level)
        if keys is not None:  # see mark_queued
            await mark_queued(self.session, self.app,
                              [(t.key, n) for t, n in zip(tasks, items, strict=True)])
        return tasks
