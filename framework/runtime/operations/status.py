"""What ``framework status APP`` and ``framework apps`` show: one look at an application in
ZooKeeper (and, with :class:`Watches`, the watches that say when to look again).

What the counts mean (each one thing):

- **queue depth**: items in the task queues, waiting or being handled (claimed, not acked):
  in all, and per queue (``default`` and each named queue);
- **running**: tasks a worker is handling now (``running/`` markers), with their progress;
- **results**: result records: tasks finished, successfully or failed for good;
- **dead letters**: tasks given up (failed ``max_attempts`` times, or permanently) and not
  requeued or discarded since;
- a worker's **done**: tasks that process finished successfully since it started; its
  **failed**: failed attempts of that process since it started (a retried task counts once
  per failed attempt);
- **types with no worker**: task types no running worker has now - of the app's catalog,
  and of tasks a worker passed over (a name never registered) - whose tasks wait in the
  queue until a worker with the type starts (workers take only their own types);
- **queues no worker serves**: queues that hold tasks, or that a task type of the catalog
  routes to, which no running worker serves now (``Worker.queues``, ``framework run -Q``):
  their tasks wait until one does.
"""

from __future__ import annotations

import enum
import functools
import json
from typing import Any, Callable, TypeVar

import attrs
import trio

from framework import errors, records
from framework.primitives import Election
from framework.primitives.queue import queue_counts
from framework.runtime.app import DEFAULT_QUEUE, App
from framework.runtime.records import (
    CancelRecord,
    JobDone,
    MasterIdentity,
    MemberState,
    MemberStatus,
    PastRun,
    RunningRecord,
    decode_or_none,
)
from framework.runtime.task_types import Catalog
from framework.runtime.tasks import TaskResult
from framework.zk import Session, gather

T = TypeVar("T")


class Watches:
    """Watch callbacks, one per path and kind, that all set :attr:`changed`.

    The same callback object is handed out for a path every time: the connection keeps a path's
    callbacks in a set, so re-arming a watch on every look never piles them up.  After
    :meth:`reset`, a new event is set by the next change of anything watched."""

    def __init__(self) -> None:
        self.changed = trio.Event()
        self._callbacks: dict[str, Callable[..., None]] = {}

    def __call__(self, path: str) -> Callable[..., None]:
        callback = self._callbacks.get(path)
        if callback is None:
            def callback(*_args: Any) -> None:
                self.changed.set()
            self._callbacks[path] = callback
        return callback

    def reset(self) -> None:
        self.changed = trio.Event()


class AppState(enum.StrEnum):
    """An application's state, as ``framework status`` and ``framework apps`` show it."""

    CANCELLED = "cancelled"
    DONE = "done"
    ACTIVE = "active"  # a master leads
    NO_LEADER = "no leader"

    @classmethod
    def of(cls, *, cancelled: bool, done: bool, led: bool) -> AppState:
        if cancelled:
            return cls.CANCELLED
        if done:
            return cls.DONE
        return cls.ACTIVE if led else cls.NO_LEADER


@attrs.frozen
class Contender:
    """A master in the election line: who it is (its :class:`MasterIdentity`) and the
    fencing token its term would carry."""

    name: str
    address: str | None
    pid: int
    host: str
    token: int

    @classmethod
    def of(cls, identifier: bytes, token: int, path: str) -> Contender:
        who = decode_or_none(identifier, MasterIdentity, path=path) or MasterIdentity()
        return cls(who.name or "-", who.address, who.pid, who.host, token)


