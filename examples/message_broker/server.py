"""A broker server: ``python -m framework run examples.message_broker.app:BrokerServer``.

It listens on TCP (see :mod:`examples.message_broker.protocol`) where
``$BROKER_LISTEN`` says (``HOST``, ``HOST:PORT``, ``0.0.0.0``; default: the address of the
interface that routes to ZooKeeper, loopback only when ZooKeeper is on loopback; port
``$BROKER_PORT``, default any free one) and publishes ``--address`` / ``$BROKER_ADVERTISE``
(default: the address it listens on; the rule of :mod:`framework.addresses`); an address it
cannot bind stops it at start in one line.  With ``$BROKER_TLS_*`` every link is TLS
(:class:`framework.LinkTls`).  It joins ``nodes/`` with its
:class:`~examples.message_broker.layout.NodeRecord`, registers the address it publishes with
the framework's :class:`~framework.primitives.ServiceDiscovery` (``/services/<app>/<server>``:
ephemeral in the same session, registered again after a session loss, before it serves any
topic), and runs as a runtime
:class:`~framework.runtime.Worker` in the replicated push mode: the runtime follows its
assignments (``assignments/<server>/``, written by the controller) and runs
:meth:`BrokerServer.serve_shard` for each assigned topic.  For each topic it runs this state
machine on the topic's ``primary`` znode (one data watch, plus ``isr`` while nobody is
primary):

* no primary, and we are in the in-sync set with a log that provably holds every
  acknowledged record -> take over: one multi sets ``isr`` (term + 1, with the version just
  read) and creates the ephemeral ``primary``; exactly one contender can win, and the
  ``czxid`` of the new node is the new epoch;
* the primary znode is ours -> serve as primary
  (:class:`~examples.message_broker.primary.PrimaryTopic`) until the node is gone, the
  session can no longer be trusted, or a fetch from a newer epoch proves us deposed;
* the primary znode is someone else's -> back it up once that server's discovery instance
  says where it is (a watch on it meanwhile): a new epoch starts a new copy of the log from
  offset 0, then pull from the primary (``fetch`` with the epoch) until the znode changes.

Guarantees:

* Messages never touch ZooKeeper.
* On SUSPENDED the topics keep being served until the session's trust deadline (the
  runtime's guard, 2/3 of the negotiated timeout after the last reply); past it, and at once
  on LOST, every topic scope is cancelled: each primary term is closed before anything else
  (nothing more is acknowledged) and its ``primary`` znode is left alone (it goes with a
  lost session; a session that survived serves the same epoch again once connected).  A
  backup's replication ends only with a new epoch or no primary: a disconnection the session
  survives changes nothing for it.
* A topic whose ``topics/<t>``, ``isr`` or ``primary`` node does not hold its record is not
  served until the node is rewritten (``broker.record_corrupt``); a ``shutdown`` node that
  does not hold its record is ignored, logged the same way.
* A malformed request gets an error reply (``bad_request``) and the connection goes on; a
  broken frame gets one and the connection is closed (see the protocol).
* Graceful stop (SIGTERM, or the ``shutdown`` znode naming this server or all servers): no
  more takeovers, every primary is handed to its in-sync backup once that holds the whole
  log (at most :data:`HAND_OVER_LIMIT` seconds), then the server leaves.  Every server also
  follows ``migration_prohibited`` and shows it in its record (moves are the controller's).
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import trio

from examples.message_broker import protocol
from examples.message_broker.layout import (
    APP_NAME,
    BrokerPaths,
    Isr,
    NodeRecord,
    PrimaryRecord,
    ServerState,
    ShutdownRequest,
    TopicSettings,
    decode,
    discovery,
    find_server,
    server_instance,
)
from examples.message_broker.log import TopicLog
from examples.message_broker.primary import PrimaryTopic, RequestError
from examples.message_broker.protocol import (
    ErrorCode,
    ErrorReply,
    Fetch,
    Fetched,
    Msgs,
    Produce,
    Produced,
    Subscribe,
    Subscribed,
)
from examples.message_broker.watching import wait_epoch_changed, wait_watch
from framework import (
    LinkTls,
    choose_endpoint,
    errors,
    open_listeners,
    records,
    tls_server_stream,
)
from framework.logs import get_logger
from framework.primitives import Group, Membership
from framework.retry import Backoff
from framework.runtime import App, Worker
from framework.zk import Session, wait_gone, watch_data

__all__ = ["BrokerServer"]

log = get_logger("examples.message_broker.server")

#: Pauses before a backup reconnects to its primary after a failed link.
RECONNECT = Backoff(0.2, 1.0)

#: Longest a replication fetch waits on the primary for new records (seconds).
FETCH_WAIT = 1.0

#: Longest a graceful stop waits for its primaries' hand-over (seconds).
HAND_OVER_LIMIT = 30.0


@attrs.define
class Term:
    """One primary term this server served (trio times; ``ended`` is ``None`` while it
    lasts)."""

    topic: str
    epoch: int
    started: float
    ended: float | None = None


@attrs.define
class BackupInfo:
    """A topic this server backs up: the primary it follows, the term's epoch, and how far
    behind the primary's log end its copy was at the last fetch (``None``: not fetched)."""

    primary: str
    epoch: int
    lag: int | None = None


