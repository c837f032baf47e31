"""Submitting one task: the one path behind ``MasterContext.submit``, ``Worker.submit``,
``Client.submit`` (and so ``BlockingClient.submit`` and ``framework submit``).

What a submit can say is one type, :class:`SubmitOptions` (``key``, ``time_limit``,
``priority``, ``countdown``/``eta``, ``expires``, ``soft_time_limit``, ``on_success``,
``on_failure``, ``queue``), validated once when made; every submit surface takes exactly these as
keyword arguments (``tests/test_submit_contract.py`` holds them to it).  ``key`` is the
task's id and idempotency key, the one spelling everywhere.

``submit(name, payload, options)`` checks ``name`` against the app's task types
(:class:`~framework.runtime.task_types.Catalog`: an unknown name is a
:class:`~framework.errors.ConfigurationError` naming the known ones), builds the task, and
queues it now, or at its time (``countdown=`` seconds, ``eta=`` an aware datetime or epoch
seconds: :mod:`framework.runtime.scheduling.delayed`).  ``priority`` defaults to the task
type's, and so does ``queue`` (the task goes into that queue,
:mod:`framework.runtime.queues`; the name is written into the task so a delayed move, a
requeue or a rerun keeps it).  Costs: one read of the catalog per submitter (again only for
a name it does not know), then the queue's put (one request) or the delayed node's create
(one request).

**Unrouted tasks.**  While no worker of the app has registered its types (the catalog is
empty), a submitter cannot know a type's queue.  A task submitted then without ``queue=``
goes to the default queue *marked unrouted*: the put's own multi also creates
``unrouted/<task id>`` (data: its type's name), so item and marker exist together or not at
all, at no extra request (the put is one multi instead of one create).  The app's duty holder
follows ``unrouted/`` and the catalog, and once the type is registered with a named queue it
moves the task there, once (:mod:`framework.runtime.scheduling.router`).  A routed submit
(the catalog lists the type, or ``queue=`` is given) pays nothing for this.  A
``submit_many`` while the catalog is empty puts its tasks one multi each (each with its
marker), not in batches.  A delayed task's queue is decided at its submit too: one submitted
while the catalog is empty is queued in ``default`` when due, unmarked.

A task over :data:`~framework.runtime.payloads.MAX_TASK_BYTES` as JSON is refused
(:class:`~framework.errors.DataTooLargeError`, saying the limit and the way out) unless the
submitter has a payload store: its payload is then stored there and the task carries the
reference (:mod:`framework.runtime.payloads`; one write to the store before the put).

``submit(..., check_existing=True)`` (the ``Client`` and ``framework submit``) first looks
whether the task key exists (:meth:`Submitter.existing`: one round trip of three reads) and
raises :class:`TaskExists` saying what exists, instead of queueing a task that would not
run: a success recorded, a task queued or running.  A key whose task failed for good (or
was revoked) is queued again (its record is replaced when it runs).  A master's
``submit_many(keys=...)`` never checks: submitting a job's keys again is how a new leader
resumes, silently.

``submit_many`` builds its tasks as :func:`~framework.runtime.tasks.new_task` would (the same
checks) and their items as :meth:`Task.encode` would (the same bytes), at a fraction of the
cost: each payload is encoded to JSON once, into a template made from a prototype task of
that type, and the generated ids (128 random bits in 32 hex digits, like ``uuid4().hex``)
come from one read of ``os.urandom``.  Then one ``put_many`` (pipelined, across buckets),
and for keys the ``pending/`` markers.
"""

from __future__ import annotations

import json
import os
import re
import time
from datetime import datetime
from typing import Any

import attrs
import trio

