"""Tasks and their records, as small JSON documents (payloads belong elsewhere if large)."""

from __future__ import annotations

import enum
import json
import time
import uuid
from typing import Any

import attrs

from framework import errors, records
from framework.errors import ConfigurationError, PermanentFailure
from framework.runtime.app import DEFAULT_QUEUE, check_name, check_queue_name
from framework.zk import MAX_DATA_BYTES, Session, wait_created

#: The task type of a worker's ``handle`` method (and of a task that names none).
DEFAULT_TASK = "handle"

#: How many failure records the ``failures/`` ring keeps (each worker deletes the record
#: this many before its own; the master's retention trims what a crash left behind).
FAILURE_RING = 200

@attrs.frozen
class Task:
    """One unit of work.  ``payload`` is any JSON value.

    ``idempotency_key`` (default: the id) names the result record: a task whose key already
    has a successful result is acknowledged without running again, so a redelivery after a
    crash between "result written" and "item deleted" does no work twice.
    """

    id: str
    payload: Any = None
    idempotency_key: str | None = attrs.field(default=None, metadata=records.wire("key"))
    time_limit: float | None = None
    name: str = DEFAULT_TASK  # its task type (see framework.runtime.task_types)
    attempts: int = attrs.field(default=0, metadata=records.local())  # from the queue item
    #: the stored payload's reference, when it is kept off ZooKeeper (payload is then None;
    #: see framework.runtime.payloads): the worker reads it back before the handler runs
    payload_ref: str | None = attrs.field(default=None, metadata=records.wire("ref"))
    #: not started by then (seconds since the epoch): recorded ``expired``, never run
    expires: float | None = attrs.field(default=None, metadata=records.wire("exp"))
    #: seconds after which ``SoftTimeLimitExceeded`` is raised inside an async handler
    soft_time_limit: float | None = attrs.field(default=None, metadata=records.wire("soft"))
    #: task types queued with its result (``on_success``) or its final error (``on_failure``)
    on_success: str | None = attrs.field(default=None, metadata=records.wire("ok_cb"))
    on_failure: str | None = attrs.field(default=None, metadata=records.wire("err_cb"))
    #: the named queue it is put into (``None``: the default queue, ``tasks/``); a dead
    #: letter requeued, a delayed task moved or a job rerun goes back into it
    queue: str | None = attrs.field(default=None, metadata=records.wire("q"))

    @property
    def key(self) -> str:
        return self.idempotency_key or self.id

    @property
    def queue_name(self) -> str:
        """The name of its queue (``default`` for the default queue)."""
        return self.queue or DEFAULT_QUEUE

    def encode(self) -> bytes:
        return records.encode(self)

    @classmethod
    def decode(cls, data: bytes, attempts: int = 0) -> Task:
        """The task in a queue item's data; :class:`~framework.records.CorruptRecord` if it
        is not one."""
        return attrs.evolve(records.decode(data, cls), attempts=attempts)


def new_task(
    payload: Any,
    *,
    name: str = DEFAULT_TASK,
    task_id: str | None = None,
    idempotency_key: str | None = None,
    time_limit: float | None = None,
    expires: float | None = None,
    soft_time_limit: float | None = None,
    on_success: str | None = None,
    on_failure: str | None = None,
    queue: str | None = None,
) -> Task:
    """Build a task, validating what a user can get wrong (``expires``: seconds since the
    epoch, see :class:`Task`; ``queue``: a queue name, ``default`` kept as ``None``)."""
    check_name("task name", name)
    task_id = check_name("task id", task_id) if task_id else uuid.uuid4().hex
    if idempotency_key is not None:
        check_name("idempotency key", idempotency_key)
    if time_limit is not None and time_limit <= 0:
        raise ConfigurationError("time_limit must be positive")
    if soft_time_limit is not None and not soft_time_limit > 0:
        raise ConfigurationError(f"soft_time_limit must be positive, got {soft_time_limit!r}")
    for option, callback in (("on_success", on_success), ("on_failure", on_failure)):
        if callback is not None:
            check_name(f"{option} task name", callback)
    try:
        json.dumps(payload)
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(f"task payload must be JSON-serialisable: {exc}") from None
    if queue is not None:
        queue = None if check_queue_name(queue) == DEFAULT_QUEUE else queue
    return Task(task_id, payload, idempotency_key, time_limit, name, expires=expires,
                soft_time_limit=soft_time_limit, on_success=on_success, on_failure=on_failure,
                queue=queue)


class Outcome(enum.Enum):
    """How a task ended."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"    # for good: its attempts used up, or a permanent failure
    REVOKED = "revoked"  # revoked (``framework revoke``) before or while it ran
    EXPIRED = "expired"  # not started before its ``expires`` time: never run


def _outcome_of(result: TaskResult) -> Outcome:
    return Outcome.SUCCEEDED if result.ok else Outcome.FAILED


@attrs.frozen
class TaskResult:
    """What happened to a task: written once per successful run (or final failure, or
    revocation: ``outcome``)."""

    task_id: str
    ok: bool
    worker: str
    attempts: int
    result: Any = None
    error: str | None = None
    started_at: float = 0.0
    finished_at: float = attrs.field(factory=time.time)
    key: str | None = None  # the task's idempotency key (its id when it has none)
    traceback: str | None = None  # a failure's traceback (its last MAX_TRACEBACK_CHARS)
    outcome: Outcome = attrs.field(default=attrs.Factory(_outcome_of, takes_self=True))
    name: str | None = None  # the task's type (None in records written before it was kept)

    def encode(self) -> bytes:
        """The record as JSON; :class:`PermanentFailure` if the result is not JSON or the
        record would not fit in one znode (neither gets better by running the task again)."""
        try:
            data = records.encode(self)
        except (TypeError, ValueError) as exc:
            raise PermanentFailure(
                f"the result of task {self.task_id} is not JSON-serialisable ({exc}); "
                "return JSON values (dict, list, str, int, float, bool, None)"
            ) from None
        if len(data) > MAX_DATA_BYTES:
            raise PermanentFailure(
                f"the result of task {self.task_id} is {len(data):,} bytes as JSON, over the "
                f"{MAX_DATA_BYTES:,}-byte limit of a ZooKeeper node; store large results "
                "elsewhere and return a reference to them"
            )
        return data

    @classmethod
    def decode(cls, data: bytes) -> TaskResult:
        """:class:`~framework.records.CorruptRecord` if ``data`` is not a result record."""
        return records.decode(data, cls)


async def read_result(session: Session, path: str, *, wait: bool = False) -> TaskResult | None:
    """The result record at ``path``; ``None`` if there is none, or with ``wait`` the record
    once it is written (an ``exists`` watch: it is read the moment the worker's
    acknowledging transaction commits, one read after the watch fires, no polling)."""
    while True:
        try:
            data, _stat = await session.get(path)
            return TaskResult.decode(data)
        except errors.NoNodeError:
            if not wait:
                return None
        await wait_created(session, path)  # then read it (unless deleted again)
