"""Jepsen-style histories: every process records what it did, a checker judges the whole.

Each process appends one JSON line per event to its own file (flushed at once, so kill -9
loses at most the line being written; a truncated last line is skipped).  Timestamps are
``CLOCK_MONOTONIC`` in nanoseconds: one clock for every process of the machine, so
intervals of different processes compare.

Events: ``put`` (an item queued), ``claim`` / ``ack`` / ``ack_lost`` (a delivery, a
server-confirmed acknowledgement, an acknowledgement refused or unconfirmed; a delivery
whose process was killed before it recorded an outcome may have acked: if the server no
longer holds that item, it counts as acknowledged, unconfirmed), ``acquire`` /
``release`` (a lock body's start and end), ``fault`` (what the test did: kill -9, a
ZooKeeper member killed...).  The checker proves, for the queue: no item acknowledged twice,
no item lost (every item put was acknowledged, or is still queued or dead-lettered as the
server says); for the lock: no two holders' bodies overlap (a killed holder's body ends at
its kill, when the test recorded it).

The worker processes of such a run (``tests/helpers/history_worker.py``: they take items
from ``/q`` and contend for ``/lock`` under a chroot) are started and killed through
:class:`HistoryWorkers`, which records each kill -9 as a fault.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import attrs
import trio

from framework.testing.processes import Child, python_argv, spawn

if TYPE_CHECKING:
    from framework.primitives.queue import WorkQueue

ROOT = Path(__file__).resolve().parent.parent.parent
HELPER = ROOT / "tests" / "helpers" / "history_worker.py"


def now_ns() -> int:
    """The machine-wide monotonic clock, in nanoseconds."""
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


@attrs.frozen
class Event:
    """One thing a process did (``key``: the item or lock it concerns)."""

    at: int
    process: str
    kind: str
    key: str = ""


class Recorder:
    """Appends a process's events to ``directory/<process>.jsonl``."""

    def __init__(self, directory: Path, process: str) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.process = process
        self._file: IO[str] = (directory / f"{process}.jsonl").open("a", encoding="utf-8")

    def record(self, kind: str, key: str = "") -> None:
        line = json.dumps({"at": now_ns(), "process": self.process, "kind": kind, "key": key})
        self._file.write(line + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


class HistoryWorkers:
    """History worker processes on one ZooKeeper chroot, each recording to ``directory``.

    ``async with`` it: at the end every worker still running is killed with kill -9, each
    kill recorded first as a ``fault`` in ``history`` (the kill ends its open lock body),
    and reaped."""

    def __init__(self, hosts: str, chroot: str, directory: Path, history: Recorder) -> None:
        self.hosts = hosts
        self.chroot = chroot
        self.directory = directory
        self.history = history
        self.children: dict[str, Child] = {}
        self._stack = AsyncExitStack()

    async def __aenter__(self) -> HistoryWorkers:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        try:
            for name in self.running():
                self.history.record("fault", name)
                self.children[name].kill()
        finally:
            await self._stack.aclose()  # reaps them

    def running(self) -> list[str]:
        """The names of the workers still running, sorted."""
        return sorted(name for name, child in self.children.items() if child.running)

    async def start(self, name: str) -> Child:
        """Start worker ``name`` and wait until it takes items and contends for the lock;
        :class:`RuntimeError` if it exits before that."""
        child = await self._stack.enter_async_context(spawn(
            python_argv(HELPER, self.hosts, self.chroot, self.directory, name), name=name,
            pipe_stdout=True, cwd=ROOT,
            env={"PYTHONPATH": str(ROOT), "FRAMEWORK_LOG_LEVEL": "error"}))
        self.children[name] = child
        assert child.lines is not None
        try:
            await child.lines.until(lambda line: line == "ready")
        except EOFError:
            raise RuntimeError(f"worker {name} exited before it was ready") from None
        return child

    async def kill(self, name: str) -> None:
        """kill -9 worker ``name`` (recorded first as a fault) and wait until it is gone."""
        self.history.record("fault", name)
        self.children[name].kill()
        await self.children[name].wait()


async def put_recorded(queue: WorkQueue, history: Recorder, key: str) -> None:
    """Record the ``put`` of ``key``, then put it; a put that fails (a ZooKeeper member
    down, a leader change) is made again once connected: at-least-once, as the checker
    expects."""
    history.record("put", key)
    while True:
        try:
            await queue.put(key.encode())
            return
        except Exception:
            await queue.session.wait_connected()


async def wait_drained(queue: WorkQueue) -> None:
    """Until ``queue`` holds no item (a watch on its size, no polling)."""
    while True:
        changed = trio.Event()
        if await queue.size(changed=changed) == 0:
            return
        await changed.wait()


def load(directory: Path) -> list[Event]:
    """Every event of every process, in time order (truncated lines skipped)."""
    events = []
    for path in sorted(directory.glob("*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                doc: dict[str, Any] = json.loads(line)
                events.append(Event(int(doc["at"]), str(doc["process"]), str(doc["kind"]),
                                    str(doc.get("key", ""))))
            except (ValueError, KeyError, TypeError):
                continue  # the line a kill -9 cut short
    return sorted(events, key=lambda e: e.at)


@attrs.frozen
class Report:
    """The verdict.  ``ok`` only when every list of violations is empty."""

    put: int
    acked: int
    unconfirmed: int  # gone from the server, last held by a process killed mid-delivery
    deliveries: int
    duplicates: int  # deliveries beyond the first per item (allowed: at-least-once)
    acked_twice: list[str]
    lost: list[str]
    overlaps: list[tuple[str, str, str]]  # (lock, holder, other holder)
    faults: int

    @property
    def ok(self) -> bool:
        return not (self.acked_twice or self.lost or self.overlaps)

    def summary(self) -> str:
        return (f"{self.put} put, {self.acked} acked (+{self.unconfirmed} by a process killed "
                f"before it could record it), {self.deliveries} deliveries "
                f"({self.duplicates} duplicates), {self.faults} faults; violations: "
                f"{len(self.acked_twice)} acked twice, {len(self.lost)} lost, "
                f"{len(self.overlaps)} lock overlaps")


def check(events: Iterable[Event], *, remaining: Iterable[str] = ()) -> Report:
    """Judge a history.  ``remaining``: items the server still holds at the end (queued or
    dead-lettered): those are not lost."""
    events = sorted(events, key=lambda e: e.at)
    put = {e.key for e in events if e.kind == "put"}
    acks = Counter(e.key for e in events if e.kind == "ack")
    claims = Counter(e.key for e in events if e.kind == "claim")
    left = set(remaining)
    in_doubt = _in_doubt(events) - set(acks)
    return Report(
        put=len(put),
        acked=len(acks),
        unconfirmed=len(in_doubt - left),
        deliveries=sum(claims.values()),
        duplicates=sum(n - 1 for n in claims.values() if n > 1),
        acked_twice=sorted(k for k, n in acks.items() if n > 1),
        lost=sorted(put - set(acks) - left - in_doubt),
        overlaps=_overlaps(events),
        faults=sum(1 for e in events if e.kind == "fault"),
    )


def _in_doubt(events: list[Event]) -> set[str]:
    """Items whose delivery was cut short by a kill -9 with no outcome recorded: the
    ack may have been applied (an ack is applied, then recorded).  If the server no longer
    holds such an item and nobody else acked it, that delivery acked it."""
    killed = {e.key for e in events if e.kind == "fault" and e.key}
    holding: dict[tuple[str, str], bool] = {}
    for e in events:
        if e.kind == "claim":
            holding[(e.process, e.key)] = True
        elif e.kind in ("ack", "ack_lost"):
            holding.pop((e.process, e.key), None)
    return {key for (process, key) in holding if process in killed}


def _overlaps(events: list[Event]) -> list[tuple[str, str, str]]:
    """Pairs of lock bodies whose intervals intersect.  A body left open ends when its
    process was killed (a ``fault`` event whose key names the process), else never."""
    killed = {e.key: e.at for e in events if e.kind == "fault" and e.key}
    open_bodies: dict[tuple[str, str], int] = {}
    intervals: list[tuple[int, int, str, str]] = []
    for e in events:
        if e.kind == "acquire":
            open_bodies[(e.key, e.process)] = e.at
        elif e.kind == "release" and (e.key, e.process) in open_bodies:
            intervals.append((open_bodies.pop((e.key, e.process)), e.at, e.key, e.process))
    for (lock, process), start in open_bodies.items():
        end = killed.get(process)
        intervals.append((start, end if end is not None and end >= start else 2**63,
                          lock, process))
    found = []
    intervals.sort()
    for i, (_start, end, lock, holder) in enumerate(intervals):
        for other_start, _other_end, other_lock, other in intervals[i + 1:]:
            if other_start >= end:
                break
            if other_lock == lock:
                found.append((lock, holder, other))
    return found
