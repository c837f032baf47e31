"""``SearchClient``: scatter-gather search routed by the nodes' deployment records.

Guarantees:

* The deployment (which node serves which shard, at which address) is read from ZooKeeper
  through watches and cached: a query costs no ZooKeeper round trip.
* Every shard's query goes to one serving replica (rotating); when that replica fails,
  answers 404/503 or is slower than ``shard_timeout``, the next replica is tried.  A shard is
  reported *missing* only when no replica answered.
* A result is never silently partial: :attr:`SearchResult.partial` is true and
  :attr:`SearchResult.missing` names the shards when any shard could not be answered.
* An alias is resolved once per query, so a query sees one index version, never a mix, even
  while the alias is switched.
* Scores are comparable across shards (``scoring="global"``, the default), the way Katta
  did it: a first round asks every shard for its term statistics (documents, field lengths,
  document frequencies of the query's terms), the sums go with the query, and each shard
  re-scores its best candidates with them (:class:`GlobalStats`).  The statistics of a
  query are cached per index version (versions never change), so a repeated query costs
  one round.  ``scoring="local"`` keeps each shard's own BM25 (one round, scores drift).
"""

from __future__ import annotations

import heapq
import json
import math
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import attrs
import httpx
import trio

from examples.katta_like.layout import APP_NAME, IndexRecord, KattaPaths, shard_name
from examples.katta_like.store import GlobalStats, check_query
from framework import errors, get_logger
from framework.errors import FrameworkError
from framework.runtime import App
from framework.zk import Session, watch_children, watch_data

log = get_logger("examples.katta_like.client")

#: Seconds a replica that failed is tried last.
SUSPECT_FOR = 5.0
#: Global statistics kept per (index, query): an index version never changes.
STATS_CACHE = 4096


class UnknownIndex(FrameworkError):
    """No such index or alias."""


@attrs.frozen
class Hit:
    score: float
    url: str
    title: str
    shard: int


@attrs.frozen
class SearchResult:
    """A merged answer.  ``count`` sums the answered shards' hit counts; ``missing`` lists
    the shards no replica answered (then :attr:`partial` is true and ``count`` is short);
    ``state`` is the index's state when the query ran (``building`` has nothing to serve)."""

    index: str
    hits: list[Hit]
    count: int
    answered: list[int]
    missing: list[int]
    retries: int
    state: str = "deployed"

    @property
    def partial(self) -> bool:
        return bool(self.missing)

    def to_json(self) -> dict[str, Any]:
        return attrs.asdict(self) | {"partial": self.partial}


@attrs.define
class _IndexView:
    record: IndexRecord | None = None
    replicas: dict[int, dict[str, str]] = attrs.Factory(dict)  # shard -> node -> address
    ready: trio.Event = attrs.Factory(trio.Event)
    loaded: set[int] = attrs.Factory(set)


