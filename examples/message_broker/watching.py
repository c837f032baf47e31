"""Waiting on one-shot watches across disconnects.

* :func:`wait_watch` returns when the watch fired, or once the session is connected again
  after any change of connection state since the caller's read (the watch may be lost: the
  caller reads again).  Take ``session.snapshot().generation`` *before* the read that sets
  the watch.
* :func:`wait_epoch_changed` returns only once the broker's ``primary`` znode is gone or is
  another node than the one of the caller's epoch: a wake-up that is not a change (the
  connection dropped and came back, the session survived) re-reads and keeps waiting
  (``broker.watch_rearmed``).

Neither polls; both are cancelled by their caller.  Why a wake-up is not a change (kazoo
drops watches on a disconnect): docs/architecture.md, "Watches".
"""

from __future__ import annotations

import trio

from framework import errors
from framework.logs import get_logger
from framework.zk import Session

log = get_logger("examples.message_broker.watching")


async def wait_watch(session: Session, fired: trio.Event, generation: int) -> None:
    """Return when ``fired`` is set, or once the session is connected again after any state
    change since ``generation`` (the watch may be lost: the caller reads again)."""
    if fired.is_set():
        return
    async with trio.open_nursery() as nursery:
        async def on_state_change() -> None:
            await session.wait_change(generation)
            await session.wait_connected()
            nursery.cancel_scope.cancel()

        nursery.start_soon(on_state_change)
        await fired.wait()
        nursery.cancel_scope.cancel()


async def wait_epoch_changed(session: Session, path: str, epoch: int, fired: trio.Event,
                             generation: int) -> None:
    """Return once the node at ``path`` is gone or is another node than the one created at
    ``epoch`` (its ``czxid``).

    ``fired`` / ``generation`` belong to the read that gave the caller ``epoch`` (its watch
    and the session's state generation before it).  Every wake-up - the watch firing, a NONE
    event when the connection drops, a reconnection, a new session - is followed by a fresh
    read (which re-arms the watch) once connected: while the node is still the one of
    ``epoch`` this keeps waiting, so a ZooKeeper disconnection the session survives changes
    nothing for the caller.  A read cut by a connection loss is simply made again after the
    reconnection (reads are idempotent).  Cancel to stop waiting."""
    while True:
        await wait_watch(session, fired, generation)
        await session.wait_connected()  # a read sent now is not cut by the same drop
        fired = trio.Event()
        generation = session.snapshot().generation
        try:
            stat = await session.exists(path, watch=session.waker(fired))
        except (errors.ConnectionLossError, errors.SessionExpiredError):
            continue  # the generation moved on: wait_watch returns once connected again
        if stat is None or stat.czxid != epoch:
            return
        log.info("broker.watch_rearmed", path=path, epoch=epoch,
                 state=session.state.name.lower())
