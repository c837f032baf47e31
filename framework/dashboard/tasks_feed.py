"""The dashboard's task views, fed by watches: recent results (the task list), delayed
tasks and schedules (the scheduled view), revoked ids, and the task type of each running
task.

What each costs ZooKeeper (all watch-driven: nothing is read while nothing changes, and
nothing depends on how many people look):

* **recent results** - children watches on ``results-log/``, its newest day and that day's
  slots of now and the previous 10 s (the time index,
  :mod:`framework.runtime.results.result_index`: a busy writer makes the next slot ahead, so the
  newest slot is not always the one written); older slots are listed once each.  Up to
  :data:`RECENT_RESULTS` records are read with a data watch: a succeeded one once (it is
  never rewritten), a failed or revoked one again at each re-read (a task run again after
  a requeue rewrites its record in place, keeping its index entry).  A slot holds 10 s
  of results: in a slot with more than :data:`RECENT_RESULTS`, an arbitrary
  :data:`RECENT_RESULTS` of them are shown.  Re-read at most every
  :data:`RECENT_THROTTLE` seconds.
* **delayed tasks** - children watches on ``delayed/`` and each minute bucket; the
  :data:`DELAYED_SHOWN` soonest are read, each once (a delayed record never changes).
* **schedules** - a children watch on ``schedules/`` and a data watch on each record (one
  read of each per change of any).
* **revoked** - a children watch on ``revoked/`` (the ids only).
* **task types** - one read of the queue item of each running task newly seen (its
  ``running/`` marker names the item), remembered for :data:`TYPES_KEPT` tasks: the type a
  result is shown with (result records do not carry it; a task that ran and finished between
  two looks at ``running/`` has no known type: ``?``).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Any

import trio

from framework import errors, records
from framework.dashboard.model import AppModel, json_doc
from framework.primitives.queue import WorkQueue
from framework.runtime.app import App
from framework.runtime.operations import Watches, item_of
from framework.runtime.queues import queue_names
from framework.runtime.results import slot_of
from framework.runtime.scheduling import DelayedRecord, due_of
from framework.runtime.tasks import Task
from framework.zk import Session

#: Results shown in the task list.
RECENT_RESULTS = 100
#: Delayed tasks read and shown (all are counted).
DELAYED_SHOWN = 100
#: Seconds between two re-reads of the recent results (or delayed tasks, schedules).
RECENT_THROTTLE = 1.0
#: Task types remembered (task id -> type) for the task list.
TYPES_KEPT = 5_000


async def _children(session: Session, path: str, watches: Watches | None) -> list[str]:
    try:
        return sorted(await session.children(path, watch=watches(path) if watches else None))
    except errors.NoNodeError:
        if watches is not None and await session.exists(path, watch=watches(path)):
            watches.changed.set()  # created meanwhile: look again
        return []


class _ResultsIndex:
    """The keys of the newest results, from the results log's listings (days, their slots,
    a slot's keys): the newest day and its live slots (those that may still be written)
    are listed again at each read, with a watch; older listings are kept while still
    shown, and forgotten once not."""

    def __init__(self, session: Session, log: str) -> None:
        self.session = session
        self.log = log
        self.listed: dict[str, list[str]] = {}  # a day's slots or a slot's keys, kept
        self._keys: dict[str, None] = {}  # newest slot first, in listing order within a slot
        self._visited: set[str] = set()

    async def newest(self, watches: Watches, count: int) -> list[str]:
        """The newest ``count`` keys (fewer if the log holds fewer)."""
        self._keys, self._visited = {}, set()
        live = slot_of(time.time()) - 1  # slots from here on may still be written
        newest = True  # the newest day is watched, and its live slots
        for day in reversed(await _children(self.session, self.log, watches)):
            await self._read_day(f"{self.log}/{day}", watches if newest else None, live, count)
            newest = False
            if len(self._keys) >= count:
                break
        for gone in set(self.listed) - self._visited:
            del self.listed[gone]
        return list(self._keys)[:count]

    async def _read_day(self, day_path: str, watches: Watches | None, live: int,
                        count: int) -> None:
        """Add a day's keys, newest slot first, until ``count`` are known (``watches``:
        the newest day's, else ``None``)."""
        self._visited.add(day_path)
        for slot in reversed(await self._listing(day_path, watches)):
            path = f"{day_path}/{slot}"
            self._visited.add(path)
            watched = watches is not None and slot.isdigit() and int(slot) >= live
            self._keys.update(dict.fromkeys(await self._listing(path, watches if watched
                                                                else None)))
            if len(self._keys) >= count:
                break

    async def _listing(self, path: str, watches: Watches | None) -> list[str]:
        if watches is not None or path not in self.listed:
            self.listed[path] = await _children(self.session, path, watches)
        return self.listed[path]