class SearchClient:
    """Use as ``async with SearchClient.open(session) as client: await client.search(q)``."""

    def __init__(self, session: Session, nursery: trio.Nursery, http: httpx.AsyncClient, *,
                 app: str = APP_NAME, shard_timeout: float = 1.0,
                 scoring: str = "global") -> None:
        if scoring not in ("global", "local"):
            raise FrameworkError(f"scoring must be 'global' or 'local', not {scoring!r}")
        if not shard_timeout > 0:
            raise FrameworkError(f"shard timeout must be positive, not {shard_timeout!r}")
        self.scoring = scoring
        self._stats: dict[tuple[str, str], GlobalStats] = {}
        self.session = session
        self.paths = KattaPaths(App(app))
        self.shard_timeout = shard_timeout
        self._nursery = nursery
        self._http = http
        self._views: dict[str, _IndexView] = {}
        self._aliases: dict[str, str | None] = {}
        self._alias_ready: dict[str, trio.Event] = {}
        self._rng = random.Random()
        self._suspect: dict[str, float] = {}

    @classmethod
    @asynccontextmanager
    async def open(cls, session: Session, *, app: str = APP_NAME, shard_timeout: float = 1.0,
                   scoring: str = "global") -> AsyncIterator[SearchClient]:
        limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
        async with httpx.AsyncClient(limits=limits, timeout=shard_timeout) as http:
            async with trio.open_nursery() as nursery:
                yield cls(session, nursery, http, app=app, shard_timeout=shard_timeout,
                          scoring=scoring)
                nursery.cancel_scope.cancel()

    # ------------------------------------------------------------ the cached view

    async def resolve(self, name: str) -> str:
        """The index an alias points to (or ``name`` itself when it is an index)."""
        if name not in self._alias_ready:
            self._alias_ready[name] = trio.Event()
            self._nursery.start_soon(self._watch_alias, name)
        await self._alias_ready[name].wait()
        return self._aliases.get(name) or name

    async def _watch_alias(self, name: str) -> None:
        async for snap in watch_data(self.session, self.paths.alias(name)):
            target = None
            if snap.data:
                try:
                    target = json.loads(snap.data)["index"]
                except (ValueError, KeyError, TypeError):
                    target = None
            self._aliases[name] = target
            self._alias_ready[name].set()

    async def view(self, index: str) -> _IndexView:
        view = self._views.get(index)
        if view is None:
            view = self._views[index] = _IndexView()
            self._nursery.start_soon(self._watch_index, index, view)
        await view.ready.wait()
        if view.record is None:
            raise UnknownIndex(f"no index or alias named {index!r} "
                               "(see `katta status` for the indexes)")
        return view

    async def _watch_index(self, index: str, view: _IndexView) -> None:
        async with trio.open_nursery() as nursery:
            started: set[int] = set()
            async for snap in watch_data(self.session, self.paths.index(index)):
                try:
                    view.record = IndexRecord.decode(snap.data) if snap.data else None
                except (ValueError, KeyError, TypeError, errors.ConfigurationError) as exc:
                    log.error("katta.bad_index_record", index=index, error=str(exc))
                    view.record = None  # searched as an unknown index, never half-read
                if view.record is None:
                    view.ready.set()
                    continue
                for shard in range(view.record.shards):
                    if shard not in started:
                        started.add(shard)
                        nursery.start_soon(self._watch_shard, index, shard, view)
                if not view.record.shards:
                    view.ready.set()

    async def _watch_shard(self, index: str, shard: int, view: _IndexView) -> None:
        base = self.paths.deployed(index, shard)
        async for snap in watch_children(self.session, base):
            replicas: dict[str, str] = {}
            for node in snap.children:
                try:
                    replicas[node] = json.loads((await self.session.get(f"{base}/{node}"))[0])[
                        "address"]
                except (errors.NoNodeError, ValueError, KeyError):
                    continue
            view.replicas[shard] = replicas
            view.loaded.add(shard)
            if view.record is not None and len(view.loaded) >= view.record.shards:
                view.ready.set()

    async def deployment(self, index: str) -> dict[int, dict[str, str]]:
        """Shard -> serving node -> address, as currently cached."""
        return dict((await self.view(await self.resolve(index))).replicas)

    # ------------------------------------------------------------ search

    async def search(self, query: str, *, index: str = "docs", top: int = 10) -> SearchResult:
        """Search every shard of ``index`` (or the index an alias names) and merge the top K."""
        check_query(query)
        if not 1 <= top <= 10_000:
            raise FrameworkError(f"--top must be 1..10000, not {top}")
        name = await self.resolve(index)
        view = await self.view(name)
        assert view.record is not None
        retries = [0]
        errors_seen: list[str] = []
        stats: GlobalStats | None = None
        if self.scoring == "global":
            key = (name, query)
            stats = self._stats.get(key)
            if stats is None:
                parts = await self._scatter(view, name, "/stats", {"query": query},
                                            retries, errors_seen)
                if errors_seen:
                    raise FrameworkError(errors_seen[0])
                stats = GlobalStats.merge(list(parts.values()))
                if len(parts) == view.record.shards:  # an index version never changes
                    if len(self._stats) >= STATS_CACHE:
                        self._stats.pop(next(iter(self._stats)))
                    self._stats[key] = stats
        body: dict[str, Any] = {"query": query, "top": top}
        if stats is not None:
            body["stats"] = stats.to_json()
        answers = await self._scatter(view, name, "/search", body, retries, errors_seen)
        if errors_seen:
            raise FrameworkError(errors_seen[0])
        merged = heapq.nlargest(top, (
            Hit(score, url, title, shard)
            for shard, answer in answers.items() for score, url, title in answer["hits"]),
            key=lambda h: (h.score, h.url))
        missing = sorted(set(range(view.record.shards)) - set(answers))
        return SearchResult(name, merged, sum(a["count"] for a in answers.values()),
                            sorted(answers), missing, retries[0], view.record.state)

    async def _scatter(self, view: _IndexView, name: str, endpoint: str,
                       body: dict[str, Any], retries: list[int], errors_seen: list[str]
                       ) -> dict[int, dict[str, Any]]:
        """Send ``body`` for every shard to one serving replica of it, one request per node
        (Katta's way: a node gets the list of its shards); a shard whose replica failed, was
        too slow or does not serve it (any more) is sent to its next replica, in rounds,
        until it answered or no replica is left."""
        assert view.record is not None
        answers: dict[int, dict[str, Any]] = {}
        tried: dict[int, set[str]] = {s: set() for s in range(view.record.shards)}
        pending = set(tried)
        first = True
        while pending and not errors_seen:
            now = trio.current_time()
            batches: dict[str, list[int]] = {}
            addresses: dict[str, str] = {}
            for shard in sorted(pending):
                candidates = [(n, a) for n, a in view.replicas.get(shard, {}).items()
                              if n not in tried[shard]]
                if not candidates:
                    pending.discard(shard)  # no replica left: reported missing
                    continue
                self._rng.shuffle(candidates)
                # healthy first (a killed node's records stay until its session expires),
                # then nodes already asked in this round (fewer requests)
                node, address = min(candidates, key=lambda c: (
                    self._suspect.get(c[0], -math.inf) > now - SUSPECT_FOR,
                    c[0] not in batches))
                tried[shard].add(node)
                batches.setdefault(node, []).append(shard)
                addresses[node] = address
                if not first:
                    retries[0] += 1
            first = False

            async def ask(node: str, address: str, shards: list[int]) -> None:
                try:
                    with trio.fail_after(self.shard_timeout):
                        response = await self._http.post(
                            f"http://{address}{endpoint}",
                            json={"index": name, "shards": shards, **body})
                except (httpx.HTTPError, trio.TooSlowError) as exc:
                    log.debug("katta.replica_failed", node=node, shards=shards, error=repr(exc))
                    self._suspect[node] = trio.current_time()
                    return
                if response.status_code == 400:
                    errors_seen.append(response.json().get("error", "bad request"))
                    return
                if response.status_code != 200:
                    self._suspect[node] = trio.current_time()
                    return
                for key, answer in response.json()["shards"].items():
                    if "error" not in answer:
                        answers[int(key)] = answer
                        pending.discard(int(key))
                    else:
                        log.debug("katta.replica_refused", node=node, shard=key,
                                  error=answer["error"])
                self._suspect.pop(node, None)

            async with trio.open_nursery() as nursery:
                for node, shards in batches.items():
                    nursery.start_soon(ask, node, addresses[node], shards)
        return answers


def describe_shard(shard: int) -> str:
    return shard_name(shard)
