"""What a worker's parts read of the worker that holds them: small protocols, no ``Worker``.

The parts live below :class:`~framework.runtime.Worker` (which composes them), so they name
only what they use of it: :class:`HandlerHost` (the handler pool), :class:`ShardHost` (the
push-mode shard server) and :class:`DutiesHost` (the duties' election).  The task consumer's
own contract is :class:`~framework.runtime.worker_parts.delivery.ConsumerHost`.  A
``Worker`` satisfies all of them; a test may pass any object that does.
"""

from __future__ import annotations

from typing import Any, Protocol

from framework.retry import Backoff
from framework.runtime.app import App
from framework.zk import Session


class DutiesHost(Protocol):
    """What :class:`~framework.runtime.worker_parts.duties.Duties` reads of its worker
    (the retention settings it reads by name, falling back to a master's defaults)."""

    app: App
    name: str
    address: str
    suspended_grace: float | None

    @property
    def takes_tasks(self) -> bool: ...

    def status_changed(self) -> None: ...


class HandlerHost(Protocol):
    """What :class:`~framework.runtime.worker_parts.handlers.HandlerPool` reads of its
    worker; handler methods are looked up by name on it."""

    app: App
    name: str
    address: str
    config: Any
    handle_blocks: bool
    handler_pool: str


class ShardHost(Protocol):
    """What :class:`~framework.runtime.worker_parts.shard_server.ShardServer` reads of its
    worker and calls on it."""

    app: App
    name: str
    session: Session | None
    suspended_grace: float | None
    confirm_after: float | None

    @property
    def backoff(self) -> Backoff: ...

    def status_changed(self) -> None: ...

    async def on_assignments(self, shards: frozenset[str]) -> None: ...

    async def serve_shard(self, shard: str, spec: bytes) -> None: ...
