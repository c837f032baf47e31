"""The feed: ZooKeeper watches held once by the dashboard process, written into the model.

Per application (``/apps/<name>``) the feed holds:

* a children watch on ``masters/`` (contenders' identities are read once each: they never
  change), ``failures/`` and ``dead/`` (each record read once: records are immutable), and
  ``shards/``, ``assignments/`` and each ``assignments/<worker>/``;
* the membership watch on ``workers/`` and on ``running/`` (one children watch and one data
  watch per member: status and progress updates);
* the queue's watched counts (:func:`~framework.primitives.queue.watch_queue_counts`: its
  layout is the queue's business);
* the ready-znode watch on ``config/`` and data watches on ``done``, ``cancel`` and
  ``counters``;
* the task views' watches (recent results, delayed tasks, schedules, revoked ids, running
  tasks' types): :mod:`framework.dashboard.tasks_feed`.

A burst of changes collapses into one re-read: each watcher waits :data:`THROTTLE` seconds
after an update before it reads again (a rate limit; the watch set by the last read catches
everything meanwhile).  After a connection loss every watcher reads its state again.  None of
this depends on how many people look at the page.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from framework import errors
from framework.dashboard.model import (
    DEAD_LETTERS_SHOWN,
    RECENT_FAILURES,
    SAMPLE_INTERVAL,
    Model,
    json_doc,
)
from framework.dashboard.tasks_feed import TaskViews
from framework.logs import get_logger
from framework.primitives import ConfigStore, Group
from framework.primitives.election import contenders_of
from framework.primitives.queue import watch_queue_counts
from framework.runtime.app import App
from framework.runtime.operations import result_count
from framework.runtime.tasks import TaskResult
from framework.zk import Session, validate_name, watch_children, watch_data

log = get_logger("framework.dashboard.feed")

#: Seconds a watcher waits after an update before reading again (bursts collapse).
THROTTLE = 0.1
#: Seconds between reads of a busy queue's counts.
QUEUE_THROTTLE = 0.25
#: Shortest time between two counts of an app's result records (256 ``exists``, pipelined):
#: counted again after a change its members report (a task done), not watched.
RESULTS_THROTTLE = 2.0
#: Root of the applications.
APPS_ROOT = "/apps"
#: The app-level counters hook: a JSON object an application may write here.
COUNTERS_NODE = "counters"


async def _resilient(session: Session, what: str, body: Callable[[], Awaitable[None]]) -> None:
    """Run a watcher forever: after a connection loss it starts again once connected; any
    other error is logged and the watcher restarted a second later."""
    while True:
        try:
            await body()
            return
        except (errors.ConnectionLossError, errors.SessionExpiredError):
            await session.wait_connected()
        except Exception as exc:
            log.warning("dashboard.watcher_failed", watcher=what,
                        error=f"{type(exc).__name__}: {exc}")
            await trio.sleep(1.0)


class AppFeed:
    """The watches of one application, written into ``model.apps[name]``."""

    def __init__(self, session: Session, model: Model, name: str) -> None:
        self.session = session
        self.model = model
        self.app = App(name)
        self.view = model.app(name)
        self._count_results = trio.Event()  # set when the result count may have changed
        self.tasks = TaskViews(session, self.app, self.view, self._changed)

    async def run(self) -> None:
        watchers: dict[str, Callable[[], Awaitable[None]]] = {
            "masters": self._masters, "workers": self._workers, "running": self._running,
            "failures": self._failures, "dead": self._dead, "queue": self._queue,
            "config": self._config, "shards": self._shards,
            "assignments": self._assignments, "done": self._done, "cancel": self._cancel,
            "counters": self._counters, "results": self._results,
            "recent": self.tasks.recent, "delayed": self.tasks.delayed,
            "schedules": self.tasks.schedules, "revoked": self.tasks.revoked,
        }
        async with trio.open_nursery() as nursery:
            for what, body in watchers.items():
                nursery.start_soon(_resilient, self.session, f"{self.app.name}/{what}", body)

    def _changed(self) -> None:
        self.model.touch()

    async def _masters(self) -> None:
        known: dict[str, dict[str, Any]] = {}
        async for snap in watch_children(self.session, self.app.masters):
            line = contenders_of(snap.children)
            for name in set(known) - set(line):
                del known[name]
            for name in line:
                if name not in known:
                    try:
                        data, stat = await self.session.get(f"{self.app.masters}/{name}")
                    except errors.NoNodeError:
                        continue
                    known[name] = json_doc(data) | {"node": name, "token": stat.czxid}
            self.view.set_contenders([known[n] for n in line if n in known])
            self._changed()
            await trio.sleep(THROTTLE)

    async def _workers(self) -> None:
        first = True
        async for members in Group(self.session, self.app.workers).watch():
            before = (self.view.totals.done, self.view.totals.failed)
            self.view.set_workers({name: json_doc(data) for name, data in members.items()})
            if not first and (self.view.totals.done, self.view.totals.failed) != before:
                self._count_results.set()  # tasks ended since: count the results again
            first = False  # what the members had done before is in the first count
            self._changed()
            await trio.sleep(THROTTLE)

    async def _results(self) -> None:
        """The app's result records, counted at start and again (at most every
        :data:`RESULTS_THROTTLE` s) after its members' published counts grew (tasks
        ended): the app's own count, whatever processes this dashboard saw."""
        while True:
            self._count_results = trio.Event()
            self.view.results = await result_count(self.session, self.app)
            self._changed()
            await trio.sleep(RESULTS_THROTTLE)
            await self._count_results.wait()

    async def _running(self) -> None:
        async for members in Group(self.session, self.app.running).watch():
            self.view.set_running({name: json_doc(data) for name, data in members.items()})
            self._changed()
            if await self.tasks.type_of_running(self.view.running):
                self._changed()
            await trio.sleep(THROTTLE)

    async def _failures(self) -> None:
        cache: dict[str, dict[str, Any]] = {}
        async for snap in watch_children(self.session, self.app.failures):
            newest = sorted(snap.children)[-RECENT_FAILURES:]
            cache = {n: d for n, d in cache.items() if n in newest}
            for name in newest:
                if name not in cache:
                    doc = await self._read(f"{self.app.failures}/{name}")
                    if doc is not None:
                        cache[name] = doc
            self.view.failures = [cache[n] for n in newest if n in cache]
            self._changed()
            await trio.sleep(THROTTLE)

    async def _dead(self) -> None:
        cache: dict[str, dict[str, Any]] = {}
        async for snap in watch_children(self.session, self.app.dead):
            names = sorted(snap.children)
            shown = names[:DEAD_LETTERS_SHOWN]
            cache = {n: d for n, d in cache.items() if n in names}
            for name in shown:
                if name not in cache:
                    doc = await self._dead_letter(name)
                    if doc is not None:
                        cache[name] = doc
            dead = {n: cache.get(n, {"name": n}) for n in names}
            self.view.set_dead(dead)
            self._changed()
            await trio.sleep(THROTTLE)

    async def _dead_letter(self, name: str) -> dict[str, Any] | None:
        """A dead letter's task and the error of its final failure (its result record)."""
        try:
            data, _stat = await self.session.get(f"{self.app.dead}/{name}")
        except errors.NoNodeError:
            return None
        task = json_doc(data)
        attempts = name.rpartition(".")[2]
        doc: dict[str, Any] = {
            "task_id": task.get("id"), "key": task.get("key") or task.get("id"),
            "payload": task.get("payload"),
            "attempts": int(attempts) if attempts.isdigit() else None,
            "error": None, "traceback": None,
        }
        key = doc["key"]
        if isinstance(key, str):
            try:
                validate_name("task key", key)
                record = await self.session.get(self.app.result_path(key))
                final = TaskResult.decode(record[0])
                doc["error"], doc["traceback"] = final.error, final.traceback
            except (errors.NoNodeError, errors.ConfigurationError, ValueError, TypeError):
                pass
        return doc

    async def _read(self, path: str) -> dict[str, Any] | None:
        try:
            return json_doc((await self.session.get(path))[0])
        except errors.NoNodeError:
            return None

    async def _queue(self) -> None:
        """Each queue's depth (claimed items included) and claimed items, as the queue's
        watched counts give them (throttled): the default queue, and each named queue
        from when ``queues/`` lists it (a children watch)."""
        counting: dict[str, trio.CancelScope] = {}
        async with trio.open_nursery() as nursery:
            async for snap in watch_children(self.session, self.app.queues):
                for name in ["default", *snap.children]:
                    if name not in counting:
                        counting[name] = trio.CancelScope()
                        nursery.start_soon(self._count_queue, name, counting[name])
                for name in set(counting) - {"default", *snap.children}:
                    counting.pop(name).cancel()  # deleted (a purge): no longer shown
                    self.view.queues.pop(name, None)
                    self._changed()

    async def _count_queue(self, name: str, scope: trio.CancelScope) -> None:
        with scope:
            async for counts in watch_queue_counts(self.session, self.app.queue_path(name),
                                                   throttle=QUEUE_THROTTLE):
                self.view.queues[name] = (counts.queued, counts.claimed or 0)
                self._changed()

    async def _config(self) -> None:
        store: ConfigStore[Any] = ConfigStore(self.session, self.app.config)
        async for item in store.watch_versioned():
            self.view.config = {"version": item.version, "value": item.config}
            self._changed()

    async def _shards(self) -> None:
        async for snap in watch_children(self.session, self.app.shards):
            self.view.shards = sorted(snap.children)
            self._changed()
            await trio.sleep(THROTTLE)

    async def _assignments(self) -> None:
        per_worker: dict[str, set[str]] = {}
        scopes: dict[str, trio.CancelScope] = {}

        def publish() -> None:
            self.view.assignments = {shard: worker for worker, shards in per_worker.items()
                                     for shard in shards}
            self._changed()

        async def follow(worker: str, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
            with trio.CancelScope() as scope:
                task_status.started(scope)
                path = self.app.assignment_dir(worker)
                async for snap in watch_children(self.session, path):
                    per_worker[worker] = set(snap.children)
                    publish()
                    await trio.sleep(THROTTLE)

        async with trio.open_nursery() as nursery:
            async for snap in watch_children(self.session, self.app.assignments):
                for gone in set(scopes) - set(snap.children):
                    scopes.pop(gone).cancel()
                    per_worker.pop(gone, None)
                for worker in set(snap.children) - set(scopes):
                    scopes[worker] = await nursery.start(
                        _resilient_started, self.session, f"assignments/{worker}", follow,
                        worker)
                publish()

    async def _done(self) -> None:
        async for snap in watch_data(self.session, self.app.done):
            self.view.done = json_doc(snap.data) if snap.exists else None
            self._changed()

    async def _cancel(self) -> None:
        async for snap in watch_data(self.session, self.app.cancel):
            self.view.cancelled = json_doc(snap.data) if snap.exists else None
            self._changed()

    async def _counters(self) -> None:
        async for snap in watch_data(self.session, f"{self.app.base}/{COUNTERS_NODE}"):
            self.view.counters = json_doc(snap.data) if snap.exists else {}
            self._changed()
            await trio.sleep(THROTTLE)


async def _resilient_started(session: Session, what: str, body: Any, arg: str,
                             task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    """:func:`_resilient` for a body that reports a cancel scope through ``task_status``."""
    with trio.CancelScope() as scope:
        task_status.started(scope)
        await _resilient(session, what, lambda: body(arg))


class Feed:
    """Discovers applications under ``/apps`` and runs one :class:`AppFeed` for each; also
    follows the dashboard's own session state and samples the charts."""

    def __init__(self, session: Session, model: Model) -> None:
        self.session = session
        self.model = model

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._session_states)
            nursery.start_soon(self._sample)
            nursery.start_soon(_resilient, self.session, "apps", self._apps)

    async def _apps(self) -> None:
        feeds: dict[str, trio.CancelScope] = {}
        async with trio.open_nursery() as nursery:
            async for snap in watch_children(self.session, APPS_ROOT):
                names = set()
                for name in snap.children:
                    try:
                        names.add(validate_name("application name", name))
                    except errors.ConfigurationError:
                        continue
                for gone in set(feeds) - names:
                    feeds.pop(gone).cancel()
                    self.model.apps.pop(gone, None)
                for name in names - set(feeds):
                    feeds[name] = await nursery.start(self._run_app, name)
                    log.info("dashboard.app_found", app=name)
                self.model.touch()

    async def _run_app(self, name: str, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        with trio.CancelScope() as scope:
            task_status.started(scope)
            await AppFeed(self.session, self.model, name).run()

    async def _session_states(self) -> None:
        async for change in self.session.states():
            self.model.session_changed(change.state.value)

    async def _sample(self) -> None:
        """One chart sample per app every :data:`SAMPLE_INTERVAL` (from the model only)."""
        while True:
            now = time.time()
            for app in self.model.apps.values():
                app.sample(now)
            self.model.touch()
            await trio.sleep(SAMPLE_INTERVAL)
