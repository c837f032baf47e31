"""``SearchNode``: builds shards (pull mode) and serves its assigned shards over TCP
(length-prefixed msgpack frames, :mod:`examples.katta_like.wire`).

Run it with ``python -m framework run examples.katta_like.node:SearchNode --app katta``.
Settings come from the environment: ``KATTA_STORE`` (the shard store, default
``out/katta/store``), ``KATTA_DATA`` (this node's local disk, default
``out/katta/nodes/<name>``; one that cannot be created or written is a
:class:`ConfigurationError` when the node starts), ``KATTA_LISTEN`` (where the query
listener binds: ``HOST``, ``HOST:PORT`` or ``0.0.0.0``; default the address of the interface
that routes to ZooKeeper - loopback only when ZooKeeper is on loopback - and any free port),
``--address`` / ``KATTA_ADVERTISE`` (what the node publishes; default where it listens: the
rule of :mod:`framework.addresses`; an address it cannot bind stops it at start, in one
line) and ``KATTA_TLS_*`` (TLS on the query links, see
:mod:`examples.katta_like.wire`).

Guarantees:

* It serves exactly the shards assigned to it (the runtime's
  ``assignments/<me>/<index>.<shard>``), and only while its ZooKeeper session is trusted.
* **SUSPENDED** past the trust deadline, or **LOST**: the runtime cancels every shard at
  once; from then on the query protocol answers each of them in ``refused``, although the
  deployment records stay on the server until it expires the session.  Even before that
  cancellation runs, an answer for a shard is given only if the session that announced it
  is still trusted (:meth:`Session.ensure_trusted`).  Connected again (the same session or
  a new one), it follows its assignments again.
* Where it answers is published once, by the framework's
  :class:`~framework.primitives.ServiceDiscovery`: the instance ``/services/<app>/<me>``
  (advertised address and port, :class:`NodePayload`), ephemeral, registered again after a
  session loss; a node restarted under its name registers once its previous session is
  gone.  A shard is announced (the runtime's ephemeral ``deployed/<index>.<shard>/<me>``, a
  :class:`DeploymentInfo`, through :meth:`Worker.ready`) only after the node was registered
  and the shard was copied to local disk, verified against its manifest and opened.  A
  corrupt shard, or a shard spec that is not a :class:`ShardSpec`, is refused
  (:class:`PermanentFailure`: the runtime's ``refused/``) and never served.  A shard store
  that cannot be reached is not a corrupt shard: the copy is tried again with a capped
  backoff (:attr:`SearchNode.store_backoff`, ``shard.store_unavailable`` events) until the
  store answers or the shard is unassigned.
* Unassigned (or its index removed), a shard's record is withdrawn first, then its searcher
  closed, then its local copy deleted.  Stopped for another reason (the session not
  trusted, the node stopping) the local copy is kept; served again, it is verified against
  the store's manifest and reopened, not copied again.
* A build task whose payload is not a :class:`BuildTask` fails permanently; a shard is
  published in the store atomically or not at all (:meth:`ShardStore.build_shard`).
"""

from __future__ import annotations

import os
import shutil
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from examples.katta_like.corpus import documents, shard_of
from examples.katta_like.layout import (
    APP_NAME,
    BuildResult,
    BuildTask,
    DeploymentInfo,
    KattaPaths,
    NodeHealth,
    ShardSpec,
    discovery,
    node_instance,
    parse_replica,
    read_record,
)
from examples.katta_like.searcher import ShardSearcher, search_shards
from examples.katta_like.store import (
    CorruptShard,
    ShardStore,
    fetch_shard,
    reuse_local,
    shard_dir_name,
)
from examples.katta_like.wire import (
    FROM_ENV,
    Answer,
    Call,
    ErrorReply,
    FrameReader,
    Kind,
    ProtocolError,
    SearchReply,
    ShardRequest,
    StatsReply,
    frame,
    link_tls,
    unpack,
)
from framework import (
    LinkTls,
    StoreUnavailable,
    Worker,
    choose_endpoint,
    errors,
    get_logger,
    open_listeners,
    records,
    tls_server_stream,
)
from framework.retry import Backoff
from framework.runtime import Task
from framework.zk import Session

log = get_logger("examples.katta_like.node")

