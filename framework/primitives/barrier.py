"""A simple barrier (seed recipe): the barrier is up while its node exists.

Waiters set a watch with ``exists`` and wake when the node is deleted: no polling.
"""

from __future__ import annotations

import trio

from framework import errors
from framework.logs import get_logger
from framework.zk import Session, validate_path

log = get_logger("framework.primitives.barrier")


class Barrier:
    """A barrier at ``path``: :meth:`raise_` puts it up, :meth:`lower` takes it down and
    :meth:`wait` returns once it is down (at once if it is not up).

    The node is persistent by default, so a barrier survives the process that raised it;
    with ``ephemeral=True`` it also falls when the raiser's session ends.

    SUSPENDED: :meth:`wait` keeps waiting and re-reads after reconnection (a lowering made
    meanwhile is still seen).  LOST: a persistent barrier is unaffected and :meth:`wait`
    continues in the new session; an ephemeral barrier is lowered by the expiry itself.
    """

    def __init__(self, session: Session, path: str, *, ephemeral: bool = False) -> None:
        validate_path(path, allow_root=False)
        self.session = session
        self.path = path
        self.ephemeral = ephemeral

    async def raise_(self) -> None:
        """Put the barrier up (idempotent)."""
        try:
            await self.session.create(self.path, ephemeral=self.ephemeral, makepath=True)
            log.info("barrier.raised", path=self.path)
        except errors.NodeExistsError:
            pass

    async def lower(self) -> None:
        """Take the barrier down (idempotent): every waiter is released."""
        await self.session.delete(self.path, missing_ok=True)
        log.info("barrier.lowered", path=self.path)

    async def is_up(self) -> bool:
        return await self.session.exists(self.path) is not None

    async def wait(self, *, task_status: trio.TaskStatus[bool] = trio.TASK_STATUS_IGNORED) -> None:
        """Return once the barrier is down (one watch on the node, no polling).

        Started with ``await nursery.start(barrier.wait)``, it reports ``True`` once its watch
        is armed on a raised barrier (``False`` if the barrier was already down).
        """
        started = False
        while True:
            fired = trio.Event()
            try:
                stat = await self.session.exists(self.path, watch=self.session.waker(fired))
            except (errors.ConnectionLossError, errors.SessionExpiredError):
                await self.session.wait_connected()
                continue
            if stat is None:
                if not started:
                    task_status.started(False)
                return
            if not started:
                task_status.started(True)
                started = True
            await fired.wait()