class TaskViews:
    """The task views of one application, written into ``view`` (``changed`` after each
    update)."""

    def __init__(self, session: Session, app: App, view: AppModel, changed: Any) -> None:
        self.session = session
        self.app = app
        self.view = view
        self.changed = changed
        self._types: OrderedDict[str, str] = OrderedDict()

    async def _follow(self, read: Any) -> None:
        """``read(watches)`` now and again after each change it watches (throttled)."""
        watches = Watches()
        while True:
            watches.reset()
            await read(watches)
            self.changed()
            await watches.changed.wait()
            await trio.sleep(RECENT_THROTTLE)

    # ------------------------------------------------------------ recent results

    async def recent(self) -> None:
        """The newest :data:`RECENT_RESULTS` results (newest slot first), each record read
        once unless it may still be rewritten; read again after each watched change."""
        index = _ResultsIndex(self.session, self.app.results_log)
        cache: dict[str, dict[str, Any]] = {}

        async def read(watches: Watches) -> None:
            shown = await index.newest(watches, RECENT_RESULTS)
            for key in shown:
                # a failed or revoked task's record is rewritten in place if it runs again
                # (its index entry stays): those are watched and read again
                if key not in cache or cache[key]["outcome"] != "succeeded":
                    doc = await self._result(key, watches)
                    if doc is not None:
                        cache[key] = doc
            for key in set(cache) - set(shown):
                del cache[key]
            self.view.recent = sorted(
                (self._with_type(d) for d in cache.values()),
                key=lambda d: d.get("finished_at") or 0, reverse=True)

        await self._follow(read)

    async def _result(self, key: str, watches: Watches) -> dict[str, Any] | None:
        path = self.app.result_path(key)
        try:
            data, _stat = await self.session.get(path, watch=watches(path))
        except (errors.NoNodeError, errors.ConfigurationError):
            return None
        doc = json_doc(data)
        started, finished = doc.get("started_at"), doc.get("finished_at")
        return {
            "key": key, "task_id": doc.get("task_id"), "worker": doc.get("worker"),
            "outcome": doc.get("outcome") or ("succeeded" if doc.get("ok") else "failed"),
            "attempts": doc.get("attempts"), "error": doc.get("error"),
            "type": doc.get("name"), "finished_at": finished,
            "duration": (round(finished - started, 6) if isinstance(started, (int, float))
                         and isinstance(finished, (int, float)) and started else None),
        }

    def _with_type(self, doc: dict[str, Any]) -> dict[str, Any]:
        if doc.get("type"):
            return doc
        return doc | {"type": self._types.get(str(doc.get("task_id")), "?")}

    # ------------------------------------------------------------ running tasks' types

    async def type_of_running(self, running: dict[str, dict[str, Any]]) -> bool:
        """Read the type of each running task not seen before (its queue item: in the
        default queue, else in a named one, listed only then); whether any was learnt."""
        queues = [WorkQueue(self.session, self.app.tasks)]
        named: list[str] | None = None
        learnt = False
        for task_id, marker in running.items():
            if task_id in self._types:
                continue
            item = item_of(str(marker.get("delivery") or ""))
            if item is None:
                continue
            data = await queues[0].item_data(item)
            if data is None and named is None:  # perhaps a named queue's: list them once
                named = (await queue_names(self.session, self.app))[1:]
                queues += [WorkQueue(self.session, self.app.queue_path(n)) for n in named]
            for queue in queues[1:]:
                if data is not None:
                    break
                data = await queue.item_data(item)
            if data is None:
                continue
            try:
                self._types[task_id] = Task.decode(data).name
            except records.CorruptRecord:
                continue
            learnt = True
            while len(self._types) > TYPES_KEPT:
                self._types.popitem(last=False)
        if learnt:
            self.view.recent = [self._with_type(d) if d.get("type") == "?" else d
                                for d in self.view.recent]
            self.view.running_types = {t: self._types[t] for t in running if t in self._types}
        return learnt

    # ------------------------------------------------------------ the scheduled view

    async def delayed(self) -> None:
        cache: dict[str, dict[str, Any]] = {}

        async def read(watches: Watches) -> None:
            names: list[tuple[float, str]] = []
            for bucket in await _children(self.session, self.app.delayed, watches):
                path = f"{self.app.delayed}/{bucket}"
                names.extend((due_of(n), f"{path}/{n}")
                             for n in await _children(self.session, path, watches))
            names.sort()
            shown = [path for _due, path in names[:DELAYED_SHOWN]]
            for path in shown:
                if path not in cache:
                    try:
                        data, _stat = await self.session.get(path)
                    except errors.NoNodeError:
                        continue
                    try:
                        record = records.decode(data, DelayedRecord)
                    except records.CorruptRecord:
                        continue
                    cache[path] = {"task_id": record.task.id, "type": record.task.name,
                                   "due": record.due, "priority": record.priority}
            for path in set(cache) - set(shown):
                del cache[path]
            self.view.delayed = [cache[p] for p in shown if p in cache]
            self.view.delayed_total = len(names)

        await self._follow(read)

    async def schedules(self) -> None:
        async def read(watches: Watches) -> None:
            found = {}
            for name in await _children(self.session, self.app.schedules, watches):
                path = f"{self.app.schedules}/{name}"
                try:
                    data, _stat = await self.session.get(path, watch=watches(path))
                except errors.NoNodeError:
                    continue
                found[name] = json_doc(data)
            self.view.schedule_records = found

        await self._follow(read)

    async def revoked(self) -> None:
        async def read(watches: Watches) -> None:
            self.view.revoked = set(await _children(self.session, self.app.revoked, watches))

        await self._follow(read)
