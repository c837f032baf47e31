"""``App``: the znode layout of one master/worker application.

Everything an application knows lives under ``/apps/<name>`` so that a new master resumes
from ZooKeeper, never from memory::

    masters/        election of the active master (standbys wait in line)
    rendezvous      the active master's address (ephemeral, filled in by the leader)
    workers/        group membership: one ephemeral node per live worker, JSON status
    tasks/          the work queue (pull mode): the queue named ``default``
    queues/<name>/  the named queues (issue #39), one work queue each, made at first use
    dead/           tasks whose handler kept failing (dead letters)
    running/        one ephemeral node per task being handled (progress in its data)
    results/hh/     one record per finished task, bucketed by hash of its key
    results-log/d/s/  the records' time index: an empty node per record created, in
                    10-second slots ``s`` of days ``d`` (retention deletes oldest first)
    pending/hh/     one node per task key submitted explicitly, naming its queued items
                    (a record is kept while one is still queued)
    failures/       recent task failures (a bounded ring of sequential nodes)
    types           the app's task types (the catalog submitters check names against)
    delayed/m/      tasks to queue at a later time, in minute buckets ``m``
    revoked/        one node per revoked task id (until a worker has dealt with it)
    schedules/      one record per periodic schedule: its last fired slot (fenced)
    shards/         desired long-lived shards (push mode), data = shard spec
    assignments/w/  shards assigned to worker ``w`` by the master (fenced writes)
    plan/<shard>    replicated push mode: the workers planned for the shard (JSON list)
    deployed/<s>/w  replicated push mode: EPHEMERAL, worker ``w`` serves shard ``s``
    refused/<s>/w   replicated push mode: worker ``w`` cannot serve shard ``s`` (persistent)
    config/         ready-znode configuration
    done            the job is finished: written (fenced) when ``lead`` returns
    history/g-<n>   the done records of earlier generations (``framework rerun``)
    cancel          the job is cancelled (``framework cancel``): masters and workers drain
"""

from __future__ import annotations

import functools
import hashlib
import os
import socket
from collections.abc import Iterable

import attrs

from framework import errors
from framework.zk import Session, gather, validate_name


def check_name(kind: str, value: str) -> str:
    """Names become znode names: letters, digits, ``_.-``; a clear error otherwise."""
    return validate_name(kind, value)


def app_of(app: App | str | None, default: str | None, owner: type) -> App:
    """The :class:`App` a master or service of class ``owner`` works for: ``app``, else
    the class's ``app_name`` (``default``), else a one-line error."""
    app = app if app is not None else default
    if app is None:
        raise errors.ConfigurationError(
            f"{owner.__name__} needs an application: set app_name or pass --app")
    return app if isinstance(app, App) else App(app)


def process_name(kind: str, name: str | None) -> str:
    """A process's name in its group: ``name``, else ``<host>-<pid>`` (checked)."""
    return check_name(f"{kind} name", name or f"{socket.gethostname()}-{os.getpid()}")


#: The queue a task goes to unless its type or its submit names another: ``tasks/``.
DEFAULT_QUEUE = "default"


def check_queue_name(value: object) -> str:
    """A queue's name: a name as :func:`check_name` takes (it becomes a znode name under
    ``queues/``); a clear one-line :class:`~framework.errors.ConfigurationError` otherwise."""
    if not isinstance(value, str):
        raise errors.ConfigurationError(f"a queue name is a str, got {value!r}")
    return check_name("queue name", value)


def queue_list(value: str | Iterable[str]) -> tuple[str, ...]:
    """Queue names from ``"a,b"`` or an iterable of names: checked, in the order given,
    each once; :class:`~framework.errors.ConfigurationError` for a bad or empty list."""
    if isinstance(value, str):
        names: list[object] = [n.strip() for n in value.split(",")]
    elif isinstance(value, Iterable):
        names = list(value)
    else:
        raise errors.ConfigurationError(
            f"queues must be queue names (a list, or a str like 'default,gpu'), got {value!r}")
    if not names or any(n == "" for n in names):
        raise errors.ConfigurationError(
            f"queues must name at least one queue, comma-separated (e.g. 'default,gpu'), got "
            f"{value!r}")
    return tuple(dict.fromkeys(check_queue_name(n) for n in names))


def key_bucket(key: str) -> str:
    """The bucket (``00`` .. ``ff``) of a task key under ``results/`` and ``pending/``."""
    return hashlib.blake2s(key.encode(), digest_size=1).hexdigest()


