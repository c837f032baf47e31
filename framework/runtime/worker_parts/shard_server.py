"""The push-mode part of a worker: serve exactly the shards the master assigns to it.

:class:`ShardServer` follows ``assignments/<worker>/`` (a children watch) and runs the
worker's ``serve_shard`` once per assigned shard, in a scope that ends when the shard is
unassigned.  ``serve_shard`` raising does not stop the worker nor its other shards: the
error is logged and the shard served again after a backoff while it stays assigned;
:class:`~framework.errors.PermanentFailure` records a refusal instead (replicated mode places
the shard elsewhere).  :meth:`ShardServer.ready` announces a served shard with an ephemeral
``deployed/<shard>/<worker>`` record (one per serving), confirmed once it has lasted.

Shards are served only while the session is trusted: on SUSPENDED past the session's trust
deadline (or ``suspended_grace``, if set and shorter), or on LOST, every shard body is
cancelled at once (the master will give them to someone else), and the worker follows its
assignments again once reconnected.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import trio

from framework import errors, records
from framework.logs import get_logger
from framework.runtime.records import Refusal
from framework.runtime.worker_parts.task_consumer import MAX_ERROR_CHARS
from framework.zk import Session, single_body_error, watch_children

if TYPE_CHECKING:
    from framework.runtime.worker_parts.hosts import ShardHost

log = get_logger(__name__)


class ShardServer:
    """The push-mode part of ``worker`` (see the module doc): a :class:`Part` that runs
    until cancelled."""

    drains = False

    def __init__(self, worker: ShardHost) -> None:
        self.worker = worker
        self._shards: set[str] = set()
        self._assigned: frozenset[str] = frozenset()

    @property
    def assigned(self) -> frozenset[str]:
        """The shards in the newest listing of the worker's assignments."""
        return self._assigned

    def layout(self) -> Sequence[str]:
        app = self.worker.app
        return (app.assignment_dir(self.worker.name), app.shards)

    async def prepare(self, session: Session) -> None:
        pass

    async def run(self, session: Session) -> None:
        await self._follow_assignments(session)

    def request_stop(self) -> None:
        pass  # shards are served until every draining part is done

    def status(self) -> dict[str, Any]:
        return {"shards": sorted(self._shards)}

    async def _follow_assignments(self, session: Session) -> None:
        """Serve exactly the shards assigned to us, and only while our session is trusted."""
        mine = self.worker.app.assignment_dir(self.worker.name)
        while True:
            await session.wait_connected()
            try:
                async with session.guard(suspended_grace=self.worker.suspended_grace):
                    async with trio.open_nursery() as nursery:
                        scopes: dict[str, trio.CancelScope] = {}
                        async for snap in watch_children(session, mine):
                            wanted = set(snap.children)
                            self._assigned = frozenset(wanted)
                            await self.worker.on_assignments(self._assigned)
                            for shard in set(scopes) - wanted:
                                scopes.pop(shard).cancel()
                            for shard in wanted - set(scopes):
                                scopes[shard] = await nursery.start(self._serve, session, shard)
            except errors.SessionInterrupted as exc:
                log.warning("worker.shards_dropped", worker=self.worker.name, reason=exc.reason)
                self._shards.clear()
                self.worker.status_changed()

    async def _serve(self, session: Session, shard: str,
                     task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Serve one assigned shard until it is unassigned.  ``serve_shard`` raising does not
        stop the worker (nor its other shards): the error is logged and the shard served
        again after a backoff, as long as it stays assigned to us."""
        with trio.CancelScope() as scope:
            task_status.started(scope)
            failures = 0
            while True:
                try:
                    await self._serve_once(session, shard)
                    return
                except errors.SessionInterrupted:
                    raise  # the session cannot be trusted: every shard stops
                except errors.PermanentFailure as exc:
                    await self._refuse(session, shard, exc)
                    await trio.sleep_forever()  # until unassigned: never retried here
                except Exception as exc:
                    failures += 1
                    delay = self.worker.backoff.delay(failures)
                    log.error("shard.failed", worker=self.worker.name, shard=shard,
                              error=f"{type(exc).__name__}: {exc}", retry_in=delay,
                              exc_info=exc)
                    await trio.sleep(delay)

    async def _refuse(self, session: Session, shard: str, exc: Exception) -> None:
        """Record that this worker cannot serve ``shard`` (replicated push mode): a
        persistent ``refused/<shard>/<worker>``, never creating parents."""
        log.error("shard.refused", worker=self.worker.name, shard=shard, error=str(exc))
        data = records.encode(Refusal(self.worker.name, str(exc)[:MAX_ERROR_CHARS]))
        path = f"{self.worker.app.refused_dir(shard)}/{self.worker.name}"
        try:
            await session.create(path, data)
        except errors.NodeExistsError:
            await session.set(path, data)
        except errors.NoNodeError:
            pass  # not a replicated shard, or no longer wanted

    async def _serve_once(self, session: Session, shard: str) -> None:
        try:
            spec, _ = await session.get(f"{self.worker.app.shards}/{shard}")
        except errors.NoNodeError:
            spec = b""
        self._shards.add(shard)
        self.worker.status_changed()
        log.info("shard.serving", worker=self.worker.name, shard=shard)
        try:
            await self.worker.serve_shard(shard, spec)
        finally:
            self._shards.discard(shard)
            self.worker.status_changed()
            log.info("shard.released", worker=self.worker.name, shard=shard)

    @asynccontextmanager
    async def ready(self, shard: str, info: Any = None) -> AsyncIterator[bool]:
        """Say that this worker serves ``shard`` for as long as the block runs: the runtime
        creates the ephemeral ``deployed/<shard>/<worker>`` record with ``info`` (bytes, or
        JSON), and withdraws it when the block ends (unassigned, error, stop) - before
        the code after the block runs, so a serving record never outlives the serving.
        When the session cannot be trusted the block is cancelled at once and nothing
        waits on ZooKeeper: the record goes with the session, or, if the session survives,
        is withdrawn as soon as it is connected again (:meth:`Session.delete_later`).
        Yields False, creating nothing, when the shard is no longer wanted (its
        ``deployed/<shard>`` directory is gone): return then.

        One record per block (incarnation): a JSON object ``info`` gets an
        ``"incarnation"`` key, a record of ours left from an earlier block is deleted and
        created anew (never adopted), and a withdrawal of an earlier block still pending
        (:meth:`Session.delete_later`) is waited for first - so a late clean-up can never
        delete the record of the block that runs now.

        Confirmation: ``confirm_after`` seconds into the block, if the session is still
        trusted, the record is written again (version 0 -> 1).  The leader drops a replica
        of a shard only when every replica that stays has a confirmed record, checked in
        the same transaction (:mod:`framework.runtime.placement.replicated`): a worker that froze
        right after it announced (a pause with its session still alive) is never left as
        the only replica."""
        session = self.worker.session
        if session is None:
            raise errors.NotConnectedError("the worker is not running")
        path = f"{self.worker.app.deployed_dir(shard)}/{self.worker.name}"
        if isinstance(info, bytes):
            data = info
        else:
            doc = info or {}
            if isinstance(doc, dict):
                doc = {**doc, "incarnation": os.urandom(8).hex()}
            data = json.dumps(doc).encode()
        while any(p.path == path for p in session.leftovers):
            await session.wait_leftovers_done()  # an earlier block's withdrawal first
        listed = False
        created_in: int | None = None
        try:
            listed = await _announce(session, path, data)
            created_in = session.session_id
            if listed:
                log.info("shard.ready", worker=self.worker.name, shard=shard)
            with single_body_error():
                async with trio.open_nursery() as nursery:
                    if listed and self.worker.confirm_after is not None:
                        nursery.start_soon(self._confirm, session, shard, path, data,
                                           created_in)
                    yield listed
                    nursery.cancel_scope.cancel()
        finally:
            withdrawn = False
            if listed and session.connected and session.session_id == created_in:
                with trio.CancelScope(shield=True), trio.move_on_after(2):
                    try:
                        await session.delete(path, missing_ok=True)
                        withdrawn = True
                    except errors.ZooKeeperError:
                        pass
            if listed and not withdrawn and created_in is not None:
                # not now (suspended, or no reply in time): as soon as the session is back,
                # if it survived; if it did not, the record went with it
                session.delete_later(path, data=data, session_id=created_in)

    async def _confirm(self, session: Session, shard: str, path: str, data: bytes,
                       created_in: int | None) -> None:
        """Write our serving record again ``confirm_after`` seconds after announcing it,
        if the session is still trusted (see :meth:`ready`).  Never raises: an
        untrusted session ends the block through the guard anyway."""
        assert self.worker.confirm_after is not None
        await trio.sleep(self.worker.confirm_after)
        try:
            session.ensure_trusted(created_in)
            await session.set(path, data, version=0)
        except (errors.SessionInterrupted, errors.ZooKeeperError) as exc:
            log.warning("shard.confirm_failed", worker=self.worker.name, shard=shard,
                        error=f"{type(exc).__name__}: {exc}")
            return
        log.info("shard.confirmed", worker=self.worker.name, shard=shard)


async def _announce(session: Session, path: str, data: bytes) -> bool:
    """Create our ephemeral serving record (replacing a record left by an earlier block or
    session of ours); ``False`` if its directory is gone.  Never creates parents."""
    while True:
        try:
            await session.create(path, data, ephemeral=True)
            return True
        except errors.NoNodeError:
            return False
        except errors.NodeExistsError:
            # ours from an earlier block, or of an earlier session of this worker: one
            # record per block, never adopted (a clean-up pending for it must not hit ours)
            stat = await session.exists(path)
            if stat is not None:
                await session.delete(path, version=stat.version, missing_ok=True)
