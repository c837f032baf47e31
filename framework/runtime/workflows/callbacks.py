"""Callbacks: a task of type ``on_success`` queued with a task's result, ``on_failure`` with its
final error (Celery's ``link`` / ``link_error``, RQ's and Dramatiq's ``on_success`` /
``on_failure``).

Given per task type (``@task(on_success="report")``) or per submit (``submit(...,
on_success="report")``, which wins).  The callback is an ordinary task of the app (its type's
retries, limits, dead letters) whose payload is a :class:`CallbackPayload` as a dict::

    {"task_id": ..., "key": ..., "name": <the finished task's type>, "ok": true,
     "result": <its result>, "error": null, "payload": <its payload>}

(``result`` and ``payload`` are ``null`` with ``"omitted": true`` when the callback would not
fit in a queue item: read the record with ``Client.result(key)``).  Its key is
``<task key>.on_success`` (or ``.on_failure.<attempts>``), so its own result is found by name
and a second delivery of the same callback is skipped by the idempotency key.  An expired or
revoked task queues no callback.

Durability, once per finished task: the success's callback is written as
``callbacks/<callback key>`` (a :class:`PendingCallback`) *in the transaction that
acknowledges the task and records its result*: a worker killed -9 at any moment either
committed both (the callback is pending) or neither (the task is delivered again, runs
again, and its ack carries the callback).  Right after the ack the worker moves the node into
the queue in one multi (the item's create and the node's delete at its version,
:meth:`WorkQueue.put` with ``also``), so a node is queued once whoever moves it.  A node left
by a worker killed (or paused past its session) between its ack and that move is moved by
the app's other workers when its membership node goes, or by the next worker that starts
(:func:`move_left_behind`).  A final failure's callback is
written right before the failure record (not in one transaction: the dead-lettering that
follows is not one either); a worker killed between the two gives the task one more delivery,
which fails again and writes the same node name (an existing one is kept).

Cost: a callback adds one create to the ack's multi, then one multi (the move) per callback.
"""

from __future__ import annotations

import hashlib
from typing import Any

import attrs

from framework import errors, records
from framework.logs import get_logger
from framework.primitives.queue import WorkQueue
from framework.runtime.app import App
from framework.runtime.payloads import MAX_TASK_BYTES
from framework.runtime.queues import QueueSet
from framework.runtime.results.result_index import mark_queued
from framework.runtime.tasks import Outcome, Task, TaskResult, new_task
from framework.zk import Session, watch_children

log = get_logger(__name__)

#: Longest task key (a znode name the app's names allow).
MAX_KEY_CHARS = 100


def callbacks_path(app: App) -> str:
    """The app's ``callbacks/`` node: callbacks written with an ack, not yet queued."""
    return f"{app.base}/callbacks"


@attrs.frozen
class PendingCallback:
    """``callbacks/<key>``: the callback task to queue, at ``priority``."""

    task: Task
    priority: int = 0


def callback_for(task: Task, result: TaskResult, *, on_success: str | None,
                 on_failure: str | None) -> Task | None:
    """The callback task owed for ``task`` ending with ``result`` (``None``: none): its
    type is ``on_success`` for a success, ``on_failure`` for a failure; see the module doc
    for its payload and key."""
    name = on_success if result.ok else on_failure
    if name is None or result.outcome in (Outcome.REVOKED, Outcome.EXPIRED):
        return None
    key = f"{task.key}.on_success" if result.ok else f"{task.key}.on_failure.{task.attempts}"
    if len(key) > MAX_KEY_CHARS:  # a long key: its digest stands in for it
        digest = hashlib.sha1(task.key.encode(), usedforsecurity=False).hexdigest()
        key = digest + key[len(task.key):]
    body: dict[str, Any] = {"task_id": task.id, "key": task.key, "name": task.name,
                            "ok": result.ok, "result": result.result, "error": result.error,
                            "payload": task.payload}
    callback = new_task(body, name=name, task_id=key, idempotency_key=key)
    if len(callback.encode()) > MAX_TASK_BYTES:
        body.update(result=None, payload=None, omitted=True)
        callback = new_task(body, name=name, task_id=key, idempotency_key=key)
    return callback


def node_of(app: App, callback: Task) -> str:
    """The path of ``callback``'s pending node."""
    return f"{callbacks_path(app)}/{callback.key}"


def encode(callback: Task, priority: int = 0) -> bytes:
    return records.encode(PendingCallback(callback, priority))


async def write(session: Session, app: App, callback: Task) -> None:
    """Write ``callback``'s pending node outside an ack (a final failure's); an existing
    node of that name is kept (a redelivery's second write)."""
    try:
        await session.create(node_of(app, callback), encode(callback), makepath=True)
    except errors.NodeExistsError:
        pass


async def move(session: Session, app: App, queue: WorkQueue | QueueSet, path: str) -> bool:
    """Queue the callback pending at ``path`` and delete its node, in one multi; ``False``
    if it is gone (moved by another process) or changed meanwhile.  A corrupt node is
    logged and deleted.  It goes into its type's queue (``queue``'s sibling, by the app's
    catalog: :meth:`QueueSet.routed`)."""
    queues = queue if isinstance(queue, QueueSet) else QueueSet(app, queue)
    try:
        data, stat = await session.get(path)
    except errors.NoNodeError:
        return False
    try:
        pending = records.decode(data, PendingCallback)
    except records.CorruptRecord as exc:
        log.error("callback.corrupt", path=path, error=str(exc))
        await session.delete(path, version=stat.version, missing_ok=True)
        return False
    def delete(txn: Any) -> None:
        txn.delete(path, version=stat.version)

    task = await queues.routed(pending.task)
    try:
        item = await queues.get(task.queue).put(task.encode(), priority=pending.priority,
                                                also=delete)
    except errors.TransactionFailedError:
        return False  # moved by another process meanwhile
    await mark_queued(session, app, [(task.key, app.item_ref(task.queue, item))])
    log.info("callback.queued", task=task.id, type=task.name, queue=task.queue_name)
    return True


async def move_all(session: Session, app: App, queue: WorkQueue | QueueSet) -> int:
    """Queue every pending callback (those left by a worker killed between its ack and its
    move); returns how many this call queued."""
    try:
        names = await session.children(callbacks_path(app))
    except errors.NoNodeError:
        return 0
    moved = 0
    queues = queue if isinstance(queue, QueueSet) else QueueSet(app, queue)
    for name in sorted(names):
        moved += await move(session, app, queues, f"{callbacks_path(app)}/{name}")
    return moved


async def move_left_behind(session: Session, app: App, queue: WorkQueue | QueueSet) -> None:
    """Until cancelled: queue the pending callbacks when this worker starts and again each
    time a worker of the app leaves (its membership node gone: killed, paused past its
    session, or stopped), whose ack may have committed a callback it did not move.  One
    children watch on the app's ``workers/``; a listing of ``callbacks/`` per departure."""
    seen: frozenset[str] | None = None
    queue = queue if isinstance(queue, QueueSet) else QueueSet(app, queue)
    async for snap in watch_children(session, app.workers):
        members = frozenset(snap.children)
        if seen is None or seen - members:
            try:
                await move_all(session, app, queue)
            except errors.ZooKeeperError as exc:  # the next departure (or start) tries again
                log.warning("callback.sweep_failed", app=app.name, error=str(exc))
        seen = members
