"""``Service``: the base of every process of an application, and the parts composed on it.

A service has a name, joins the application's ``workers/`` group with a status document
(address, state, health, and what its parts report), follows the ready-znode configuration,
and stops gracefully: :meth:`Service.request_stop` (or ``framework cancel`` of the app) asks
every part to drain, the service waits until the parts that drain have, then stops the others
and leaves the group.

What a service *does* are its parts (:class:`Part`): the pull-mode task consumer
(:class:`~framework.runtime.worker_parts.TaskConsumer`), the push-mode shard server
(:class:`~framework.runtime.worker_parts.ShardServer`), or an application's own.  A subclass
says which with :meth:`Service.parts`, and holds what must outlive them (a listening socket,
say) in :meth:`Service.lifetime`; it never overrides :meth:`Service.run`.

On SUSPENDED and LOST the service itself goes on (its group node is ephemeral: after an
expiry it joins again in the new session); each part decides for its own work (a claim ends
at the session's trust deadline, shards are dropped at once).
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any, Protocol

import trio

from framework import errors
from framework.logs import get_logger
from framework.primitives import ConfigStore, Group
from framework.runtime.app import App, app_of, ensure_layout, process_name
from framework.runtime.operations.cancel import wait_cancelled
from framework.zk import Session, cleanup_scope, single_body_error

log = get_logger(__name__)


class Part(Protocol):
    """One kind of work a :class:`Service` does while it runs.

    ``drains``: :meth:`run` returns by itself once a stop was requested and its work is
    done (the service waits for it); otherwise it runs until cancelled, which the service
    does once every draining part has returned."""

    drains: bool

    def layout(self) -> Sequence[str]:
        """The znodes the part needs (created before it runs)."""
        ...

    async def prepare(self, session: Session) -> None:
        """One-time set-up in ``session`` before the service joins its group.  Must be
        idempotent: after a :class:`~framework.errors.ConnectionLossError` (a write whose
        reply was lost) the service waits for the connection and calls it again."""
        ...

    async def run(self, session: Session) -> None: ...

    def request_stop(self) -> None:
        """A stop was requested (the service's :attr:`Service.draining` is already set)."""
        ...

    def status(self) -> dict[str, Any]:
        """Keys this part adds to the service's status document."""
        ...


class Service:
    """Base of an application's processes (see the module doc).

    Class attributes: ``app_name`` (used when no app is given), ``status_interval``
    (seconds between two status publications at most), ``suspended_grace`` (``None``:
    owned work runs until the session's trust deadline)."""

    app_name: str | None = None
    status_interval: float = 1.0
    suspended_grace: float | None = None  # None: until the session's trust deadline

    def __init__(self, app: App | str | None = None, *, name: str | None = None,
                 address: str = "") -> None:
        self.app = app_of(app, self.app_name, type(self))
        self.name = process_name("worker", name)
        self.address = address
        self.config: Any = None
        self.session: Session | None = None
        self.stop_requested = trio.Event()
        #: True once this process stopped because the app is cancelled (``framework cancel``)
        self.stopped_by_cancel = False
        self._draining = False
        self._status_dirty = trio.Event()
        self._parts: list[Part] = []

    # ------------------------------------------------------------ for subclasses

    def parts(self) -> list[Part]:
        """The parts this service runs (called once per :meth:`run`).  Default: none."""
        return []

    @asynccontextmanager
    async def lifetime(self, session: Session) -> AsyncIterator[None]:
        """Held for as long as the service runs, entered before it joins its group (an
        HTTP listener whose address goes into the status, say).  Default: nothing."""
        yield

    async def on_config(self, config: Any) -> None:
        """Called with each new complete configuration (the paper's ready-znode protocol)."""

    def health(self) -> dict[str, Any]:
        """Reported in the service's group node; override to add checks."""
        return {"ok": True}

    def status_changed(self) -> None:
        """Ask for the group status (with :meth:`health`) to be published again soon.

        The runtime republishes on its own when its parts' state changes; call this when
        something else that :meth:`health` reports changed (a new configuration applied...).
        """
        self._status_dirty.set()

    @property
    def draining(self) -> bool:
        """Whether a stop was requested."""
        return self._draining

    def request_stop(self) -> None:
        """Begin a graceful stop (idempotent)."""
        if not self._draining:
            log.info("worker.draining", app=self.app.name, worker=self.name,
                     in_flight=self.status()["in_flight"])
        self._draining = True
        self.stop_requested.set()
        for part in self._parts:
            part.request_stop()
        self._status_dirty.set()

    def status(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "name": self.name,
            "address": self.address,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "state": "draining" if self._draining else "running",
            "load": 0.0, "in_flight": 0, "done": 0, "failed": 0, "shards": [],
            "stuck_threads": 0,
        }
        for part in self._parts:
            doc.update(part.status())
        doc["health"] = self.health()
        doc["at"] = time.time()
        return doc

    # ------------------------------------------------------------ runtime

    async def run(self, session: Session) -> None:
        """Serve until :meth:`request_stop`; returns after a graceful drain."""
        self.session = session
        app = self.app
        self._parts = parts = self.parts()
        await ensure_layout(session, app, *[path for part in parts for path in part.layout()])
        for part in parts:
            while True:
                try:
                    await part.prepare(session)
                    break
                except errors.ConnectionLossError:
                    # under load a set-up write can lose its reply: prepare is idempotent
                    log.info("worker.prepare_retried", app=app.name, worker=self.name,
                             part=type(part).__name__)
                    await session.wait_connected()
        group = Group(session, app.workers)
        with single_body_error():  # a lifetime holding a nursery must not wrap our errors
            await self._serve(session, group, parts)
        status = self.status()
        log.info("worker.stopped", app=app.name, worker=self.name, done=status["done"],
                 failed=status["failed"])

    async def _serve(self, session: Session, group: Group, parts: list[Part]) -> None:
        app = self.app
        async with self.lifetime(session), \
                group.join(self.name, json.dumps(self.status()).encode()) as member:
            log.info("worker.joined", app=app.name, worker=self.name)
            async with trio.open_nursery() as background:
                background.start_soon(self._report_status, member)
                background.start_soon(self._follow_config, session)
                background.start_soon(self._follow_cancel, session)
                for part in parts:
                    if not part.drains:
                        background.start_soon(part.run, session)
                draining = [part for part in parts if part.drains]
                if draining:
                    async with trio.open_nursery() as drains:
                        for part in draining:
                            drains.start_soon(part.run, session)
                else:
                    await self.stop_requested.wait()
                background.cancel_scope.cancel()
            with cleanup_scope(session):
                try:
                    await member.update(
                        json.dumps(self.status() | {"state": "stopped"}).encode()
                    )
                except errors.ZooKeeperError:
                    pass  # the group node is ephemeral: it goes with the session

    async def _follow_cancel(self, session: Session) -> None:
        """Drain and leave once the app is cancelled (``framework cancel``)."""
        await wait_cancelled(session, self.app)
        log.warning("worker.cancelled", app=self.app.name, worker=self.name)
        self.stopped_by_cancel = True
        self.request_stop()

    async def _report_status(self, member: Any) -> None:
        last = None
        while True:
            await self._status_dirty.wait()
            self._status_dirty = trio.Event()
            doc = self.status()
            comparable = {k: v for k, v in doc.items() if k != "at"}
            if comparable != last:
                last = comparable
                try:
                    await member.update(json.dumps(doc).encode())
                except errors.ZooKeeperError as exc:
                    log.warning("worker.status_failed", error=str(exc))
            await trio.sleep(self.status_interval)  # rate limit, not synchronisation

    async def _follow_config(self, session: Session) -> None:
        store: ConfigStore[Any] = ConfigStore(session, self.app.config)
        async for config in store.watch():
            self.config = config
            log.info("worker.config", worker=self.name)
            await self.on_config(config)