from framework import errors
from framework.primitives.queue import WorkQueue
from framework.runtime.app import App, check_name
from framework.runtime.payloads import PayloadStore, store_from, too_large
from framework.runtime.queues import DEFAULT_QUEUE, QueueSet, check_queue_name, mark_unrouted
from framework.runtime.results.result_index import mark_queued, read_mark, still_queued
from framework.runtime.scheduling.delayed import delay, due_time
from framework.runtime.task_types import Catalog, CatalogRecord, TypeInfo
from framework.runtime.tasks import Task, TaskResult, new_task
from framework.zk import Session, Transaction, gather

#: JSON as :func:`framework.records.encode` writes it (compact), with one encoder made once.
_JSON = json.JSONEncoder(separators=(",", ":"))
#: Stand-ins for the fields of a prototype task (none can be a value: a NUL starts them).
_MARKS = {"id": "\x00id", "payload": "\x00payload", "key": "\x00key"}


@attrs.frozen
class Existing:
    """What exists of a task key: ``state`` is ``succeeded``, ``failed`` or ``revoked``
    (its result ``record``), ``running`` or ``queued``."""

    key: str
    state: str
    record: TaskResult | None = None

    def describe(self) -> str:
        """One phrase: what exists (with the record's error, for a failure)."""
        record = self.record
        if record is None:
            return {"running": "is running now", "queued": "is queued"}[self.state]
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(record.finished_at))
        if self.state == "succeeded":
            return f"succeeded at {when} (worker {record.worker})"
        return f"{self.state} at {when} ({record.error or 'no error recorded'})"


class TaskExists(errors.FrameworkError):
    """A keyed submit found its key: a success recorded, or a task queued or running
    (``existing`` says which); nothing was queued."""

    def __init__(self, app: App, existing: Existing) -> None:
        self.existing = existing
        hint = (f"framework result {app.name} {existing.key}" if existing.record is not None
                else f"framework status {app.name}")
        super().__init__(f"task {existing.key!r} of {app.name!r} {existing.describe()}: not "
                         f"queued again ({hint})")


@attrs.frozen
class SubmitOptions:
    """What one submit can say besides its task type and payload: the one contract of
    ``Client.submit``, ``BlockingClient.submit``, ``MasterContext.submit``,
    ``Worker.submit`` and ``StubApp.submit`` (each takes these as keyword arguments, in
    this order, with these defaults, and builds one of these).

    ``key``: the task's id and idempotency key (its result record is ``results/<key>``;
    default: a new id).  ``time_limit``: seconds before its handler is cancelled.
    ``priority``: lower values are taken first (default: the task type's).
    ``countdown`` (seconds from now) or ``eta`` (epoch seconds or an aware datetime): when
    it is due (default: now).  ``expires``: seconds from its due time by which it must have
    started, else it is recorded ``expired`` and never run (default: the type's).
    ``soft_time_limit``: seconds before
    :class:`~framework.runtime.worker_parts.soft_limit.SoftTimeLimitExceeded` is raised in an
    ``async def`` handler.  ``on_success`` / ``on_failure``: task types queued with its result or
    final error (:mod:`framework.runtime.workflows.callbacks`).  ``queue``: the named queue it goes
    into (:mod:`framework.runtime.queues`).  ``None`` leaves each to the task type's
    (``@task(...)``).

    Validated once, when made: :class:`~framework.errors.ConfigurationError` (one line,
    naming the option) for a key, callback or queue that is not a valid name, a limit that is not
    positive, a priority that is not an int below 10**9, both ``countdown`` and ``eta``, or
    an ``eta`` that is not a time.  What needs the app (an unknown task type, a key that
    exists) is checked by the submit."""

    key: str | None = None
    time_limit: float | None = None
    priority: int | None = None
    countdown: float | None = None
    eta: float | datetime | None = None
    expires: float | None = None
    soft_time_limit: float | None = None
    on_success: str | None = None
    on_failure: str | None = None
    queue: str | None = None

    def __attrs_post_init__(self) -> None:
        if self.key is not None:
            check_name("task key", self.key)
        if self.queue is not None:
            check_queue_name(self.queue)
        for option in ("on_success", "on_failure"):
            callback = getattr(self, option)
            if callback is not None:
                check_name(f"{option} task name", callback)
        for option in ("time_limit", "expires", "soft_time_limit"):
            _check_positive(option, getattr(self, option))
        if self.priority is not None:
            WorkQueue._check_priority(self.priority)
        due_time(self.countdown, self.eta)  # raises for a bad countdown or eta

    def due(self) -> float | None:
        """When the task is due (seconds since the epoch), ``None`` for now."""
        return due_time(self.countdown, self.eta)


