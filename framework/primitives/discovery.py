"""Service discovery: servers register instances (address and payload); clients find them.

Layout (under ``base``, ``/services`` by default)::

    /services/<service name>/<instance id>   ephemeral, JSON: id, name, address, port,
                                             payload, registered (Unix time)

Registering is a scope: ``async with discovery.register(instance) as registration:``.  The
instance's node is a :class:`~framework.primitives.persistent_node.PersistentNode`: created
again if someone deletes it or the session is LOST (the instance is back as soon as the
session serves again), deleted when the scope ends.  An instance vanishes with its session:
a process that dies (kill -9) or is paused past the session timeout is no longer listed
once the server expires its session.

Finding: :meth:`ServiceDiscovery.instances` reads a service's instances once (a list and a
read per instance, pipelined); :meth:`ServiceDiscovery.instance` reads one instance by id,
optionally arming a watch on its node (set when it is registered, changed or goes: a client
that found a server's id elsewhere, such as an owner record, waits on it for the instance
and drops a cached address when it fires); :meth:`ServiceDiscovery.watch` yields the service's
instances now and again after every change of membership (one child watch on the service's
node, and a data watch on each instance read; only new instances, and ones registered again
under the same id, are read).  An instance's payload is fixed while it is registered
(register again to change it).  Nodes that do not hold an instance record (written by
something else) are skipped with a warning.

SUSPENDED: registrations stay (the node lives as long as the session); queries and watches
wait for the connection.  LOST: registrations are re-created in the new session; a watch
reads again and yields what changed.  Invalid names, addresses, ports or payloads raise
:class:`ConfigurationError` before anything is written.
"""

from __future__ import annotations

import functools
import time
import uuid
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Callable

import attrs

from framework import errors, records
from framework.logs import get_logger
from framework.primitives.persistent_node import PersistentNode
from framework.zk import Session, gather, validate_component, validate_path, watch_children

log = get_logger("framework.primitives.discovery")


def _check_port(_instance: Any, _attribute: Any, port: int | None) -> None:
    if port is not None and (
        isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536
    ):
        raise errors.ConfigurationError(f"port must be 1-65535 or None, got {port!r}")


def _check_address(_instance: Any, _attribute: Any, address: str) -> None:
    if not isinstance(address, str) or not address or any(c.isspace() for c in address):
        raise errors.ConfigurationError(f"address must be a host name or IP, got {address!r}")


@attrs.frozen
class ServiceInstance:
    """One registered server: where to reach it and what it says about itself."""

    name: str = attrs.field(validator=lambda _i, _a, v: validate_component("service name", v))
    address: str = attrs.field(validator=_check_address)
    port: int | None = attrs.field(default=None, validator=_check_port)
    payload: Any = None  # anything JSON can carry
    id: str = attrs.field(factory=lambda: uuid.uuid4().hex,
                          validator=lambda _i, _a, v: validate_component("instance id", v))
    registered: float = attrs.field(factory=time.time)

    @property
    def endpoint(self) -> str:
        """``address:port`` (``[address]:port`` for an IPv6 literal; ``address`` alone
        without a port)."""
        if self.port is None:
            return self.address
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"{host}:{self.port}"

    def encode(self) -> bytes:
        """The instance's record (:mod:`framework.records`: JSON through cattrs)."""
        try:
            return records.encode(self)
        except (TypeError, ValueError) as exc:
            raise errors.ConfigurationError(
                f"the payload of instance {self.id} of {self.name!r} is not JSON: {exc}"
            ) from None

    @classmethod
    def decode(cls, data: bytes) -> ServiceInstance:
        """The instance in ``data``; :class:`ValueError` if it is not one."""
        try:
            return records.decode(data, cls)
        except (ValueError, errors.ConfigurationError) as exc:
            raise ValueError(str(exc)) from None


class Registration:
    """An instance kept registered (see :meth:`ServiceDiscovery.register`)."""

    def __init__(self, instance: ServiceInstance, node: PersistentNode) -> None:
        self.instance = instance
        self.node = node

    @property
    def path(self) -> str:
        return self.node.path

    @property
    def present(self) -> bool:
        """Whether the instance's node is known to exist now."""
        return self.node.present

    async def wait_present(self) -> None:
        await self.node.wait_present()