@attrs.frozen
class App:
    """The paths of application ``name`` under ``root``."""

    name: str = attrs.field(validator=lambda _i, _a, v: check_name("application name", v))
    root: str = "/apps"

    @property
    def base(self) -> str:
        return f"{self.root}/{self.name}"

    masters = property(lambda self: f"{self.base}/masters")
    rendezvous = property(lambda self: f"{self.base}/rendezvous")
    workers = property(lambda self: f"{self.base}/workers")
    tasks = property(lambda self: f"{self.base}/tasks")
    dead = property(lambda self: f"{self.base}/dead")
    running = property(lambda self: f"{self.base}/running")
    results = property(lambda self: f"{self.base}/results")
    failures = property(lambda self: f"{self.base}/failures")
    results_log = property(lambda self: f"{self.base}/results-log")
    pending = property(lambda self: f"{self.base}/pending")
    shards = property(lambda self: f"{self.base}/shards")
    assignments = property(lambda self: f"{self.base}/assignments")
    plan = property(lambda self: f"{self.base}/plan")
    deployed = property(lambda self: f"{self.base}/deployed")
    refused = property(lambda self: f"{self.base}/refused")
    config = property(lambda self: f"{self.base}/config")
    done = property(lambda self: f"{self.base}/done")
    cancel = property(lambda self: f"{self.base}/cancel")
    history = property(lambda self: f"{self.base}/history")
    types = property(lambda self: f"{self.base}/types")
    delayed = property(lambda self: f"{self.base}/delayed")
    revoked = property(lambda self: f"{self.base}/revoked")
    schedules = property(lambda self: f"{self.base}/schedules")
    queues = property(lambda self: f"{self.base}/queues")
    #: tasks queued in the default queue before their type's queue was known
    #: (:mod:`framework.runtime.scheduling.router`)
    unrouted = property(lambda self: f"{self.base}/unrouted")

    def queue_path(self, queue: str | None = None) -> str:
        """The work queue named ``queue``: ``tasks/`` for :data:`DEFAULT_QUEUE` (and
        ``None``), else ``queues/<queue>`` (the name checked)."""
        if queue is None or queue == DEFAULT_QUEUE:
            return self.tasks
        return f"{self.queues}/{check_queue_name(queue)}"

    def item_ref(self, queue: str | None, item: str) -> str:
        """How a ``pending/`` marker names queue item ``item`` (``<bucket>/<node>``) of
        ``queue``: the item's name in the default queue (as before named queues), else
        ``<queue>:<item>``."""
        return item if queue is None or queue == DEFAULT_QUEUE else f"{queue}:{item}"

    def item_path(self, ref: str) -> str:
        """The znode of the queue item a marker names (:meth:`item_ref`)."""
        queue, _, item = ref.rpartition(":")
        return f"{self.queue_path(queue or None)}/items/{item}"

    def unrouted_path(self, task_id: str) -> str:
        """The marker of task ``task_id`` queued before its type's queue was known."""
        return f"{self.unrouted}/{task_id}"

    def result_path(self, key: str) -> str:
        """Where the result record of task (or idempotency) ``key`` lives."""
        return f"{self.results}/{key_bucket(key)}/{key}"

    def pending_path(self, key: str) -> str:
        """The node naming the queued items of task key ``key`` (see
        :mod:`framework.runtime.results.result_index`)."""
        return f"{self.pending}/{key_bucket(key)}/{key}"

    @property
    def result_buckets(self) -> list[str]:
        """The 256 bucket names under ``results/`` (``00`` .. ``ff``)."""
        return [f"{n:02x}" for n in range(256)]

    def assignment_dir(self, worker: str) -> str:
        return f"{self.assignments}/{worker}"

    def plan_path(self, shard: str) -> str:
        """The replicated plan of ``shard``: JSON list of its workers."""
        return f"{self.plan}/{shard}"

    def deployed_dir(self, shard: str) -> str:
        """The serving records of ``shard``: one ephemeral child per serving worker."""
        return f"{self.deployed}/{shard}"

    def refused_dir(self, shard: str) -> str:
        """The workers that refused ``shard`` (``serve_shard`` raised PermanentFailure)."""
        return f"{self.refused}/{shard}"


async def ensure_layout(session: Session, app: App, *paths: str) -> None:
    """Create ``paths`` (an app's directories) if missing."""
    for path in paths:
        await session.ensure_path(path)


async def ensure_result_buckets(session: Session, app: App) -> None:
    """Create every result bucket that is missing, and every ``pending/`` bucket (two
    listings once they all exist).  A worker that takes tasks calls it when it starts:
    with the buckets in place, a task's claim can probe that it has no result record yet
    and its result is written in the same transaction as its acknowledgement, where a
    missing bucket would refuse those and cost the slower paths (record read after the
    claim; result, bucket, result again, ack alone); retention's delete multis check the
    queued markers under ``pending/`` (see :mod:`framework.runtime.results.result_index`).
    Apps that record no results (push mode) never get the 2 x 256 nodes."""
    for parent in (app.results, app.pending):
        await ensure_buckets(session, parent, app.result_buckets)


async def ensure_buckets(session: Session, parent: str, buckets: list[str]) -> None:
    """Create ``parent`` and those of its children ``buckets`` that are missing (one
    listing, then the creates sent together)."""
    await session.ensure_path(parent)
    present = set(await session.children(parent))

    async def create(bucket: str) -> None:
        try:
            await session.create(f"{parent}/{bucket}")
        except errors.NodeExistsError:
            pass

    await gather(*[functools.partial(create, b) for b in buckets if b not in present])