def _check_positive(option: str, value: object) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise errors.ConfigurationError(f"{option} must be positive seconds, got {value!r}")


class Submitter:
    """Submits tasks of ``app`` into their queues: ``queue`` (the caller's default queue:
    fenced for a master) and its :func:`~framework.runtime.queues.sibling` for each named
    queue."""

    def __init__(self, session: Session, app: App, queue: WorkQueue, *,
                 payload_store: PayloadStore | str | None = None) -> None:
        self.session = session
        self.app = app
        self.queue = queue
        self.queues = QueueSet(app, queue)
        self.catalog = Catalog(session, app)
        self._types: CatalogRecord | None = None  # the catalog as last read
        self._unrouted_made = False  # unrouted/ exists (made at the first unrouted put)
        self._encoders: dict[str, TaskEncoder] = {}
        #: where payloads over the queue's limit go (None: they are refused)
        self.payload_store = store_from(payload_store)

    async def existing(self, key: str) -> Existing | None:
        """What exists of task key ``key`` (``None``: nothing): a success recorded, else its
        ``running/`` marker (the task id being the key), else a queued item named by its
        ``pending/`` marker, else a failure (or revocation) recorded.  Three reads sent
        together (and one ``exists`` per item the marker names).  A delayed task is not
        seen until it is queued."""
        found: dict[str, Any] = {}

        async def record() -> None:
            try:
                found["record"] = TaskResult.decode((await self.session.get(
                    self.app.result_path(key)))[0])
            except errors.NoNodeError:
                pass

        async def running() -> None:
            found["running"] = await self.session.exists(
                f"{self.app.running}/{key}") is not None

        async def marker() -> None:
            path = self.app.pending_path(key)
            try:
                found["marked"] = read_mark((await self.session.get(path))[0], path).items
            except errors.NoNodeError:
                pass

        await gather(record, running, marker)
        result: TaskResult | None = found.get("record")
        if result is not None and result.ok:
            return Existing(key, "succeeded", result)
        # a failure recorded may be running or queued again (retried, requeued)
        if found["running"]:
            return Existing(key, "running")
        if found.get("marked") and (
                await still_queued(self.session, self.app, found["marked"])
                or await self.session.exists(self.app.unrouted_path(key)) is not None):
            # (its unrouted/ marker: being moved into its queue, the pending/ marker not
            # pointed at its new item yet - see framework.runtime.scheduling.router)
            return Existing(key, "queued")
        if result is not None:
            return Existing(key, result.outcome.value, result)
        return None

    async def _type_of(self, name: str) -> TypeInfo | None:
        """``name``'s catalog entry (the catalog read once, again only for a name it does not
        list), ``None`` while the catalog lists no type at all (its tasks are unrouted);
        :class:`~framework.errors.ConfigurationError` naming the known types if it lists
        others and not this one (:meth:`Catalog.check`'s)."""
        check_name("task name", name)
        for fresh in (False, True):
            if self._types is None or fresh:
                self._types = await self.catalog.read()
            info = self._types.types.get(name)
            if info is not None:
                return info
            if not self._types.types:
                return None
        return await self.catalog.check(name)  # raises, or finds it registered since

    async def _put_unrouted(self, task: Task, data: bytes, priority: int) -> str:
        """Put ``task`` (its item ``data``) into the default queue with its
        ``unrouted/<task id>`` marker in the same multi (see the module doc); the item's
        name.  A marker of the id that exists already (a keyed task submitted twice) is
        set in that multi instead, so it covers this item too."""
        if not self._unrouted_made:
            await self.session.ensure_path(self.app.unrouted)
            self._unrouted_made = True

        def create(txn: Transaction) -> None:
            mark_unrouted(txn, self.app, task)

        def touch(txn: Transaction) -> None:
            mark_unrouted(txn, self.app, task, exists=True)

        while True:
            try:
                return await self.queue.put(data, priority=priority, also=create)
            except errors.TransactionFailedError:
                pass  # the marker exists
            try:
                return await self.queue.put(data, priority=priority, also=touch)
            except errors.TransactionFailedError:
                continue  # moved and deleted meanwhile: create it again

    async def _stored(self, task: Task) -> tuple[Task, bytes]:
        """The task as queued: itself, or (too large, with a store) its payload stored and
        a reference in its place; :class:`DataTooLargeError` if too large without one."""
        data = task.encode()
        if len(data) <= self.queue.max_item_bytes:
            return task, data
        if self.payload_store is None:
            raise too_large(len(data), self.queue.max_item_bytes)
        payload = data_of(task)
        ref = await trio.to_thread.run_sync(self.payload_store.put, payload)
        task = attrs.evolve(task, payload=None, payload_ref=ref)
        return task, task.encode()

    async def submit(self, name: str, payload: Any = None,
                     options: SubmitOptions = SubmitOptions(), *,
                     check_existing: bool = False) -> Task:
        """Queue task ``name`` with ``options`` (see the module doc and
        :class:`SubmitOptions`); returns it with its id.  ``check_existing``:
        :class:`TaskExists` if its key exists (see the module doc).  ``expires`` counts
        from its due time (now, or its countdown/eta)."""
        due = options.due()
        known = await self._type_of(name)
        unrouted = known is None and options.queue is None
        info = known or TypeInfo()
        expires = info.expires if options.expires is None else options.expires
        _check_positive("expires", expires)
        key = options.key
        task = new_task(payload, name=name, task_id=key, idempotency_key=key,
                        time_limit=options.time_limit,
                        expires=None if expires is None else (due or time.time()) + expires,
                        soft_time_limit=options.soft_time_limit,
                        on_success=options.on_success, on_failure=options.on_failure,
                        queue=options.queue or info.queue)
        level = info.priority if options.priority is None else options.priority
        WorkQueue._check_priority(level)
        if check_existing and key is not None:
            found = await self.existing(key)
            if found is not None and found.state not in ("failed", "revoked", "expired"):
                raise TaskExists(self.app, found)
            if found is not None and found.state == "revoked":
                # submitted again on purpose: a revoke left behind must not stop it
                await self.session.delete(f"{self.app.revoked}/{key}", missing_ok=True)
        task, data = await self._stored(task)
        explicit = key is not None
        if due is not None and due > time.time():
            await delay(self.session, self.app, task, level, due, explicit=explicit,
                        unrouted=unrouted)
        elif unrouted:
            item = await self._put_unrouted(task, data, level)
            if explicit:
                await mark_queued(self.session, self.app, [(task.key, item)])
        else:
            item = await self.queues.get(task.queue).put(data, priority=level)
            if explicit:  # another task of this key may come: its record must wait
                await mark_queued(self.session, self.app,
                                  [(task.key, self.app.item_ref(task.queue, item))])
        return task

    async def submit_many(self, name: str, payloads: list[Any], *,
                          priority: int | None = None,
                          keys: list[str] | None = None,
                          queue: str | None = None) -> list[Task]:
        """Queue many tasks of type ``name`` in one pipelined burst (see
        ``MasterContext.submit_many``), into ``queue`` (default: the type's)."""
        if keys is not None and len(keys) != len(payloads):
            raise errors.ConfigurationError(
                f"submit_many: {len(keys)} keys for {len(payloads)} payloads"
            )
        known = await self._type_of(name)
        info = known or TypeInfo()
        level = info.priority if priority is None else priority
        target = check_queue_name(queue or info.queue)
        stamp = None if target == DEFAULT_QUEUE else target
        encoder = self._encoders.get(f"{name}@{target}") or self._encoders.setdefault(
            f"{name}@{target}", TaskEncoder(name, stamp))
        tasks: list[Task] = []
        data: list[bytes] = []
        for task, item in encoder.build(payloads, keys):
            if len(item) > self.queue.max_item_bytes:
                task, item = await self._stored(task)
            tasks.append(task)
            data.append(item)
        if known is None and queue is None:  # unrouted: one multi each, with its marker
            items = [await self._put_unrouted(t, d, level)
                     for t, d in zip(tasks, data, strict=True)]
        else:
            items = await self.queues.get(target).put_many(data, priority=level)
        if keys is not None:  # see mark_queued
            await mark_queued(self.session, self.app,
                              [(t.key, self.app.item_ref(stamp, n))
                               for t, n in zip(tasks, items, strict=True)])
        return tasks