@attrs.frozen
class AppStatus:
    app: str
    exists: bool
    leader: Contender | None
    standbys: list[Contender]
    workers: dict[str, MemberStatus]
    queue_depth: int
    running: dict[str, RunningRecord]
    assignments: dict[str, str]
    failures: list[TaskResult]
    dead_letters: int
    results: int
    done: JobDone | None = None  # the job-done record (``lead`` returned)
    cancelled: CancelRecord | None = None  # the cancel record (``framework cancel``)
    past_runs: list[PastRun] = attrs.Factory(list)  # earlier generations (``framework rerun``)
    #: the catalog's task types no running worker has (their tasks wait in the queue)
    types_without_worker: list[str] = attrs.Factory(list)
    #: each worker's part in the app's duties (worker-only deployments,
    #: :mod:`~framework.runtime.worker_parts.duties`): off, standby, held or deferred (a
    #: master leads); workers that publish none are left out
    duties: dict[str, str] = attrs.Factory(dict)
    #: the depth of each queue (``default`` first, then the named queues)
    queues: dict[str, int] = attrs.Factory(dict)
    #: queues holding tasks or routed to by a catalog type that no running worker serves
    queues_without_worker: list[str] = attrs.Factory(list)

    @property
    def duty_holder(self) -> str | None:
        """The worker holding the duties (``held`` or ``deferred``), if any."""
        return next((name for name, state in sorted(self.duties.items())
                     if state in ("held", "deferred")), None)

    @property
    def state(self) -> AppState:
        return AppState.of(cancelled=self.cancelled is not None, done=self.done is not None,
                           led=self.leader is not None)

    @property
    def generation(self) -> int:
        """The job's generation now: 1, plus one per ``framework rerun``."""
        return len(self.past_runs) + 1

    def to_json(self, *, indent: int | None = 2) -> str:
        return json.dumps(records.unstructure(self) | {"state": self.state,
                                                       "generation": self.generation},
                          indent=indent, default=str)


@attrs.frozen
class AppSummary:
    """One row of ``framework apps``."""

    name: str
    leader: str | None
    masters: int
    workers: int
    queue_depth: int
    done: bool
    cancelled: bool
    generation: int = 1  # 1, plus one per ``framework rerun``

    @property
    def state(self) -> AppState:
        return AppState.of(cancelled=self.cancelled, done=self.done, led=self.leader is not None)


def _arm(watches: Watches | None, path: str) -> Callable[..., None] | None:
    return watches(path) if watches is not None else None


async def _children(session: Session, path: str, watches: Watches | None = None) -> list[str]:
    try:
        return sorted(await session.children(path, watch=_arm(watches, path)))
    except errors.NoNodeError:
        if watches is not None and await session.exists(path, watch=watches(path)):
            watches.changed.set()  # created meanwhile: look again
        return []


async def _data(session: Session, path: str, cls: type[T],
                watches: Watches | None = None) -> T | None:
    """The ``cls`` record at ``path``: ``None`` if there is no node, or if it holds no
    readable record and ``cls`` has no default (a record of defaults if it has)."""
    try:
        data = (await session.get(path, watch=_arm(watches, path)))[0]
    except errors.NoNodeError:
        return None
    found = decode_or_none(data, cls, path=path)
    if found is None and all(f.default is not attrs.NOTHING for f in attrs.fields(cls)):
        return cls()
    return found


async def _record(session: Session, path: str, cls: type[T],
                  watches: Watches | None = None) -> T | None:
    """The record at a node that may not exist yet (watched for its creation too)."""
    if await session.exists(path, watch=_arm(watches, path)) is None:
        return None
    return await _data(session, path, cls, watches)


async def _docs(session: Session, parent: str, names: list[str], cls: type[T],
                watches: Watches | None = None) -> dict[str, T]:
    """The ``cls`` records of ``parent``'s children ``names`` (read concurrently)."""
    found: dict[str, T] = {}

    async def read(name: str) -> None:
        doc = await _data(session, f"{parent}/{name}", cls, watches)
        if doc is not None:
            found[name] = doc

    await gather(*[functools.partial(read, n) for n in names])
    return {name: found[name] for name in names if name in found}


@attrs.frozen
class _TakesTypes:
    """The part of a worker's status document about task types: those it takes, and those
    of tasks it passed over (not its own)."""

    state: MemberState = MemberState.UNKNOWN
    types: tuple[str, ...] = ()
    passed_types: tuple[str, ...] = ()


