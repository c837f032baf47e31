"""Retention: the active master keeps ``results/``, ``dead/`` and ``failures/`` bounded.

Each record kind has a count limit and an age limit (``Master`` class attributes, ``None``
for no limit).  A pass deletes the records over a limit, oldest first, at most ``batch`` per
pass, in fenced multis (a deposed master deletes nothing).  The rules:

* a result record is kept while a task with its key is still in the queue (queued, claimed
  or running: an item leaves the queue only with its acknowledgement), since a redelivery's
  idempotency check reads it; and while a dead letter of its key exists (it explains it);
* a dead letter whose task has a successful result (it was requeued, or resubmitted, and
  succeeded) is deleted whatever its age;
* ages are the znodes' ``mtime`` (the server's clock) against this process's clock (result
  records: the 10-second slot of the time index they were written in).

Result records are walked through their time index and checked one by one against the
queued markers (:mod:`framework.runtime.results.retention_results`): the master keeps nothing per
record or per queued task, and never lists the queue.  What a pass knows of ``dead/`` and
``failures/`` (each bounded by its own limits) survives between passes of one term, so each
of those is read once, not once per pass.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

import attrs
import trio

from framework import errors
from framework.logs import get_logger
from framework.primitives import Term
from framework.primitives.queue import WorkQueue
from framework.runtime.app import App
from framework.runtime.results.retention_results import ResultTrimmer, bounded, commit_fenced_delete
from framework.runtime.tasks import TaskResult
from framework.zk import Session, Stat, gather

log = get_logger("framework.runtime.results.retention")

#: Deletions per fenced multi (well under a request's size limit: ~200 bytes each).
DELETES_PER_MULTI = 100

#: Dead letters whose result record a pass looks at (in turn, when there are more).
DEAD_CHECKS_PER_PASS = 100


@attrs.frozen
class Limit:
    """Keep at most ``count`` records, none older than ``seconds`` (``None``: no limit)."""

    count: int | None = None
    seconds: float | None = None

    def __attrs_post_init__(self) -> None:
        if self.count is not None and (isinstance(self.count, bool) or self.count < 0):
            raise errors.ConfigurationError(f"a retention count must be >= 0: {self.count!r}")
        if self.seconds is not None and not self.seconds >= 0:
            raise errors.ConfigurationError(
                f"a retention age must be >= 0 seconds: {self.seconds!r}"
            )

    def over(self, records: dict[str, _Known], now: float) -> list[str]:
        """The names over this limit, oldest first."""
        return self.over_times({name: known.mtime for name, known in records.items()}, now)

    def over_times(self, times: Mapping[str, float], now: float) -> list[str]:
        """Of records named with their time (epoch seconds), those over this limit, oldest
        first: the oldest beyond ``count``, then any older than ``seconds``."""
        oldest = sorted(times, key=times.__getitem__)
        excess = max(0, len(oldest) - self.count) if self.count is not None else 0
        chosen = oldest[:excess]
        if self.seconds is not None:
            cutoff = now - self.seconds
            chosen += [n for n in oldest[excess:] if times[n] < cutoff]
        return chosen


@attrs.define
class _Known:
    """A record as last read: ``mtime`` (seconds, server clock), ``version``, the task key
    (a dead letter's) and the result version it was last checked against."""

    mtime: float
    version: int
    key: str = ""
    checked: int | None = None

    @classmethod
    def of(cls, stat: Stat, key: str = "") -> _Known:
        return cls(stat.mtime / 1000.0, stat.version, key)


@attrs.define
class _Listing:
    """The records under ``path`` as last listed, and the ``cversion`` of that listing
    (kept current through our own deletions, so they cause no listing again)."""

    path: str
    records: dict[str, _Known] = attrs.Factory(dict)
    cversion: int | None = None


class Retention:
    """One term's retention passes over ``app`` (writes fenced by ``term``).  ``queue``: the
    app's task queue (kept for callers; the queue is never listed)."""

    def __init__(self, session: Session, app: App, term: Term, queue: WorkQueue, *,
                 results: Limit, dead: Limit, failures: Limit, batch: int = 1000) -> None:
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise errors.ConfigurationError(f"retention_batch must be an int >= 1: {batch!r}")
        self.session = session
        self.app = app
        self.term = term
        self.queue = queue
        self.limits = {"results": results, "dead": dead, "failures": failures}
        self.batch = batch
        self.results = ResultTrimmer(session, app, term, count=results.count,
                                     seconds=results.seconds)
        self._dead = _Listing(app.dead)
        self._failures = _Listing(app.failures)
        self._dead_cursor = 0  # where the next pass's superseded check starts

    async def run(self, interval: float) -> None:
        """A pass every ``interval`` seconds, forever; a failed pass is logged and retried
        at the next one (a deposed master's passes delete nothing)."""
        while True:
            await trio.sleep(interval)
            try:
                deleted = await self.apply()
            except errors.FrameworkError as exc:
                log.warning("retention.failed", app=self.app.name, error=str(exc))
                continue
            except Exception:  # a bug here must not end the term
                log.exception("retention.error", app=self.app.name)
                continue
            if any(deleted.values()):
                log.info("retention.deleted", app=self.app.name, **deleted)

    async def apply(self) -> dict[str, int]:
        """One pass; returns how many records of each kind it deleted.  At most ``batch``
        dead letters and failure records are deleted, then up to ``batch`` minus those
        result records are looked at (see :mod:`framework.runtime.results.retention_results`)."""
        now = time.time()
        await gather(self._scan_dead, self._scan_failures)
        budget = self.batch
        dead = await self._superseded_dead()
        dead += [n for n in self.limits["dead"].over(self._dead.records, now) if n not in dead]
        victims = [(self._dead, name) for name in dead[:budget]]
        failures = self.limits["failures"].over(self._failures.records, now)
        victims += [(self._failures, name) for name in failures[:budget - len(victims)]]
        gone = await self._delete(victims)
        # the dead letters that stay keep their keys' records
        kept = {known.key for known in self._dead.records.values()}
        results = await self.results.trim(now, budget - len(victims), kept)
        return {
            "dead": sum(1 for listing, _ in gone if listing is self._dead),
            "failures": sum(1 for listing, _ in gone if listing is self._failures),
            "results": results,
        }

    # ------------------------------------------------------------ what there is

    async def _scan_failures(self) -> None:
        await self._relist(self._failures)

    async def _relist(self, listing: _Listing) -> None:
        """List ``listing`` again if its ``cversion`` changed; stat the new records."""
        try:
            names, stat = await self.session.children_stat(listing.path)
        except errors.NoNodeError:
            return
        if stat.cversion != listing.cversion:
            await _refresh(listing.records, names, self._stat_reader(listing.path))
            listing.cversion = stat.cversion

    async def _scan_dead(self) -> None:
        path = self.app.dead
        try:
            names = await self.session.children(path)
        except errors.NoNodeError:
            return

        async def read(name: str) -> _Known | None:
            try:
                data, stat = await self.session.get(f"{path}/{name}")
            except errors.NoNodeError:
                return None
            return _Known.of(stat, _task_key(data) or name)

        await _refresh(self._dead.records, names, read)

    def _stat_reader(self, parent: str) -> Callable[[str], Awaitable[_Known | None]]:
        async def read(name: str) -> _Known | None:
            stat = await self.session.exists(f"{parent}/{name}")
            return _Known.of(stat, name) if stat is not None else None

        return read

    async def _superseded_dead(self) -> list[str]:
        """Dead letters whose task has a successful result record now.  A record replaced
        in place changes no listing, so up to ``DEAD_CHECKS_PER_PASS`` dead letters' records
        are stat'ed per pass, in turn, and read only when their version changed."""
        dead = self._dead.records
        names = sorted(dead)
        if len(names) > DEAD_CHECKS_PER_PASS:
            start = self._dead_cursor % len(names)
            names = (names[start:] + names[:start])[:DEAD_CHECKS_PER_PASS]
            self._dead_cursor = start + DEAD_CHECKS_PER_PASS
        superseded: list[str] = []

        async def check(name: str, known: _Known) -> None:
            path = self.app.result_path(known.key)
            stat = await self.session.exists(path)
            if stat is None or stat.version == known.checked:
                return
            try:
                data, stat = await self.session.get(path)
            except errors.NoNodeError:
                return
            known.checked = stat.version
            try:
                if TaskResult.decode(data).ok:
                    superseded.append(name)
            except (ValueError, TypeError):
                pass

        await bounded(functools.partial(check, n, dead[n]) for n in names)
        return superseded

    # ------------------------------------------------------------ deleting

    async def _delete(self, victims: list[tuple[_Listing, str]]) -> list[tuple[_Listing, str]]:
        """Delete ``victims`` at the versions known, in fenced multis; returns those that
        went.  A multi refused for one of its records (rewritten or deleted meanwhile)
        deletes nothing: its records are stat'ed again, and those unchanged are deleted in
        one more multi (the others wait for the next pass)."""
        gone: list[tuple[_Listing, str]] = []
        for start in range(0, len(victims), DELETES_PER_MULTI):
            chunk = victims[start:start + DELETES_PER_MULTI]
            if not await self._delete_multi(chunk):
                chunk = await self._unchanged(chunk)
                if not chunk or not await self._delete_multi(chunk):
                    continue
            gone += chunk
        return gone

    async def _delete_multi(self, victims: list[tuple[_Listing, str]]) -> bool:
        txn = self.term.fenced()
        for listing, name in victims:
            txn.delete(f"{listing.path}/{name}", version=listing.records[name].version)
        if not await commit_fenced_delete(txn):
            return False
        for listing, name in victims:
            del listing.records[name]
            if listing.cversion is not None:
                listing.cversion += 1  # our own change: no need to list it again
        return True

    async def _unchanged(self, victims: list[tuple[_Listing, str]]
                         ) -> list[tuple[_Listing, str]]:
        """Stat ``victims`` again: the gone are forgotten, the rewritten updated; returns
        those still at the version known."""
        same: list[tuple[_Listing, str]] = []

        async def restat(listing: _Listing, name: str) -> None:
            stat = await self.session.exists(f"{listing.path}/{name}")
            known = listing.records[name]
            if stat is None:
                del listing.records[name]
            elif stat.version != known.version:
                listing.records[name] = _Known.of(stat, known.key)
            else:
                same.append((listing, name))

        await bounded(functools.partial(restat, *victim) for victim in victims)
        return same


async def _refresh(records: dict[str, _Known], names: Iterable[str],
                   read: Callable[[str], Awaitable[_Known | None]]) -> None:
    """Make ``records`` match the listing ``names``: forget the gone, read the new."""
    present = set(names)
    for gone in set(records) - present:
        del records[gone]

    async def add(name: str) -> None:
        known = await read(name)
        if known is not None:
            records[name] = known

    await bounded(functools.partial(add, n) for n in present - set(records))


def _task_key(data: bytes) -> str | None:
    """The key of a task (its idempotency key, else its id) from a queue item's data."""
    try:
        doc = json.loads(data)
        return str(doc.get("key") or doc["id"])
    except (ValueError, TypeError, KeyError, AttributeError):
        return None


def limits_of(owner: Any) -> dict[str, Limit]:
    """The three limits from ``owner``'s ``<kind>_retention_count/_seconds`` attributes."""
    return {
        kind: Limit(getattr(owner, f"{attr}_retention_count"),
                    getattr(owner, f"{attr}_retention_seconds"))
        for kind, attr in (("results", "result"), ("dead", "dead"), ("failures", "failure"))
    }