class TaskEncoder:
    """Builds tasks of type ``name`` and their queue items for ``submit_many``: the tasks
    :func:`new_task` would build (the same checks), the bytes :meth:`Task.encode` would
    write (a template cut from the encoding of a prototype task, so a field added to
    :class:`Task` is carried with its default), with one JSON encoding per payload."""

    def __init__(self, name: str, queue: str | None = None) -> None:
        self.name = check_name("task name", name)
        self.queue = queue  # the named queue written into its tasks (None: the default)
        proto = Task(_MARKS["id"], _MARKS["payload"], _MARKS["key"], None, name,
                     queue=queue).encode()
        field_of = {_JSON.encode(mark): field for field, mark in _MARKS.items()}
        pieces = re.split("(" + "|".join(map(re.escape, field_of)) + ")", proto.decode())
        if sorted(field_of[p] for p in pieces[1::2]) != sorted(_MARKS):
            raise AssertionError(f"a task's encoding carries its fields once each: {proto!r}")
        #: the prototype's text, ``%`` escaped, with ``%(field)s`` for each field
        self._template = "".join(
            piece.replace("%", "%%") if n % 2 == 0 else f"%({field_of[piece]})s"
            for n, piece in enumerate(pieces))

    def encode(self, id_json: str, payload_json: str, key_json: str = "null") -> bytes:
        """The item of a task, its id, payload and key already as JSON."""
        return (self._template % {
            "id": id_json, "payload": payload_json, "key": key_json}).encode()

    def build(self, payloads: list[Any], keys: list[str] | None
              ) -> list[tuple[Task, bytes]]:
        """(task, item) for each payload: ids generated, or ``keys`` as ids and idempotency
        keys; :class:`~framework.errors.ConfigurationError` for a payload that is not JSON
        or a key that is not a valid name."""
        if keys is None:
            raw = os.urandom(16 * len(payloads)).hex()
            ids = [raw[i:i + 32] for i in range(0, len(raw), 32)]
        else:
            ids = [check_name("task id", k) for k in keys]
        built = []
        for task_id, payload in zip(ids, payloads, strict=True):
            try:
                body = _JSON.encode(payload)
            except (TypeError, ValueError) as exc:
                raise errors.ConfigurationError(
                    f"task payload must be JSON-serialisable: {exc}") from None
            if keys is None:  # 32 hex digits: their JSON is themselves in quotes
                built.append((Task(task_id, payload, None, None, self.name, queue=self.queue),
                              self.encode(f'"{task_id}"', body)))
            else:
                key_json = _JSON.encode(task_id)
                built.append((Task(task_id, payload, task_id, None, self.name,
                                   queue=self.queue),
                              self.encode(key_json, body, key_json)))
        return built


def data_of(task: Task) -> bytes:
    """A task's payload as the JSON bytes a store keeps."""
    return json.dumps(task.payload, separators=(",", ":")).encode()