@attrs.frozen
class _ServesQueues:
    """The part of a worker's status document about queues (a worker written before named
    queues serves the default one)."""

    state: MemberState = MemberState.UNKNOWN
    types: tuple[str, ...] = ()
    queues: tuple[str, ...] = (DEFAULT_QUEUE,)


def queues_without_worker(depths: dict[str, int], routed: list[str],
                          documents: list[bytes]) -> list[str]:
    """The queues that hold tasks (``depths``) or that task types route to (``routed``)
    and that no running worker taking tasks serves, given the workers' status
    ``documents``."""
    wanted = {name for name, depth in depths.items() if depth} | set(routed)
    served: set[str] = set()
    for data in documents:
        doc = decode_or_none(data, _ServesQueues, path="workers/")
        if doc is not None and doc.state is MemberState.RUNNING and doc.types:
            served.update(doc.queues)
    return sorted(wanted - served, key=lambda n: (n != DEFAULT_QUEUE, n))


@attrs.frozen
class _DutyState:
    """The part of a worker's status document about the app's duties."""

    duties: str | None = None


def duties_of(documents: dict[str, bytes]) -> dict[str, str]:
    """Each worker's duties state (``off``, ``standby``, ``held``, ``deferred``) from its
    status document, for the workers that publish one."""
    found = {}
    for name, data in documents.items():
        doc = decode_or_none(data, _DutyState, path=f"workers/{name}")
        if doc is not None and doc.duties:
            found[name] = doc.duties
    return found


def types_without_worker(catalog: list[str], documents: list[bytes]) -> list[str]:
    """The task types no running worker takes: of those in ``catalog`` and those of tasks
    some worker passed over (a name no worker ever registered: a typo submitted before
    the catalog listed anything), given the workers' status ``documents``
    (``workers/<name>``'s data)."""
    wanted, taken = set(catalog), set()
    for data in documents:
        doc = decode_or_none(data, _TakesTypes, path="workers/")
        if doc is None:
            continue
        wanted.update(doc.passed_types)
        if doc.state is MemberState.RUNNING:
            taken.update(doc.types)
    return sorted(wanted - taken)


async def _raw_docs(session: Session, parent: str, names: list[str],
                    watches: Watches | None = None) -> dict[str, bytes]:
    """The data of ``parent``'s children ``names`` (read concurrently, gone ones left
    out)."""
    found: dict[str, bytes] = {}

    async def read(name: str) -> None:
        path = f"{parent}/{name}"
        try:
            found[name] = (await session.get(path, watch=_arm(watches, path)))[0]
        except errors.NoNodeError:
            pass

    await gather(*[functools.partial(read, n) for n in names])
    return {name: found[name] for name in names if name in found}


async def queue_depth(session: Session, app: App, watches: Watches | None = None) -> int:
    """Items in the app's task queues, claimed ones included (see :func:`queue_depths`)."""
    return sum((await queue_depths(session, app, watches)).values())


async def queue_depths(session: Session, app: App,
                       watches: Watches | None = None) -> dict[str, int]:
    """Items in each of the app's queues (``default`` first), claimed ones included (with
    ``watches``: ``queues/`` and every bucket's children watched, so a new queue, a put or
    an ack sets ``watches.changed``).  One listing of ``queues/``, then per queue one
    listing of its buckets and one count per bucket."""
    named = await _children(session, app.queues, watches)  # watched: a new queue
    names = [DEFAULT_QUEUE, *(n for n in named if n != DEFAULT_QUEUE)]
    depths: dict[str, int] = {}

    async def depth(name: str) -> None:
        counts = await queue_counts(session, app.queue_path(name), watch=watches,
                                    claims=False)
        depths[name] = counts.queued

    await gather(*[functools.partial(depth, n) for n in names])
    return {name: depths[name] for name in names}


async def result_count(session: Session, app: App) -> int:
    """Result records (one stat per bucket, read concurrently)."""
    counts: list[int] = []

    async def count(bucket: str) -> None:
        stat = await session.exists(f"{app.results}/{bucket}")
        counts.append(stat.numChildren if stat else 0)

    await gather(*[functools.partial(count, b) for b in await _children(session, app.results)])
    return sum(counts)


