"""``SearchClient``: scatter-gather search routed by the nodes' deployment records.

Guarantees:

* The deployment (which node serves which shard: the nodes' ``deployed/`` records; at
  which address: the nodes' own :class:`~framework.primitives.ServiceDiscovery` instances,
  ``/services/<app>/<node>``), the index records and the aliases are read through watches
  and cached: a query costs no ZooKeeper round trip.  A replica is routed to only while its
  node has both a deployment record and a registration.
* **SUSPENDED** or **LOST** (the client's own session): the cache is kept as it was and
  queries go on; the nodes' answers decide (a node that stopped serving answers the shard
  in ``refused``, a dead one does not answer) and the next replica is asked.  Connected
  again (the same session or a new one) every watch reads again and the cache catches up.
* Every shard's query goes to one serving replica; a shard whose replica failed, refused
  it, or is slower than :meth:`SearchClient.hedge_delay` is sent to its next replica (see
  :meth:`SearchClient.search`).  A shard is *missing* only when no replica answered it.
* A result is never silently partial: :attr:`SearchResult.partial` is true and
  :attr:`SearchResult.missing` names the shards when any shard could not be answered.  With
  global scoring a shard that did not answer the statistics round is not searched and is
  missing (never scored with statistics that leave it out).
* An alias is resolved once per query: a query sees one index version, never a mix, even
  while the alias is switched.
* ``scoring="global"`` (the default): scores are comparable across shards - every shard
  re-scores its best candidates with the whole index's term statistics
  (:class:`GlobalStats`, gathered in a first round).  Each term's statistics are kept per
  index version (the index record's znode: removed and added again is another version),
  as a version never changes: a query whose terms were all seen skips the first round.
  ``scoring="local"``: each shard's own BM25, one round.

Raises: :class:`UnknownIndex` (no such index or alias), :class:`FrameworkError` (bad query
syntax, ``top`` out of range, an index record that cannot be read, a node's error answer:
bad request or query syntax).
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any, Literal, overload

import attrs
import trio

from examples.katta_like.layout import (
    APP_NAME,
    AliasRecord,
    DeploymentInfo,
    IndexRecord,
    IndexState,
    KattaPaths,
    bad_record,
    decode_logged,
    discovery,
    read_record,
    shard_name,
)
from examples.katta_like.links import LinkFailed, NodeLinks
from examples.katta_like.store import (
    GlobalStats,
    ShardResult,
    ShardStats,
    check_query,
    query_terms,
)
from examples.katta_like.wire import REPLIES, Answer, Kind, ProtocolError, ShardRequest
from framework import errors, get_logger, records
from framework.errors import FrameworkError
from framework.runtime import App
from framework.zk import Session, watch_children, watch_data

log = get_logger("examples.katta_like.client")

#: Seconds a replica that failed is tried last.
SUSPECT_FOR = 5.0
#: Term statistics kept per index version: at most this many terms (then forgotten at
#: once) and this many versions (the oldest forgotten first).
STATS_TERMS = 200_000
STATS_VERSIONS = 16
#: Answered requests whose latency sets the hedge delay, and how many more answers it is
#: computed again after.
LATENCY_SAMPLES = 256
P95_EVERY = 16


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
    state: IndexState = IndexState.DEPLOYED
    hedged: int = 0  # of the retries, shards also sent elsewhere because a replica was slow

    @property
    def partial(self) -> bool:
        return bool(self.missing)

    def to_json(self) -> dict[str, Any]:
        """The result as plain values (``katta search --json``), ``partial`` included."""
        return records.unstructure(self) | {"partial": self.partial}


@attrs.define
class _TermStats:
    """What the statistics rounds said of one index version, every shard summed: its
    documents, tokens per field and document frequency per ``"field:term"``."""

    docs: int
    tokens: dict[str, int]
    df: dict[str, int] = attrs.Factory(dict)

    def of(self, keys: list[str]) -> GlobalStats | None:
        """The query's statistics (as :meth:`GlobalStats.merge` of its round would give)
        if every one of ``keys`` is known."""
        if not all(k in self.df for k in keys):
            return None
        return GlobalStats(self.docs, {f: n / self.docs if self.docs else 0.0
                                       for f, n in self.tokens.items()},
                           {k: self.df[k] for k in keys})


@attrs.define
class _IndexView:
    record: IndexRecord | None = None
    version: int = 0  # the index record's czxid: another one is another index
    corrupt: str = ""  # why the record (there is one) cannot be read
    replicas: dict[int, dict[str, str]] = attrs.Factory(dict)  # shard -> node -> address
    #: shard -> the nodes with a deployment record (routed to once registered)
    serving: dict[int, set[str]] = attrs.Factory(dict)
    ready: trio.Event = attrs.Factory(trio.Event)
    loaded: set[int] = attrs.Factory(set)
    changed: trio.Event = attrs.Factory(trio.Event)  # set (and replaced) at each change

    def changes(self) -> None:
        self.changed.set()
        self.changed = trio.Event()

    def route(self, nodes: dict[str, str], shards: Any = None) -> None:
        """``replicas`` again from ``serving`` and the registered nodes' addresses (of
        ``shards``, default every shard)."""
        for shard in self.serving if shards is None else shards:
            self.replicas[shard] = {n: nodes[n] for n in sorted(self.serving[shard])
                                    if n in nodes}
        self.changes()


class SearchClient:
    """Use as ``async with SearchClient.open(session) as client: await client.search(q)``."""

    #: Hedge delay bounds and factor (see :meth:`hedge_delay`), seconds.
    hedge_floor: float = 0.02
    hedge_max: float = 0.1
    hedge_factor: float = 2.0
    #: Hedge budget: each request sent earns ``hedge_ratio`` of a hedge, up to
    #: ``hedge_burst`` saved; a hedge spends one (no storm of hedges when all are slow).
    #: A request whose node answered nothing for ``hedge_max`` since is hedged anyway.
    hedge_ratio: float = 0.1
    hedge_burst: float = 20.0

    def __init__(self, session: Session, nursery: trio.Nursery, links: NodeLinks, *,
                 app: str = APP_NAME, shard_timeout: float = 1.0,
                 scoring: str = "global") -> None:
        if scoring not in ("global", "local"):
            raise FrameworkError(f"scoring must be 'global' or 'local', not {scoring!r}")
        if not shard_timeout > 0:
            raise FrameworkError(f"shard timeout must be positive, not {shard_timeout!r}")
        self.scoring = scoring
        self._stats: dict[tuple[str, int], _TermStats] = {}
        self.session = session
        self.paths = KattaPaths(App(app))
        self.shard_timeout = shard_timeout
        self._nursery = nursery
        self._links = links
        self._views: dict[str, _IndexView] = {}
        #: registered node -> ``host:port`` (its discovery instance), and whether read once
        self._nodes: dict[str, str] = {}
        self._nodes_read = trio.Event()
        self._aliases: dict[str, str | None] = {}
        self._alias_ready: dict[str, trio.Event] = {}
        self._rng = random.Random()
        self._suspect: dict[str, float] = {}
        self._answered_at: dict[str, float] = {}  # node -> when it last answered
        self._busy: dict[str, int] = {}  # node -> this client's calls to it in flight
        self._hedge_tokens = self.hedge_burst
        self._latencies: deque[float] = deque(maxlen=LATENCY_SAMPLES)
        self._p95: float | None = None  # of _latencies, as of _unsorted answers ago
        self._unsorted = 0

    @classmethod
    @asynccontextmanager
    async def open(cls, session: Session, *, app: str = APP_NAME, shard_timeout: float = 1.0,
                   scoring: str = "global") -> AsyncIterator[SearchClient]:
        async with trio.open_nursery() as nursery:
            links = NodeLinks(nursery)
            try:
                client = cls(session, nursery, links, app=app, shard_timeout=shard_timeout,
                             scoring=scoring)
                nursery.start_soon(client._watch_nodes)
                yield client
            finally:
                links.close()
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
        path = self.paths.alias(name)
        async for snap in watch_data(self.session, path):
            alias = decode_logged(snap.data, AliasRecord, path) if snap.data else None
            self._aliases[name] = alias.index if alias is not None else None
            self._alias_ready[name].set()

    async def _watch_nodes(self) -> None:
        """Follow the nodes' registrations (one discovery watch for the client)."""
        async for instances in discovery(self.session).watch(self.paths.service):
            nodes = {i.id: i.endpoint for i in instances}
            if nodes != self._nodes:
                self._nodes = nodes
                for view in self._views.values():
                    view.route(nodes)
            self._nodes_read.set()

    async def _view(self, index: str) -> _IndexView:
        view = self._views.get(index)
        if view is None:
            view = self._views[index] = _IndexView()
            self._nursery.start_soon(self._watch_index, index, view)
        await view.ready.wait()
        await self._nodes_read.wait()
        return view

    async def view(self, index: str) -> _IndexView:
        view = await self._view(index)
        if view.corrupt:
            raise FrameworkError(f"cannot search index {index!r}: {view.corrupt}")
        if view.record is None:
            raise UnknownIndex(f"no index or alias named {index!r} "
                               "(see `katta status` for the indexes)")
        return view

    async def _watch_index(self, index: str, view: _IndexView) -> None:
        async with trio.open_nursery() as nursery:
            started: set[int] = set()
            path = self.paths.index(index)
            async for snap in watch_data(self.session, path):
                view.record, view.corrupt = None, ""
                view.version = snap.stat.czxid if snap.stat is not None else 0
                try:  # a corrupt record is an error for the searches, never half-read
                    view.record = read_record(snap.data, IndexRecord, path) if snap.data else None
                except records.CorruptRecord as exc:
                    bad_record(path, exc)
                    view.corrupt = str(exc)
                view.changes()
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
            serving: set[str] = set()
            for node in snap.children:
                try:
                    data, _ = await self.session.get(f"{base}/{node}")
                except errors.NoNodeError:
                    continue
                if decode_logged(data, DeploymentInfo, f"{base}/{node}") is not None:
                    serving.add(node)
            view.serving[shard] = serving
            view.loaded.add(shard)
            view.route(self._nodes, [shard])
            if view.record is not None and len(view.loaded) >= view.record.shards:
                view.ready.set()

    async def wait_routable(self, index: str, replicas: int = 1) -> None:
        """Wait (on this client's watches, no polling) until its cached deployment of
        ``index`` (or the index an alias names) has ``replicas`` serving nodes for every
        shard: a search sent now reaches every shard."""
        view = await self._view(await self.resolve(index))
        while view.record is None or any(len(view.replicas.get(s, {})) < replicas
                                         for s in range(view.record.shards)):
            await view.changed.wait()

    async def deployment(self, index: str) -> dict[int, dict[str, str]]:
        """Shard -> serving node -> address, as currently cached."""
        return dict((await self.view(await self.resolve(index))).replicas)

    # ------------------------------------------------------------ search

    async def search(self, query: str, *, index: str = "docs", top: int = 10) -> SearchResult:
        """Search every shard of ``index`` (or the index an alias names) and merge the best
        ``top`` hits.

        Each shard is asked of one serving replica: healthy ones first, then one already
        asked in this round (fewer calls), then the one with the fewest of this client's
        calls in flight.  A replica that fails (its connection, an unreadable answer) or
        refuses the shard: the next replica at once.  A request running longer than
        :meth:`hedge_delay`: its shards are *also* sent to the next replica (the first
        answer wins), within a budget of ``hedge_ratio`` hedges per request
        (``hedge_burst`` saved); a request whose node answered nothing at all for
        ``hedge_max`` is hedged even over budget and the node is tried last for a while.
        A request is abandoned after ``shard_timeout``.
        With global scoring a shard counts as answered only if it answered both rounds."""
        check_query(query)
        if not 1 <= top <= 10_000:
            raise FrameworkError(f"--top must be 1..10000, not {top}")
        name = await self.resolve(index)
        view = await self.view(name)
        assert view.record is not None
        every = list(range(view.record.shards))
        counts = _Counts()
        errors_seen: list[str] = []
        stats: GlobalStats | None = None
        searched = every
        request = ShardRequest(name, (), query, top)
        if self.scoring == "global":
            key = (name, view.version)
            keys = [f"{field}:{term}" for field, term in query_terms(query)]
            known = self._stats.get(key)
            stats = known.of(keys) if known is not None else None
            if stats is None:
                parts = await self._scatter(view, Kind.STATS, request, every, counts,
                                            errors_seen)
                if errors_seen:
                    raise FrameworkError(errors_seen[0])
                stats = GlobalStats.merge([parts[s] for s in sorted(parts)])
                searched = sorted(parts)
                if len(parts) == view.record.shards:  # an index version never changes
                    self._remember(key, parts)
                else:
                    log.warning("katta.stats_missing", index=name, query=query,
                                missing=sorted(set(every) - set(parts)))
        answers = await self._scatter(view, Kind.SEARCH, attrs.evolve(request, stats=stats),
                                      searched, counts, errors_seen) if searched else {}
        if errors_seen:
            raise FrameworkError(errors_seen[0])
        merged = heapq.nlargest(top, (
            Hit(hit.score, hit.url, hit.title, shard)
            for shard, answer in answers.items() for hit in answer.hits),
            key=lambda h: (h.score, h.url))
        missing = sorted(set(every) - set(answers))
        return SearchResult(name, merged, sum(a.count for a in answers.values()),
                            sorted(answers), missing, counts.retries, view.record.state,
                            counts.hedged)

    def _remember(self, key: tuple[str, int], parts: dict[int, ShardStats]) -> None:
        """Keep the term statistics of a round every shard of index version ``key``
        answered."""
        merged = GlobalStats.merge(list(parts.values()))
        known = self._stats.get(key)
        if known is None or len(known.df) + len(merged.df) > STATS_TERMS:
            if known is None and len(self._stats) >= STATS_VERSIONS:
                self._stats.pop(next(iter(self._stats)))
            tokens: dict[str, int] = {}
            for part in parts.values():
                for field, n in part.tokens.items():
                    tokens[field] = tokens.get(field, 0) + n
            known = self._stats[key] = _TermStats(merged.docs, tokens)
        known.df.update(merged.df)

    async def _call(self, address: str, kind: Kind, request: ShardRequest) -> Answer:
        """One call to the node at ``address`` (see :class:`NodeLinks`), unbounded."""
        return await self._links.call(address, kind, request)

    def hedge_delay(self) -> float:
        """Seconds a request may run before its shards are also sent to another replica:
        ``hedge_factor`` x the 95th percentile of the recent answered requests' latencies,
        at least ``hedge_floor``, at most ``hedge_max`` (also while there are too few
        samples).  The percentile is computed again every :data:`P95_EVERY` answers."""
        if len(self._latencies) < 20:
            return self.hedge_max
        if self._p95 is None or self._unsorted >= P95_EVERY:
            ordered = sorted(self._latencies)
            self._p95 = ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]
            self._unsorted = 0
        return min(self.hedge_max, max(self.hedge_floor, self.hedge_factor * self._p95))

    @overload
    async def _scatter(self, view: _IndexView, kind: Literal[Kind.STATS],
                       request: ShardRequest, shards: list[int], counts: _Counts,
                       errors_seen: list[str]) -> dict[int, ShardStats]: ...

    @overload
    async def _scatter(self, view: _IndexView, kind: Literal[Kind.SEARCH],
                       request: ShardRequest, shards: list[int], counts: _Counts,
                       errors_seen: list[str]) -> dict[int, ShardResult]: ...

    async def _scatter(self, view: _IndexView, kind: Kind, request: ShardRequest,
                       shards: list[int], counts: _Counts,
                       errors_seen: list[str]) -> dict[int, Any]:
        """Ask one serving replica for each of ``shards`` (one call per node, with
        the list of its shards), trying the next replica as :meth:`search` says.  Returns
        shard -> answer when every shard answered, or no replica is left to try for the
        others (missing from the answers); a node's error answer is appended to
        ``errors_seen``.  The steps are :class:`_Scatter`'s."""
        assert view.record is not None
        return await _Scatter(self, view, kind, request, shards, counts, errors_seen).run()

    def _hedge_after(self) -> float:
        """The age at which a request is hedged now: :meth:`hedge_delay` within the hedge
        budget; over it, at least ``hedge_max`` (then only a silent node's is hedged)."""
        delay = self.hedge_delay()
        return max(delay, self.hedge_max) if self._hedge_tokens < 1 else delay

    def _earn_hedge(self) -> None:
        """A first request of a round was sent: ``hedge_ratio`` more of the budget."""
        self._hedge_tokens = min(self.hedge_burst, self._hedge_tokens + self.hedge_ratio)

    def _answered(self, node: str, started: float) -> None:
        """``node`` answered a request sent at ``started``: a latency sample, and it is
        healthy (not suspect) again."""
        now = trio.current_time()
        self._latencies.append(now - started)
        self._unsorted += 1
        self._answered_at[node] = now
        self._suspect.pop(node, None)

    def _suspect_silent(self, requests: set[_Request]) -> None:
        """Of ``requests`` (a round's, left unanswered): a node hedged that answered
        nothing at all since its request was sent is tried last for a while."""
        now = trio.current_time()
        for slow in requests:
            if slow.hedged and self._answered_at.get(slow.node, -math.inf) < slow.started:
                self._suspect[slow.node] = now

    def _pick_replica(self, view: _IndexView, shard: int, tried: set[str],
                      batches: Mapping[str, list[int]], now: float) -> tuple[str, str] | None:
        """The (node, address) to ask next for ``shard`` among its replicas not ``tried``
        yet (``None``: none left): healthy first (a killed node's records stay until its
        session expires), then nodes already asked in this round (``batches``: fewer
        calls, and a node's call re-scores for the best of its shards together), then the
        least busy with this client's calls (a call waits behind those sent before it);
        ties at random."""
        candidates = [(n, a) for n, a in view.replicas.get(shard, {}).items()
                      if n not in tried]
        if not candidates:
            return None
        self._rng.shuffle(candidates)
        return min(candidates, key=lambda c: (
            self._suspect.get(c[0], -math.inf) > now - SUSPECT_FOR,
            c[0] not in batches, self._busy.get(c[0], 0)))

    def _hedge(self, slow: _Request, now: float, delay: float, answers: Mapping[int, Any]
               ) -> list[int]:
        """The shards of ``slow`` to ask again elsewhere now (``[]``: not yet, or over the
        hedge budget while its node is only busy).  A request is hedged once it is
        ``delay`` old; its node is suspect when it said nothing for ``hedge_max`` since the
        request was sent (frozen or gone, not only busy with other requests)."""
        if slow.started + delay > now:
            return []
        slow.hedged = True
        silent = (now - slow.started >= self.hedge_max
                  and self._answered_at.get(slow.node, -math.inf) < slow.started)
        if self._hedge_tokens >= 1:
            self._hedge_tokens -= 1
        elif not silent:
            log.debug("katta.hedge_skipped", node=slow.node)
            return []  # over budget, and the node is busy: wait for it
        if silent:
            self._suspect[slow.node] = now
        todo = [s for s in slow.shards if s not in answers]
        log.debug("katta.hedged", node=slow.node, shards=todo,
                  after=round(now - slow.started, 4))
        return todo