@attrs.frozen
class Follower:
    """A backup's copy fetching over one connection."""

    topic: str
    server: str
    copy: str


class BrokerServer(Worker):
    """A YMB-style topic server (see the module doc).

    ``data_dir`` (default ``$BROKER_DATA_DIR`` or ``out/broker``) holds one directory per
    topic; ``listen`` (default ``$BROKER_LISTEN``) where to listen and ``address`` (default
    ``$BROKER_ADVERTISE``) what to publish (see the module doc); ``port`` (default
    ``$BROKER_PORT`` or 0: any) the TCP port when ``listen`` names none; ``fsync``
    (``$BROKER_FSYNC``: ``never`` or ``always``) the log's fsync policy; ``tls`` (default
    ``$BROKER_TLS*``, ``None``: plain TCP) the links' TLS.  A TLS setting that cannot work
    is a one-line :class:`~framework.errors.ConfigurationError` here.
    """

    app_name = APP_NAME
    status_interval = 0.5

    def __init__(self, app: App | str | None = None, *, name: str | None = None,
                 address: str = "", data_dir: str | os.PathLike[str] | None = None,
                 port: int | None = None, fsync: str | None = None,
                 lag_limit: float | None = None, listen: str | None = None,
                 tls: LinkTls | None = protocol.FROM_ENV) -> None:
        super().__init__(app, name=name, address=address)
        #: the address published to clients and backups (default: where we listen)
        self.advertise = address or os.environ.get("BROKER_ADVERTISE", "")
        #: where to listen (``HOST[:PORT]``; default: see the module doc)
        self.listen = listen if listen is not None else os.environ.get("BROKER_LISTEN", "")
        self.listen_address = ""
        self.tls = protocol.link_tls() if tls is protocol.FROM_ENV else tls
        self._server_tls = None if self.tls is None else self.tls.server_context()
        self._client_tls = None if self.tls is None else self.tls.client_context()
        #: every primary term served, in order
        self.terms: list[Term] = []
        self.paths = BrokerPaths(self.app)
        root = Path(data_dir or os.environ.get("BROKER_DATA_DIR") or "out/broker")
        self.data_dir = root / self.name
        self.port = int(port if port is not None else os.environ.get("BROKER_PORT", "0"))
        self.fsync = fsync or os.environ.get("BROKER_FSYNC", "never")
        #: seconds a counted backup may stay behind before its primary drops it from the
        #: in-sync set (``$BROKER_LAG_LIMIT``; default: 2/3 of the negotiated session
        #: timeout, ZooKeeper's own read timeout); also the read deadline of every
        #: replication link, on both ends
        #: the servers' shared secret (``$BROKER_SECRET``): replication links are signed
        #: and a fetch is served only in a signed frame (see protocol.py)
        self.secret = protocol.link_secret()
        lag_env = os.environ.get("BROKER_LAG_LIMIT")
        self.lag_limit: float | None = lag_limit if lag_limit is not None else (
            float(lag_env) if lag_env else None)
        self.primaries: dict[str, PrimaryTopic] = {}
        #: topics whose local log holds every acknowledged record (we were primary, or the
        #: primary counted our copy in sync) - in this process; a log recovered from disk
        #: proves it through ZooKeeper's in-sync record instead (``_may_take_over``)
        self.complete: set[str] = set()
        #: topics with no primary that we cannot take over: our recovered log's end (shown in
        #: our ``nodes/`` record, for ``ctl force-leader``)
        self.stranded: dict[str, int] = {}
        self.backups: dict[str, BackupInfo] = {}
        self.logs: dict[str, TopicLog] = {}
        #: per topic, the offset every in-sync replica is known to hold: the high watermark
        #: of our last primary term, or the one our primary last reported to us as backup
        self.committed: dict[str, int] = {}
        #: per topic we back up: the primary epoch our copy follows, and the copy's token
        self.following: dict[str, int] = {}
        self.copies: dict[str, str] = {}
        self.stopping = False
        #: whether ``migration_prohibited`` exists (watched; shown in our ``nodes/`` record)
        self.migration_prohibited = False
        self._stop = trio.Event()
        self._term_changed = trio.Event()
        self._topic_done = trio.Event()
        #: set to rewrite our ``nodes/`` record at once (a primary dropped a backup)
        self._status_now = trio.Event()
        self.session: Session | None = None

    # ------------------------------------------------------------ lifecycle

    def request_stop(self) -> None:
        """Hand primaries over, then exit (idempotent): the topics keep being served (and
        the controller keeps our replicas placed) until the hand-over is done."""
        if not self.stopping:
            log.info("broker.stopping", server=self.name, primaries=len(self.primaries))
        self.stopping = True
        self._stop.set()
        self._status_now.set()
        for state in list(self.primaries.values()):
            state.handing_over = True

    async def wait_terms(self, topic: str, count: int) -> None:
        """Return once this server has started ``count`` primary terms of ``topic``."""
        while sum(1 for term in self.terms if term.topic == topic) < count:
            await self._term_changed.wait()

    def node_record(self) -> NodeRecord:
        """Our ``nodes/`` record: what the controller and ``ctl status`` read."""
        return NodeRecord(
            name=self.name,
            state=ServerState.STOPPING if self.stopping else ServerState.RUNNING,
            migration_prohibited=self.migration_prohibited,
            load=len(self.primaries) + len(self.backups),
            primaries=tuple(sorted(self.primaries)),
            backups=tuple(sorted(self.backups)),
            lag={t: s.lag() for t, s in sorted(self.primaries.items())},
            # placed backups our primaries dropped from the in-sync set (lag or link): the
            # controller places a replacement for them
            out_of_sync={t: tuple(sorted(s.dropped)) for t, s in sorted(self.primaries.items())
                         if s.dropped},
            stranded=dict(sorted(self.stranded.items())),
        )

    @asynccontextmanager
    async def lifetime(self, session: Session) -> AsyncIterator[None]:
        """The listener, our ``nodes/`` member and our discovery instance around the
        runtime's worker loop (our ``workers/`` member, the assignments, a
        :meth:`serve_shard` per topic); a stop hands the primaries over first (see the
        module doc)."""
        if self.lag_limit is None:
            self.lag_limit = session.read_timeout
        for path in (self.paths.nodes, self.paths.topics):
            await session.ensure_path(path)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        endpoint = choose_endpoint(self.listen, self.advertise, zk_hosts=session.hosts,
                                   port=self.port, what="BROKER_LISTEN")
        listeners, self.address = await open_listeners(endpoint, what="BROKER_LISTEN")
        host, port = listeners[0].socket.getsockname()[:2]
        self.listen_address = f"{host}:{port}"
        group = Group(session, self.paths.nodes)
        instance = server_instance(self.paths, self.name, self.address,
                                   tls=self.tls is not None, host=socket.gethostname())
        # a restarted server waits for its previous incarnation's session to expire: its
        # discovery instance, ``nodes/`` member and ``workers/`` member (joined by the
        # runtime after this) go with that session.  Registered first: a server listed in
        # ``nodes/`` (and so placed by the controller) can be found
        try:
            async with discovery(session).register(instance), \
                    group.join(self.name, records.encode(self.node_record()),
                               wait_if_taken=True) as member:
                log.info("broker.serving", server=self.name, address=self.address,
                         listen=self.listen_address, tls=self.tls is not None)
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(trio.serve_listeners, self._serve_connection, listeners)
                    nursery.start_soon(self._report_node, member)
                    nursery.start_soon(self._watch_shutdown, session)
                    nursery.start_soon(self._watch_prohibited, session)
                    nursery.start_soon(self._stop_after_hand_over)
                    yield
                    nursery.cancel_scope.cancel()
        finally:
            for topic_log in self.logs.values():
                topic_log.close()
        log.info("broker.stopped", server=self.name)

    async def _stop_after_hand_over(self) -> None:
        """Once a stop is requested: hand the primaries over, then stop the runtime's worker
        loop (which ends every topic and leaves ``workers/``)."""
        await self._stop.wait()
        await self._hand_over()
        Worker.request_stop(self)

    async def _hand_over(self) -> None:
        """Give every primary to an in-sync backup once it holds the whole log, all topics
        at once (each topic's ack gap is its own hand-over).  A topic with no in-sync backup
        (a hung one was dropped) waits for the replacement the controller places - the
        controller keeps a stopping server's replicas until it has left ``nodes/`` - for at
        most :data:`HAND_OVER_LIMIT` seconds in all."""
        assert self.session is not None

        async def one(name: str, state: PrimaryTopic) -> None:
            state.handing_over = True
            if await state.drained():
                path = self.paths.primary(name)
                try:
                    stat = await self.session.exists(path)
                    if stat is not None and stat.ephemeralOwner == self.session.session_id:
                        await self.session.delete(path, version=stat.version)
                        log.info("broker.handed_over", topic=name, to=sorted(state.synced))
                except errors.ZooKeeperError:
                    pass
            state.close()

        with trio.move_on_after(HAND_OVER_LIMIT):
            async with trio.open_nursery() as nursery:
                for name, state in list(self.primaries.items()):
                    nursery.start_soon(one, name, state)

    async def _watch_shutdown(self, session: Session) -> None:
        async for snap in watch_data(session, self.paths.shutdown):
            if snap.exists:
                try:
                    names = decode(snap.data, ShutdownRequest).servers
                except records.CorruptRecord as exc:
                    log.error("broker.record_corrupt", path=self.paths.shutdown,
                              error=str(exc))
                    continue
                if not names or self.name in names:
                    log.info("broker.shutdown_requested", server=self.name)
                    self.request_stop()
                    return

    async def _watch_prohibited(self, session: Session) -> None:
        """Follow ``migration_prohibited`` (central control, as in YMB).  Moves are the
        controller's decision here; each server shows in its status that it saw the flag,
        so an operator can tell every server is under it."""
        async for snap in watch_data(session, self.paths.migration_prohibited):
            if snap.exists != self.migration_prohibited:
                log.info("broker.migration_prohibited", server=self.name,
                         prohibited=snap.exists)
            self.migration_prohibited = snap.exists

    def status(self) -> dict[str, Any]:
        """This server's ``workers/`` record (the runtime publishes it): the runtime's
        fields, with ours (:meth:`worker_record`) over them."""
        return {**super().status(), **self.worker_record()}

    def worker_record(self) -> dict[str, Any]:
        """This server as the runtime lists workers (``framework status``, the dashboard):
        the topics it serves as its shards (backups marked), its replica counts as
        counters."""
        return {
            "name": self.name, "address": self.address, "host": socket.gethostname(),
            "pid": os.getpid(),
            "state": (ServerState.STOPPING if self.stopping else ServerState.RUNNING).value,
            "kind": "broker server",
            "shards": sorted(self.primaries) + [f"{t} (backup)" for t in sorted(self.backups)],
            "counters": {"primaries": len(self.primaries), "backups": len(self.backups),
                         "stranded": len(self.stranded)},
            "health": {"ok": True}, "at": time.time(),
        }

    async def _report_node(self, member: Membership) -> None:
        """Rewrite our ``nodes/`` record when it changed, and have the runtime republish our
        ``workers/`` record when it changed (checked every ``status_interval``)."""
        last = b""
        last_worker: dict[str, Any] = {}
        while True:
            data = records.encode(self.node_record())
            if data != last:
                await member.update(data)
                last = data
            shape = self.worker_record()
            del shape["at"]
            if shape != last_worker:
                self.status_changed()
                last_worker = shape
            # a primary that dropped a backup says so at once: the controller replaces it
            with trio.move_on_after(self.status_interval):
                await self._status_now.wait()
            self._status_now = trio.Event()

    # ------------------------------------------------------------ topics

    def _log(self, topic: str) -> TopicLog:
        if topic not in self.logs:
            # recovered from its segments: never removed at start (see log.py)
            self.logs[topic] = TopicLog(self.data_dir / topic, fsync=self.fsync)
            self.copies[topic] = self.logs[topic].copy
        return self.logs[topic]

    async def serve_shard(self, shard: str, spec: bytes) -> None:
        """Serve topic ``shard`` while it is assigned to us (the runtime cancels it when it
        is unassigned, when our session cannot be trusted, and when we stop): the state
        machine of the module doc.  On the way out the term is closed (nothing more is
        acknowledged); our primary znode, if any, is deleted when the topic was unassigned
        or we are stopping (the in-sync backup takes over at once), and left alone when the
        session could not be trusted: it goes with the session, or, if the session
        survives, we serve the same term's epoch again."""
        session = self.session
        assert session is not None
        topic = shard
        log.info("broker.topic_assigned", server=self.name, topic=topic)
        try:
            await self._topic_loop(session, topic)
        finally:
            self.backups.pop(topic, None)
            state = self.primaries.pop(topic, None)
            if state is not None:
                state.close()
            if self.stopping or topic not in self.assigned_shards:
                with trio.CancelScope(shield=True), trio.move_on_after(2):
                    await self._resign(session, topic)
            log.info("broker.topic_released", server=self.name, topic=topic)

    async def _resign(self, session: Session, topic: str) -> None:
        try:
            stat = await session.exists(self.paths.primary(topic))
            if stat is not None and stat.ephemeralOwner == session.session_id:
                await session.delete(self.paths.primary(topic), version=stat.version)
        except errors.ZooKeeperError:
            pass

    async def _topic_loop(self, session: Session, topic: str) -> None:
        paths = self.paths
        topic_log = self._log(topic)
        while True:
            fired = trio.Event()
            wake = session.waker(fired)
            generation = session.snapshot().generation
            try:
                raw, topic_stat = await session.get(paths.topic(topic))
                settings = decode(raw, TopicSettings)
                # a log left by another topic of this name (deleted and created again, or
                # another cluster) is not this topic's: it starts afresh (see log.py)
                topic_log.bind(settings.id or f"czxid-{topic_stat.czxid}")
                stat = await session.exists(paths.primary(topic), watch=wake)
                if stat is None:
                    data, isr_stat = await session.get(paths.isr(topic), watch=wake)
                    isr = decode(data, Isr)
                    if self._may_take_over(topic, isr):
                        self.stranded.pop(topic, None)
                        await self._take_over(session, topic, isr, isr_stat.version)
                        continue
                    if isr.term > 0:
                        self.stranded[topic] = topic_log.end
                    await wait_watch(session, fired, generation)
                    continue
                self.stranded.pop(topic, None)
                data, stat = await session.get(paths.primary(topic), watch=wake)
                primary = decode(data, PrimaryRecord)
                address = None
                if stat.ephemeralOwner != session.session_id:
                    # where the primary is: its own registration (a watch on it too)
                    address = await find_server(session, paths, primary.server, watch=wake)
            except (errors.ConnectionLossError, errors.SessionExpiredError,
                    errors.NotConnectedError):
                await session.wait_connected()
                continue
            except errors.NoNodeError:
                if await session.exists(paths.topic(topic)) is None:
                    return  # topic deleted
                continue
            except records.CorruptRecord as exc:
                # nothing to serve by: wait until one of the topic's nodes is rewritten
                log.error("broker.record_corrupt", topic=topic, error=str(exc))
                with contextlib.suppress(errors.ZooKeeperError):
                    await session.exists(paths.topic(topic), watch=wake)
                await wait_watch(session, fired, generation)
                continue
            if stat.ephemeralOwner == session.session_id:
                await self._be_primary(session, topic, topic_log, stat.czxid, settings)
            else:
                await self._be_backup(session, topic, topic_log, primary, address,
                                      stat.czxid, fired, generation)

    def _may_take_over(self, topic: str, isr: Isr) -> bool:
        """Only a server named in ``isr`` whose log provably holds every acknowledged record
        (or a brand-new topic, term 0).  Proof is one of: in this process the primary counted
        our copy in sync, or we served as primary; ``isr`` names our log's copy token (the
        primary recorded that copy in sync - it may have died before telling us, or we were
        restarted since: the copy survives on disk with its token); ``isr``'s leader is us
        and our log served exactly that term as primary (``TopicLog.primary_term``, written
        before the takeover); or an operator's ``ctl force-leader`` named us.  A restarted
        server whose log was started afresh (a new token) never takes over with it."""
        if self.stopping or self.name not in isr.in_sync:
            return False
        topic_log = self.logs.get(topic)
        if isr.term == 0 or topic in self.complete:
            return True
        if topic_log is None:
            return False
        return (isr.copies.get(self.name) == topic_log.copy
                or (isr.leader == self.name and topic_log.primary_term == isr.term)
                or isr.forced == self.name)

    async def _take_over(self, session: Session, topic: str, isr: Isr, version: int) -> None:
        new = Isr(isr.in_sync, self.name, isr.term + 1, isr.copies, hw=isr.hw)
        # durably first: if we win, a restart of ours can prove this log served the term
        self._log(topic).mark_primary(new.term)
        txn = session.transaction()
        txn.set(self.paths.isr(topic), records.encode(new), version=version)
        txn.create(self.paths.primary(topic),
                   records.encode(PrimaryRecord(self.name)), ephemeral=True)
        try:
            await txn.commit()
            log.info("broker.took_over", topic=topic, server=self.name, term=new.term,
                     at=time.time())
        except errors.TransactionFailedError:
            pass  # someone else won, or the in-sync set changed: look again
        except errors.ConnectionLossError:
            await session.wait_connected()

    async def _be_primary(self, session: Session, topic: str, topic_log: TopicLog,
                          epoch: int, settings: TopicSettings) -> None:
        try:
            data, isr_stat = await session.get(self.paths.isr(topic))
            isr = decode(data, Isr)
        except errors.ZooKeeperError:
            return
        except records.CorruptRecord as exc:
            log.error("broker.record_corrupt", topic=topic, error=str(exc))
            return
        committed = self.committed.get(topic, 0)
        if isr.in_sync == (self.name,):
            # nobody else may take over (nor could hold more): every record of our log -
            # recovered after a restart too - stands, so it is all visible at once
            committed = topic_log.end
        state = PrimaryTopic(topic, self.name, topic_log, epoch, settings.mode, session,
                             self.paths.isr(topic), isr, isr_stat.version,
                             committed=committed)
        state.handing_over = self.stopping
        state.lag_limit = self.lag_limit
        state.owner_session = session.session_id
        state.on_dropped = lambda: self._status_now.set()
        state.primary_path = self.paths.primary(topic)
        self.primaries[topic] = state
        self.complete.add(topic)
        self.following.pop(topic, None)  # our log now grows as primary: no copy of anyone's
        term = Term(topic, epoch, trio.current_time())
        self.terms.append(term)
        self._term_changed.set()
        self._term_changed = trio.Event()
        log.info("broker.primary", topic=topic, server=self.name, epoch=epoch,
                 end=topic_log.end, mode=settings.mode)
        try:
            async with session.guard():
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(_cancel_after, wait_gone(session, self.paths.primary(topic)),
                                       nursery.cancel_scope)
                    nursery.start_soon(_cancel_after, state.deposed.wait(),
                                       nursery.cancel_scope)
                    nursery.start_soon(state.watch_lag)
                    nursery.start_soon(state.follow_placement, self.paths.placement(topic))
        except errors.SessionInterrupted as exc:
            interrupted = exc.reason
        else:
            interrupted = None
        finally:
            state.close()  # first of all: nothing more is acknowledged in this term
            term.ended = state.closed_at
            self.primaries.pop(topic, None)
            self.committed[topic] = state.hw
            self._term_changed.set()
            self._term_changed = trio.Event()
        log.info("broker.primary_ended", topic=topic, server=self.name, epoch=epoch,
                 reason=interrupted or "node gone")
        if interrupted:
            await session.wait_connected()

    async def _be_backup(self, session: Session, topic: str, topic_log: TopicLog,
                         primary: PrimaryRecord, address: str | None, epoch: int,
                         fired: trio.Event, generation: int) -> None:
        if not address:  # not registered (yet): its instance's watch wakes us
            await wait_watch(session, fired, generation)
            return
        if self.following.get(topic) != epoch:
            # a new primary term: copy its log afresh, from offset 0, so a backup's log is
            # always a prefix of its primary's (records the old term never acknowledged go);
            # following the same term again (after a reconnection) keeps the copy
            topic_log.reset()  # a new copy token, durably, before the segments go
            self.complete.discard(topic)
            self.committed[topic] = 0
            self.copies[topic] = topic_log.copy
            self.following[topic] = epoch
        info = BackupInfo(primary.server, epoch)
        self.backups[topic] = info
        log.info("broker.backup", topic=topic, server=self.name, primary=info.primary,
                 epoch=epoch)
        try:
            async with trio.open_nursery() as nursery:
                # only a new epoch (or no primary) ends this backup's replication: a dropped
                # ZooKeeper connection that the session survives changes nothing
                nursery.start_soon(_cancel_after,
                                   wait_epoch_changed(session, self.paths.primary(topic),
                                                      epoch, fired, generation),
                                   nursery.cancel_scope)
                failures = 0
                while True:
                    linked = trio.current_time()
                    try:
                        await self._replicate(topic, topic_log, address, epoch, info)
                    except (OSError, protocol.PeerClosed, protocol.ProtocolError,
                            trio.BrokenResourceError, trio.TooSlowError) as exc:
                        log.info("broker.replication_retry", topic=topic, error=str(exc))
                    except RequestError as exc:
                        log.info("broker.replication_refused", topic=topic,
                                 code=exc.code.value)
                        if exc.code in (ErrorCode.STALE_EPOCH, ErrorCode.STALE_COPY):
                            await trio.sleep_forever()  # until the primary znode changes
                    # back off before reconnecting to the same primary (anew after a link
                    # that lasted)
                    failures = 1 if trio.current_time() - linked > RECONNECT.cap else failures + 1
                    await RECONNECT.sleep(failures)
        finally:
            self.backups.pop(topic, None)

    async def _replicate(self, topic: str, topic_log: TopicLog, address: str, epoch: int,
                         info: BackupInfo) -> None:
        conn = await protocol.connect(address, self.secret, tls=self._client_tls)
        try:
            while True:
                await conn.send(Fetch(0, topic, epoch, topic_log.end, self.name,
                                      self.copies[topic]))
                # the primary answers within FETCH_WAIT unless it hangs (LinkTimeout)
                reply = await conn.read(idle=FETCH_WAIT + (self.lag_limit or 5.0))
                if self.secret is not None and not conn.reader.authenticated:
                    raise RequestError(ErrorCode.UNAUTHENTICATED,
                                       "unsigned reply from the primary")
                if isinstance(reply, ErrorReply):
                    raise RequestError(reply.code, reply.message)
                if not isinstance(reply, Fetched):
                    raise protocol.ProtocolError(ErrorCode.BAD_FRAME,
                                                 f"a {reply.op.value} frame answered a fetch")
                if reply.epoch != epoch or reply.start != topic_log.end:
                    raise RequestError(ErrorCode.STALE_EPOCH, "reply from another term")
                topic_log.append(reply.records)
                self.committed[topic] = min(reply.hw, topic_log.end)
                info.lag = reply.end - topic_log.end
                if reply.in_sync:
                    self.complete.add(topic)
        finally:
            await conn.aclose()

    # ------------------------------------------------------------ connections

    async def _serve_connection(self, stream: trio.SocketStream) -> None:
        """One client or replication link: read requests until the link ends, answering
        each (produces and subscriptions run beside the reading, a fetch in turn); a
        replication link silent for longer than the lag limit ends (a hung or half-open
        backup), and its backups leave the in-sync sets of their topics when it does."""
        protocol.keep_alive(stream)
        conn = protocol.Connection(tls_server_stream(stream, self._server_tls), self.secret)
        followers: set[Follower] = set()
        try:
            async with trio.open_nursery() as nursery:
                while True:
                    try:
                        # a replication link brings its next fetch at once (the backup
                        # pulls in a loop): silence for longer than the lag limit is a
                        # hung or half-open backup; other links may idle (keepalive)
                        request = await conn.read(
                            idle=self.lag_limit if followers else None)
                    except protocol.LinkTimeout as exc:
                        log.warning("broker.link_timeout", error=str(exc),
                                    followers=sorted(f.server for f in followers))
                        break
                    except protocol.BadMessage as exc:  # a whole frame: the link goes on
                        log.info("broker.bad_request", error=str(exc))
                        await conn.send(ErrorReply(exc.request_id, exc.code, str(exc)))
                        continue
                    except protocol.ProtocolError as exc:
                        log.info("broker.bad_frame", code=exc.code.value, error=str(exc))
                        with contextlib.suppress(trio.BrokenResourceError, OSError):
                            await conn.send_raw(protocol.error_frame(exc.code, str(exc)))
                        break
                    except (protocol.PeerClosed, OSError, trio.BrokenResourceError):
                        break
                    await self._dispatch(conn, request, nursery, followers)
                nursery.cancel_scope.cancel()
        except (protocol.PeerClosed, trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(5):
                await self._followers_gone(followers)
            await conn.aclose()

    async def _dispatch(self, conn: protocol.Connection, request: protocol.Message,
                        nursery: trio.Nursery, followers: set[Follower]) -> None:
        """Answer one request read from ``conn``: a produce or a subscription in a task of
        its own, a fetch before the link's next request (a backup pulls one at a time);
        a fetch adds its backup to the link's ``followers``."""
        if isinstance(request, Produce):
            nursery.start_soon(_quietly, self._produce, conn, request)
        elif isinstance(request, Fetch):
            if self.secret is not None and not conn.reader.authenticated:
                log.warning("broker.unauthenticated_fetch", topic=request.topic,
                            server=request.server)
                await conn.send(ErrorReply(
                    request.id, ErrorCode.UNAUTHENTICATED,
                    "fetch needs a frame signed with the servers' secret"))
                return
            conn.sign = conn.reader.authenticated  # answer a server in kind
            followers.add(Follower(request.topic, request.server, request.copy))
            await _quietly(self._fetch, conn, request)
        elif isinstance(request, Subscribe):
            nursery.start_soon(_quietly, self._subscribe, conn, request)
        else:
            await conn.send(ErrorReply(
                getattr(request, "id", None), ErrorCode.BAD_REQUEST,
                f"a {request.op.value} frame is not a request"))

    async def _followers_gone(self, followers: set[Follower]) -> None:
        """A replication link ended: its backups leave the in-sync sets of the topics this
        server is primary of."""
        for follower in followers:
            state = self.primaries.get(follower.topic)
            if state is not None:
                await state.follower_gone(follower.server, follower.copy)

    def _primary_for(self, topic: str) -> PrimaryTopic:
        state = self.primaries.get(topic)
        if state is None:
            if topic in self.logs:
                raise RequestError(ErrorCode.NOT_PRIMARY,
                                   f"{self.name} is not primary for {topic}")
            raise RequestError(ErrorCode.UNKNOWN_TOPIC,
                               f"{self.name} does not serve topic {topic!r}")
        return state

    async def _produce(self, conn: protocol.Connection, request: Produce) -> None:
        try:
            state = self._primary_for(request.topic)
            for m in request.msgs:
                if len(m) > protocol.MAX_MESSAGE:
                    raise RequestError(ErrorCode.TOO_LARGE, f"message of {len(m)} bytes "
                                                            f"exceeds {protocol.MAX_MESSAGE}")
            end = await state.produce(request.producer, request.seq, request.msgs)
        except RequestError as exc:
            await conn.send(ErrorReply(request.id, exc.code, str(exc)))
            return
        await conn.send(Produced(request.id, end))

    async def _fetch(self, conn: protocol.Connection, request: Fetch) -> None:
        # the reply (or refusal) is signed on a signed link: the backup trusts nothing else
        try:
            reply = await self._primary_for(request.topic).fetch(request, FETCH_WAIT)
        except RequestError as exc:
            await conn.send(ErrorReply(request.id, exc.code, str(exc)))
            return
        await conn.send(reply)

    async def _subscribe(self, conn: protocol.Connection, request: Subscribe) -> None:
        try:
            state = self._primary_for(request.topic)
            offset = request.offset
            if offset < 0:
                raise RequestError(ErrorCode.BAD_REQUEST, f"offset {offset} is negative")
            # the high watermark now: where a reader that does not follow stops
            await conn.send(Subscribed(request.id, state.epoch, state.hw))
            while True:
                batch = await state.deliverable(offset)
                await conn.send(Msgs(request.id, offset, batch))
                offset += len(batch)
        except RequestError as exc:
            await conn.send(ErrorReply(request.id, exc.code, str(exc)))


async def _quietly(handler: Any, conn: protocol.Connection, request: Any) -> None:
    """Run one request handler; a client that went away is not the server's problem."""
    try:
        await handler(conn, request)
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        pass


async def _cancel_after(waiting: Any, scope: trio.CancelScope) -> None:
    await waiting
    scope.cancel()