async def gather_status(session: Session, app: App, *, recent_failures: int = 5,
                        watches: Watches | None = None) -> AppStatus:
    """Read the application's state.  With ``watches``, the masters, workers (and their
    reports), running tasks (and their progress), queue, dead letters, failures and the
    done/cancel records are watched: any change of them sets ``watches.changed``."""
    if await session.exists(app.base, watch=_arm(watches, app.base)) is None:
        return AppStatus(app.name, False, None, [], {}, 0, {}, {}, [], 0, 0)
    await _children(session, app.masters, watches)  # arms the watch of the line
    contenders = await Election(session, app.masters).contenders()
    line = [Contender.of(c.identifier, c.token, c.node) for c in contenders]
    assignments = {}
    for worker in await _children(session, app.assignments):
        for shard in await _children(session, app.assignment_dir(worker)):
            assignments[shard] = worker
    newest = (await _children(session, app.failures, watches))[-recent_failures:]
    documents = await _raw_docs(session, app.workers,
                                await _children(session, app.workers, watches), watches)
    catalog = await Catalog(session, app).read()
    depths = await queue_depths(session, app, watches)
    return AppStatus(
        app=app.name,
        exists=True,
        leader=line[0] if line else None,
        standbys=line[1:],
        workers={name: decode_or_none(data, MemberStatus, path=f"{app.workers}/{name}")
                 or MemberStatus() for name, data in documents.items()},
        queue_depth=sum(depths.values()),
        running=await _docs(session, app.running, await _children(session, app.running, watches),
                            RunningRecord, watches),
        assignments=assignments,
        failures=list((await _docs(session, app.failures, newest, TaskResult)).values()),
        dead_letters=len(await _children(session, app.dead, watches)),
        results=await result_count(session, app),
        done=await _record(session, app.done, JobDone, watches),
        cancelled=await _record(session, app.cancel, CancelRecord, watches),
        past_runs=await generations(session, app),
        types_without_worker=types_without_worker(list(catalog.types),
                                                  list(documents.values())),
        duties=duties_of(documents),
        queues=depths,
        queues_without_worker=queues_without_worker(
            depths, [info.queue for info in catalog.types.values()], list(documents.values())),
    )


async def generations(session: Session, app: App) -> list[PastRun]:
    """The past generations of ``app``'s job (``history/``), oldest first."""
    try:
        names = sorted(await session.children(app.history))
    except errors.NoNodeError:
        return []
    out = []
    for name in names:
        data, _stat = await session.get(f"{app.history}/{name}")
        past = decode_or_none(data, PastRun, path=f"{app.history}/{name}")
        if past is not None:
            out.append(past)
    return out


async def list_apps(session: Session, root: str = "/apps") -> list[AppSummary]:
    """Every application under ``root``, with its leader, processes, queue and state."""
    names = await _children(session, root)
    found: dict[str, AppSummary] = {}

    async def summarise(name: str) -> None:
        app = App(name, root)
        contenders = await Election(session, app.masters).contenders()
        leader = (Contender.of(contenders[0].identifier, contenders[0].token,
                               contenders[0].node).name if contenders else None)
        found[name] = AppSummary(
            name=name, leader=leader, masters=len(contenders),
            workers=len(await _children(session, app.workers)),
            queue_depth=await queue_depth(session, app),
            done=await session.exists(app.done) is not None,
            cancelled=await session.exists(app.cancel) is not None,
            generation=await _generation(session, app),
        )

    valid = []
    for name in names:
        try:
            App(name, root)
            valid.append(name)
        except errors.ConfigurationError:
            continue
    await gather(*[functools.partial(summarise, n) for n in valid])
    return [found[n] for n in valid if n in found]


async def _generation(session: Session, app: App) -> int:
    """1, plus one per generation kept in ``history/`` (one read: its child count)."""
    stat = await session.exists(app.history)
    return 1 + (stat.numChildren if stat is not None else 0)