class ServiceDiscovery:
    """Register and find service instances under ``base``; contract: see the module."""

    def __init__(self, session: Session, base: str = "/services") -> None:
        validate_path(base, allow_root=False)
        self.session = session
        self.base = base

    def _service(self, name: str) -> str:
        return f"{self.base}/{validate_component('service name', name)}"

    @asynccontextmanager
    async def register(self, instance: ServiceInstance) -> AsyncIterator[Registration]:
        """Keep ``instance`` registered for the block (returns once it is registered)."""
        node = PersistentNode(self.session, f"{self._service(instance.name)}/{instance.id}",
                              instance.encode())
        async with node.run():
            await node.wait_present()
            log.info("discovery.registered", service=instance.name, id=instance.id,
                     endpoint=instance.endpoint)
            try:
                yield Registration(instance, node)
            finally:
                log.info("discovery.unregistered", service=instance.name, id=instance.id)

    async def names(self) -> list[str]:
        """The services with a node under ``base`` (some may have no instance now)."""
        while True:
            try:
                return sorted(await self.session.children(self.base))
            except errors.NoNodeError:
                return []
            except errors.SessionExpiredError:
                continue  # a read: made again in the new session

    async def instances(self, name: str) -> list[ServiceInstance]:
        """The instances of service ``name`` registered now, by id."""
        path = self._service(name)
        while True:
            try:
                ids = await self.session.children(path)
                found = await self._read(path, ids)
            except errors.NoNodeError:
                return []
            except errors.SessionExpiredError:
                continue  # a read: made again in the new session
            return sorted(found.values(), key=lambda i: i.id)

    async def instance(self, name: str, instance_id: str, *,
                       watch: Callable[..., Any] | None = None
                       ) -> ServiceInstance | None:
        """One instance, or ``None`` when it is not registered (or its node does not hold an
        instance record).  ``watch`` (a session watcher, e.g. ``session.waker(event)``) is
        armed on the instance's node, also when it is missing: it is called once when the
        instance is registered, changed or unregistered.  With a watch, a connection loss or
        expiry is raised (:class:`~framework.errors.ConnectionLossError`,
        :class:`~framework.errors.SessionExpiredError`): the caller waits for the connection
        and asks again, as it does for its other watched reads; without one the read is
        made again in a new session."""
        path = f"{self._service(name)}/{validate_component('instance id', instance_id)}"
        if watch is not None:
            return await self._watched(path, watch)
        while True:
            try:
                found = await self._read(self._service(name), [instance_id])
            except errors.SessionExpiredError:
                continue
            return found.get(instance_id)

    async def _watched(self, path: str, watch: Callable[..., Any]
                       ) -> ServiceInstance | None:
        while True:
            try:
                data, _stat = await self.session.get(path, watch=watch)
            except errors.NoNodeError:
                if await self.session.exists(path, watch=watch) is None:
                    return None
                continue  # registered between the two reads: read it
            try:
                return ServiceInstance.decode(data)
            except ValueError as exc:
                log.warning("discovery.bad_instance", path=path, error=str(exc))
                return None

    async def watch(self, name: str) -> AsyncIterator[tuple[ServiceInstance, ...]]:
        """Yield the instances of ``name`` (by id) now and after every change of its
        membership.  Never ends on its own: cancel it or ``break``.

        An instance registered again under the same id (a server restarted with its name,
        perhaps on another port) is read again: each instance is read with a data watch,
        and one that fired is dropped from what is known at the next change.  A read cut
        by a connection loss or an expiry is made again once connected."""
        path = self._service(name)
        known: dict[str, ServiceInstance] = {}
        stale: set[str] = set()

        def watcher(instance_id: str) -> Callable[..., None]:
            return lambda *_args: stale.add(instance_id)

        async for snapshot in watch_children(self.session, path):
            current = set(snapshot.children)
            for gone in (set(known) - current) | (stale & set(known)):
                del known[gone]
            stale.clear()
            while True:
                try:
                    fresh = await self._read(path, sorted(current - set(known)), watcher)
                    break
                except (errors.ConnectionLossError, errors.SessionExpiredError):
                    await self.session.wait_connected()
            known.update(fresh)
            yield tuple(known[i] for i in sorted(known))

    async def _read(self, path: str, ids: list[str],
                    watcher: Callable[[str], Callable[..., None]] | None = None
                    ) -> dict[str, ServiceInstance]:
        out: dict[str, ServiceInstance] = {}

        async def one(instance_id: str) -> None:
            watch = None if watcher is None else watcher(instance_id)
            try:
                data, _stat = await self.session.get(f"{path}/{instance_id}", watch=watch)
            except errors.NoNodeError:
                return
            try:
                out[instance_id] = ServiceInstance.decode(data)
            except ValueError as exc:
                log.warning("discovery.bad_instance", path=f"{path}/{instance_id}",
                            error=str(exc))

        await gather(*[functools.partial(one, i) for i in ids])
        return out