#: Errors that say the shard store could not be reached, not that the shard is bad.
_STORE_DOWN = (StoreUnavailable, ConnectionError, TimeoutError)


def default_store() -> Path:
    return Path(os.environ.get("KATTA_STORE", "out/katta/store"))


class SearchNode(Worker):
    """A Katta search node (see the module docstring for its guarantees)."""

    app_name = APP_NAME
    concurrency = 1
    status_interval = 0.5
    #: Delays between attempts to copy a shard while its store cannot be reached.
    store_backoff = Backoff(0.5, 15.0)

    def __init__(self, *args: Any, tls: LinkTls | None = FROM_ENV, **kwargs: Any) -> None:
        """``tls``: the query links' TLS (default ``$KATTA_TLS*``; ``None``: plain TCP); a
        setting that cannot work is a one-line :class:`ConfigurationError` here."""
        super().__init__(*args, **kwargs)
        self.paths = KattaPaths(self.app)
        self.store = ShardStore(default_store())
        self.data_dir = Path(os.environ.get("KATTA_DATA") or f"out/katta/nodes/{self.name}")
        #: where to listen and what to publish (see the module doc)
        self.listen = os.environ.get("KATTA_LISTEN", "")
        self.advertise = self.address or os.environ.get("KATTA_ADVERTISE", "")
        self.tls = link_tls() if tls is FROM_ENV else tls
        self._server_tls = None if self.tls is None else self.tls.server_context()
        self.served: dict[tuple[str, int], ShardSearcher] = {}
        self._active: set[tuple[str, int]] = set()  # shards in serve_shard now
        self._owned_in: dict[tuple[str, int], int | None] = {}  # listed: session id
        self._registered = trio.Event()  # our discovery instance was created once
        self.queries = 0

    # ------------------------------------------------------------ index build (pull mode)

    async def handle(self, task: Task) -> Any:
        """Build one shard (a :class:`BuildTask`) into the store and publish it; the result
        is a :class:`BuildResult`.  A payload that is not a build task is a
        :class:`PermanentFailure` (running it again would not help)."""
        try:
            build_task = records.structure(task.payload, BuildTask)
        except records.CorruptRecord as exc:
            raise errors.PermanentFailure(f"task {task.id}: {exc}") from None
        record, shard = build_task.record, build_task.shard
        store = ShardStore(record.store)

        def build() -> BuildResult:
            docs = (d for d in documents(record.corpus)
                    if shard_of(d.url, record.shards) == shard)
            manifest = store.build_shard(record.name, shard, docs)
            return BuildResult(manifest.docs, manifest.checksum)

        result = await trio.to_thread.run_sync(build)
        log.info("shard.built", index=record.name, shard=shard, docs=result.docs,
                 checksum=result.checksum)
        return records.unstructure(result)

    def health(self) -> dict[str, Any]:
        return records.unstructure(NodeHealth(True, len(self.served), self.queries))

    # ------------------------------------------------------------ runtime

    @asynccontextmanager
    async def lifetime(self, session: Session) -> AsyncIterator[None]:
        """The node's disk, its query listener and its discovery instance, for as long as
        the node runs (its address also goes into its group status)."""
        try:
            self.data_dir.mkdir(parents=True, exist_ok=True)
            if not os.access(self.data_dir, os.W_OK | os.X_OK):
                raise PermissionError("not writable")
        except OSError as exc:
            raise errors.ConfigurationError(
                f"KATTA_DATA: cannot use {str(self.data_dir)!r} as this node's disk "
                f"({exc.strerror or exc})") from None
        endpoint = choose_endpoint(self.listen, self.advertise, zk_hosts=session.hosts,
                                   what="KATTA_LISTEN")
        listeners, self.address = await open_listeners(endpoint, what="KATTA_LISTEN")
        host, port = listeners[0].socket.getsockname()[:2]
        instance = node_instance(self.paths, self.name, self.address,
                                 tls=self.tls is not None, host=socket.gethostname())
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.serve_listeners, self.serve_connection, listeners)
            # in the background: a name still registered by a previous incarnation's session
            # delays our shards' announcements, not the runtime's join (which refuses it)
            nursery.start_soon(self._stay_registered, session, instance)
            log.info("node.listening", node=self.name, address=self.address,
                     listen=f"{host}:{port}", tls=self.tls is not None)
            yield
            nursery.cancel_scope.cancel()

    async def _stay_registered(self, session: Session, instance: Any) -> None:
        async with discovery(session).register(instance):
            self._registered.set()
            await trio.sleep_forever()

    # ------------------------------------------------------------ serving (push mode)

    async def serve_shard(self, shard: str, spec: bytes) -> None:
        """Serve one assigned shard (the runtime's replicated push mode): copy it to local
        disk (or reuse the local copy kept from an earlier serving, verified against the
        store's manifest), verify it, open it, then say it is ready (the runtime writes the
        serving record); unassigned, the record is withdrawn, the searcher closed, the
        local copy deleted.  Stopped for another reason (the session not trusted, the node
        stopping) the local copy is kept, to be verified and reopened.  A corrupt shard, or
        a ``spec`` that is not a :class:`ShardSpec`, is refused (PermanentFailure): never
        served here."""
        try:
            parsed = read_record(spec, ShardSpec, f"{self.app.shards}/{shard}")
        except records.CorruptRecord as exc:
            raise errors.PermanentFailure(str(exc)) from None
        index, number, store = parsed.index, parsed.shard, ShardStore(parsed.store)
        key = (index, number)
        local = self.data_dir / index / shard_dir_name(number)
        self._active.add(key)
        try:  # from here on, if it ends unassigned (or corrupt), the local copy goes
            reused, searcher = await self._open_shard(store, index, number, local)
            if reused:
                log.info("shard.reopened", node=self.name, index=index, shard=number)
            self.served[key] = searcher
            info = DeploymentInfo(searcher.searcher.num_docs)
            await self._registered.wait()  # clients find where we are before we are listed
            async with self.ready(shard, records.unstructure(info)) as listed:
                if not listed:
                    log.info("shard.index_gone", node=self.name, index=index, shard=number)
                    return
                assert self.session is not None
                self._owned_in[key] = self.session.session_id
                self.status_changed()
                log.info("shard.serving", node=self.name, index=index, shard=number)
                await trio.sleep_forever()
        finally:
            self._owned_in.pop(key, None)
            if self.served.pop(key, None) is not None:
                self.status_changed()  # it stopped serving now (after its record went)
                log.info("shard.dropped", node=self.name, index=index, shard=number)
            self._active.discard(key)
            if shard not in self.assigned_shards:
                shutil.rmtree(local, ignore_errors=True)
            elif local.exists():
                log.info("shard.copy_kept", node=self.name, index=index, shard=number)

    async def _open_shard(self, store: ShardStore, index: str, number: int, local: Path
                          ) -> tuple[bool, ShardSearcher]:
        """The shard's local copy, verified and opened: ``(reused, searcher)``.

        A store that cannot be reached (:class:`StoreUnavailable`, a connection error or
        timeout) is not the shard's fault: the attempt is logged (``shard.store_unavailable``,
        with the delay) and made again after :attr:`store_backoff`'s delay, for as long
        as the shard stays assigned (unassigned, the wait is cancelled), without a refusal;
        a local copy kept from an earlier serving is left as it is meanwhile.  A shard that
        does not match its manifest, is not in the store, or does not open is
        :class:`PermanentFailure` (refused, never served here)."""
        failures = 0
        while True:
            try:
                reused = await trio.to_thread.run_sync(reuse_local, store, index, number,
                                                       self.data_dir)
                if not reused:
                    await trio.to_thread.run_sync(fetch_shard, store, index, number,
                                                  self.data_dir)
                return reused, await trio.to_thread.run_sync(ShardSearcher, local)
            except _STORE_DOWN as exc:
                failures += 1
                delay = self.store_backoff.delay(failures)
                log.warning("shard.store_unavailable", node=self.name, index=index,
                            shard=number, attempt=failures, retry_in=round(delay, 3),
                            error=str(exc))
                await trio.sleep(delay)
            except (CorruptShard, OSError, ValueError) as exc:
                log.error("shard.corrupt", node=self.name, index=index, shard=number,
                          error=str(exc))
                shutil.rmtree(local, ignore_errors=True)
                raise errors.PermanentFailure(f"corrupt shard {index}/{number}: {exc}"
                                              ) from None

    async def on_assignments(self, shards: frozenset[str]) -> None:
        """Delete the local copies of shards no longer assigned (kept through a pause or a
        restart, and unassigned meanwhile), except those being served or dropped now."""
        assigned = {parse_replica(s) for s in shards}
        stale = []
        for directory in sorted(self.data_dir.glob("*/shard-*")):
            try:
                key = (directory.parent.name, int(directory.name.removeprefix("shard-")))
            except ValueError:
                continue
            if key not in assigned and key not in self._active:
                trash = directory.parent / f".tmp-{os.urandom(8).hex()}"
                try:
                    os.rename(directory, trash)  # now, before another serving can start
                except OSError:
                    continue
                stale.append(trash)
                log.info("shard.copy_deleted", node=self.name, index=key[0], shard=key[1])
        if stale:
            await trio.to_thread.run_sync(
                lambda: [shutil.rmtree(d, ignore_errors=True) for d in stale])

    # ------------------------------------------------------------ query protocol

    async def serve_connection(self, stream: trio.abc.Stream) -> None:
        """Answer one client connection's calls (:mod:`.wire`), each in turn, until the
        client closes it; bytes that are not frames end it (``node.bad_frame``), and so
        does a call that fails unexpectedly (``node.call_failed``, with its traceback: the
        client asks another replica, as it would a dead node; this node serves on)."""
        stream = tls_server_stream(stream, self._server_tls)
        reader = FrameReader(stream)
        try:
            async with stream:
                while (body := await reader.next()) is not None:
                    try:
                        answer = self._reply(body)
                    except ProtocolError:
                        raise
                    except Exception:
                        log.exception("node.call_failed", node=self.name)
                        return
                    await stream.send_all(frame(answer))
        except ProtocolError as exc:
            log.warning("node.bad_frame", node=self.name, error=str(exc))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the client went away

    def _reply(self, body: bytes) -> Answer:
        """The answer to one frame's ``body``; :class:`ProtocolError` if it is not a map
        with an ``id`` (nothing can be answered)."""
        message = unpack(body)
        try:
            call = records.structure(message, Call)
        except records.CorruptRecord as exc:
            return Answer(message["id"], error=f"bad request: {exc}")
        reply = self._answer(call.kind, call.request)
        if isinstance(reply, ErrorReply):
            return Answer(call.id, error=reply.error)
        return Answer(call.id, reply)

    def _trusted(self, key: tuple[str, int]) -> bool:
        """Right before answering as an owner of a shard: is the session it was announced
        in still provably alive (:meth:`Session.ensure_trusted`)?  After a pause (GC,
        SIGSTOP) past the trust deadline a node answers "not serving" even before trio
        ran the task that cancels its shards, so a client asks another replica."""
        session = self.session
        if session is None:
            return False
        try:
            session.ensure_trusted(self._owned_in.get(key))
        except errors.SessionInterrupted:
            log.info("shard.answer_refused", node=self.name, index=key[0], shard=key[1],
                     reason="session not trusted")
            return False
        return True

    def _answer(self, kind: Kind, request: ShardRequest
                ) -> StatsReply | SearchReply | ErrorReply:
        """The reply to one call (see :mod:`.wire`): an :class:`ErrorReply` for a query
        that is not valid syntax."""
        refused: dict[int, str] = {}
        searchers: dict[int, ShardSearcher] = {}
        for shard in request.shards:
            searcher = self.served.get((request.index, shard))
            if searcher is None:
                refused[shard] = f"{self.name} does not serve {request.index}/{shard}"
            elif not self._trusted((request.index, shard)):
                refused[shard] = (f"{self.name} cannot vouch for its session: not serving "
                                  f"{request.index}/{shard}")
            else:
                searchers[shard] = searcher
        try:
            if kind is Kind.STATS:
                return StatsReply({shard: searcher.stats(request.query)
                                   for shard, searcher in searchers.items()}, refused)
            self.queries += len(searchers)
            return SearchReply(search_shards(searchers, request.query, request.top,
                                             request.stats), refused)
        except ValueError as exc:
            return ErrorReply(f"bad query syntax: {exc}")
