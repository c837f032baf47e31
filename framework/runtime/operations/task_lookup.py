"""Where one task is now, by its id: what ``Client.revoke`` checks before it revokes.

:func:`where_is` answers ``"running"``, ``"queued"``, ``"delayed"`` or ``None`` (not there:
never submitted, or finished and acknowledged).  Cost, cheapest first, stopping at the first
answer:

* its ``running/`` marker: one ``exists``;
* its ``pending/`` marker (a task submitted with a key): one read, then one ``exists`` per
  item it names;
* the ``delayed/`` nodes: one listing per minute bucket and one read per delayed task;
* the queues' items (a task submitted without a key has no marker): one listing of
  ``queues/``, then per queue (the default one first, then each named queue) one listing
  per bucket and one read per queued item, pipelined (:data:`READS_IN_FLIGHT` at a time).

The answer is a snapshot: a task may be taken, finish or be moved from ``delayed/`` to the
queue right after.  The order of the checks makes a move invisible to none of them: the
delayed task's move creates its queue item and deletes its delayed node in one multi, and
the delayed nodes are read before the queue.  Read-only; raises what the session raises
(``ConnectionLoss`` waits as every read does).
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Sequence

from framework import errors, records
from framework.primitives.queue import WorkQueue
from framework.runtime.app import App
from framework.runtime.queues import queue_names
from framework.runtime.results.result_index import read_mark, still_queued
from framework.zk import Session, gather

#: Reads of queued items or delayed nodes in flight at once while looking for a task id.
READS_IN_FLIGHT = 500


async def where_is(session: Session, app: App, task_id: str) -> str | None:
    """``"running"``, ``"queued"``, ``"delayed"`` or ``None`` for task ``task_id`` of
    ``app`` (see the module doc for the cost)."""
    if await session.exists(f"{app.running}/{task_id}") is not None:
        return "running"
    path = app.pending_path(task_id)
    try:
        marked = read_mark((await session.get(path))[0], path).items
    except errors.NoNodeError:
        marked = ()
    if marked and await still_queued(session, app, marked):
        return "queued"
    if await _in_delayed(session, app, task_id):
        return "delayed"
    for name in await queue_names(session, app):  # every queue, the default one first
        queue = WorkQueue(session, app.queue_path(name))
        if await _any_matches(await queue.item_names(), queue.item_data, task_id,
                              lambda data: _id_of(data, ())):
            return "queued"
    return None


async def _in_delayed(session: Session, app: App, task_id: str) -> bool:
    try:
        buckets = await session.children(app.delayed)
    except errors.NoNodeError:
        return False
    paths: list[str] = []
    for bucket in sorted(buckets):
        try:
            paths += [f"{app.delayed}/{bucket}/{n}"
                      for n in await session.children(f"{app.delayed}/{bucket}")]
        except errors.NoNodeError:
            continue

    async def read(path: str) -> bytes | None:
        try:
            return (await session.get(path))[0]
        except errors.NoNodeError:
            return None

    return await _any_matches(paths, read, task_id, lambda data: _id_of(data, ("task",)))


def _id_of(data: bytes, inside: tuple[str, ...]) -> str | None:
    """The ``id`` of a task's JSON document (under the keys ``inside``); ``None`` if the
    data is not one."""
    try:
        doc = records.decode(data, dict)
        for key in inside:
            doc = doc[key]
        found = doc.get("id")
    except (records.CorruptRecord, KeyError, TypeError, AttributeError):
        return None
    return found if isinstance(found, str) else None


async def _any_matches(names: Sequence[str], read: Callable[[str], Awaitable[bytes | None]],
                       task_id: str, id_of: Callable[[bytes], str | None]) -> bool:
    """Whether the data of one of ``names`` is task ``task_id``'s (reads pipelined in
    chunks of :data:`READS_IN_FLIGHT`, stopping after the chunk that found it)."""
    found: list[str] = []

    async def look(name: str) -> None:
        data = await read(name)
        if data is not None and id_of(data) == task_id:
            found.append(name)

    for start in range(0, len(names), READS_IN_FLIGHT):
        await gather(*[functools.partial(look, n) for n in names[start:start + READS_IN_FLIGHT]])
        if found:
            return True
    return False