async def _next_answer(done: trio.MemoryReceiveChannel[_Request], due: list[_Request],
                       delay: float) -> _Request | None:
    """The next request answered (an answer already in first), or ``None`` when the first
    of ``due`` turns ``delay`` old before any answer comes."""
    try:
        return done.receive_nowait()
    except trio.WouldBlock:
        with trio.move_on_at(min((r.started + delay for r in due), default=math.inf)):
            return await done.receive()
    return None


class _Scatter:
    """One round of a search (:meth:`SearchClient._scatter`), in steps: pick a replica per
    shard (:meth:`pick`), send one call per node (:meth:`send`), collect the answers with
    the calls' deadlines (:meth:`collect`, :meth:`ask`), and keep the first answer of each
    shard (:meth:`take`).  The client's routing state (suspects, calls in flight, latencies,
    hedge budget) is shared by its rounds; this holds the round's own."""

    def __init__(self, client: SearchClient, view: _IndexView, kind: Kind,
                 request: ShardRequest, shards: list[int], counts: _Counts,
                 errors_seen: list[str]) -> None:
        self.client = client
        self.view = view
        self.kind = kind
        self.request = request
        self.shards = shards
        self.counts = counts
        self.errors_seen = errors_seen
        self.answers: dict[int, Any] = {}
        self.tried: dict[int, set[str]] = {s: set() for s in shards}
        self.in_flight: dict[int, int] = {s: 0 for s in shards}
        self.exhausted: set[int] = set()  # no replica left to try
        self.outstanding: set[_Request] = set()
        self.done_send, self.done_receive = trio.open_memory_channel[_Request](math.inf)
        self.first = True  # the first sends: not retries, and they earn hedge budget

    async def run(self) -> dict[int, Any]:
        """Ask, collect and return shard -> answer (see :meth:`SearchClient._scatter`);
        the requests still running are cancelled (their late answers are dropped)."""
        async with trio.open_nursery() as nursery:
            self.dispatch(nursery, sorted(self.shards))
            self.first = False
            await self.collect(nursery)
            self.client._suspect_silent(self.outstanding)
            nursery.cancel_scope.cancel()  # answered: the slow requests are not needed
        return self.answers

    def dispatch(self, nursery: trio.Nursery, todo: list[int]) -> int:
        """Send each shard of ``todo`` to its next replica, one call per node; a shard
        with no replica left is ``exhausted``.  Returns the number of shards sent."""
        now = trio.current_time()
        batches, addresses = self.pick(todo, now)
        for node, batch in batches.items():
            self.send(nursery, _Request(node, batch, now), addresses[node])
        return sum(len(batch) for batch in batches.values())

    def pick(self, todo: list[int], now: float) -> tuple[dict[str, list[int]], dict[str, str]]:
        """node -> the shards of ``todo`` to ask it, and node -> its address (see
        :meth:`SearchClient._pick_replica`); a pick after the first sends is a retry."""
        batches: dict[str, list[int]] = {}
        addresses: dict[str, str] = {}
        for shard in todo:
            picked = self.client._pick_replica(self.view, shard, self.tried[shard], batches,
                                               now)
            if picked is None:
                self.exhausted.add(shard)
                continue
            node, address = picked
            self.tried[shard].add(node)
            batches.setdefault(node, []).append(shard)
            addresses[node] = address
            if not self.first:
                self.counts.retries += 1
        return batches, addresses

    def send(self, nursery: trio.Nursery, sent: _Request, address: str) -> None:
        """Start ``sent``'s call (:meth:`ask`) and count it in flight."""
        if self.first:
            self.client._earn_hedge()
        self.outstanding.add(sent)
        busy = self.client._busy
        busy[sent.node] = busy.get(sent.node, 0) + 1
        for shard in sent.shards:
            self.in_flight[shard] += 1
        nursery.start_soon(self.ask, sent, address)

    async def ask(self, sent: _Request, address: str) -> None:
        """One call, abandoned after the client's ``shard_timeout``: its answer is taken,
        its error answer is appended to ``errors_seen``; a failed call (connection, an
        unreadable answer, the timeout) makes its node suspect.  Then ``sent`` is done."""
        try:
            answer = await self.call(sent, address)
            if answer.error is not None:
                self.errors_seen.append(answer.error)
            else:
                self.take(sent, answer)
        except (LinkFailed, ProtocolError, trio.TooSlowError,
                records.CorruptRecord) as exc:
            log.debug("katta.replica_failed", node=sent.node, shards=sent.shards,
                      error=repr(exc))
            self.client._suspect[sent.node] = trio.current_time()
        self.done_send.send_nowait(sent)

    async def call(self, sent: _Request, address: str) -> Answer:
        """``sent``'s call, within ``shard_timeout`` (raises :class:`trio.TooSlowError`)."""
        client = self.client
        try:
            with trio.fail_after(client.shard_timeout):
                return await client._call(address, self.kind, attrs.evolve(
                    self.request, shards=tuple(sent.shards)))
        finally:
            client._busy[sent.node] -= 1

    def take(self, sent: _Request, answer: Answer) -> None:
        """Keep the first answer of each shard ``answer`` has (raises
        :class:`records.CorruptRecord` if it is not this round's reply)."""
        reply = records.structure(answer.reply, REPLIES[self.kind])
        self.client._answered(sent.node, sent.started)
        for shard, result in reply.shards.items():
            self.answers.setdefault(shard, result)
        for shard, why in reply.refused.items():
            log.debug("katta.replica_refused", node=sent.node, shard=shard, error=why)

    async def collect(self, nursery: trio.Nursery) -> None:
        """Wait for the answers until every shard answered or has no replica left (or a
        node answered an error): a shard whose call failed or was refused goes to its next
        replica at once, a request slower than the hedge delay is hedged."""
        while not self.errors_seen:
            open_shards = [s for s in self.shards if s not in self.answers]
            idle = [s for s in open_shards if not self.in_flight[s] and s not in self.exhausted]
            if idle:
                self.dispatch(nursery, idle)  # failed or refused: the next replica at once
            if not any(self.in_flight[s] for s in open_shards):
                return  # every shard answered, or no replica left for the rest
            delay = self.client._hedge_after()
            due = self.due()
            finished = await _next_answer(self.done_receive, due, delay)
            if finished is None:
                self.hedge(nursery, due, delay)
                continue
            self.outstanding.discard(finished)
            for shard in finished.shards:
                self.in_flight[shard] -= 1

    def due(self) -> list[_Request]:
        """The requests that may still be hedged: not hedged yet, and with a shard not
        answered that has replicas left."""
        return [r for r in self.outstanding if not r.hedged
                and any(s not in self.answers and s not in self.exhausted for s in r.shards)]

    def hedge(self, nursery: trio.Nursery, due: list[_Request], delay: float) -> None:
        """Also send the shards of the requests of ``due`` older than ``delay`` elsewhere
        (see :meth:`SearchClient._hedge`)."""
        now = trio.current_time()
        for slow in due:
            todo = self.client._hedge(slow, now, delay, self.answers)
            if todo:  # counted once sent: a shard with no replica left is not a hedge
                self.counts.hedged += self.dispatch(nursery, todo)


@attrs.define(eq=False)
class _Request:
    """One call of a scatter: a node and the shards it was asked for."""

    node: str
    shards: list[int]
    started: float
    hedged: bool = False


@attrs.define
class _Counts:
    """Re-sends of one query: ``retries`` (every shard sent to another replica, after a
    failure or as a hedge), ``hedged`` (those sent because a replica was slow)."""

    retries: int = 0
    hedged: int = 0


def describe_shard(shard: int) -> str:
    return shard_name(shard)
