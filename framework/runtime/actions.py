"""Operations on one app's records: look up a result, requeue or discard a dead letter.

Used by :class:`~framework.runtime.Client` (and so ``framework dead``) and by the dashboard,
whose only requests on a viewer's behalf are these, one per click (the live view itself
never reads ZooKeeper per viewer).
"""

from __future__ import annotations

from typing import Any

import attrs

from framework import errors
from framework.logs import get_logger
from framework.primitives.queue import WorkQueue
from framework.primitives.queue.view import parse_item
from framework.runtime.app import App
from framework.runtime.result_index import mark_queued
from framework.runtime.tasks import Task, TaskResult
from framework.zk import Session, validate_name

log = get_logger("framework.runtime.actions")


class ActionError(errors.FrameworkError):
    """A request refused (unknown dead letter, bad key...): told to the user or viewer."""


@attrs.frozen
class DeadLetterName:
    """A dead letter's node name: ``<bucket>.<item node>.<deliveries>``."""

    name: str
    priority: int

    @classmethod
    def parse(cls, name: str) -> DeadLetterName:
        flat, _, attempts = name.rpartition(".")
        bucket, _, node = flat.partition(".")
        entry = parse_item(bucket, node) if attempts.isdigit() else None
        if entry is None or "/" in name:
            raise ActionError(f"not a dead letter's name: {name!r}")
        return cls(name, entry.priority)


async def lookup_result(session: Session, app: str, key: str) -> dict[str, Any] | None:
    """The result record of task id (or idempotency key) ``key``; ``None`` if there is none."""
    try:
        validate_name("task key", key)
        path = App(app).result_path(key)
    except errors.ConfigurationError as exc:
        raise ActionError(str(exc)) from None
    try:
        data, _stat = await session.get(path)
    except errors.NoNodeError:
        return None
    try:
        return attrs.asdict(TaskResult.decode(data))
    except (ValueError, TypeError):
        return {"raw": data.decode(errors="replace")}


async def requeue(session: Session, app: str, name: str) -> str:
    """Put dead letter ``name`` back in the queue (with its priority and a fresh count of
    deliveries), then delete the dead letter at the version read.

    At-least-once: the put comes first, so a crash in between leaves the dead letter in
    place (requeued twice if clicked again); two items of one task id never run at once and
    a task with a successful result is not run again (the runtime's marker and idempotency
    key).  Returns the new item's name."""
    parsed = DeadLetterName.parse(name)
    application = _app(app)
    path = f"{application.dead}/{parsed.name}"
    try:
        data, stat = await session.get(path)
    except errors.NoNodeError:
        raise ActionError(f"no dead letter {name!r} in {app!r} (already requeued?)") from None
    item = await WorkQueue(session, application.tasks).put(data, priority=parsed.priority)
    try:
        key = Task.decode(data).key
    except (ValueError, TypeError):
        key = None  # not a task: nothing of it to keep
    if key is not None:  # its key's record (a success skips it) stays while it is queued
        await mark_queued(session, application, [(key, item)])
    try:
        await session.delete(path, version=stat.version)
    except (errors.NoNodeError, errors.BadVersionError):
        pass  # someone else requeued or discarded it meanwhile
    log.info("dashboard.requeued", app=app, dead_letter=name, item=item)
    return item


async def discard(session: Session, app: str, name: str) -> None:
    """Delete dead letter ``name`` for good."""
    parsed = DeadLetterName.parse(name)
    try:
        await session.delete(f"{_app(app).dead}/{parsed.name}")
    except errors.NoNodeError:
        raise ActionError(f"no dead letter {name!r} in {app!r} (already gone?)") from None
    log.info("dashboard.discarded", app=app, dead_letter=name)


def _app(name: str) -> App:
    try:
        return App(name)
    except (errors.ConfigurationError, ValueError) as exc:
        raise ActionError(str(exc)) from None
