"""One-shot watches that survive disconnects.

kazoo drops a watch when the connection drops, so a caller waiting for a one-shot watch must
also wake on a change of connection state and read again.  :func:`wait_watch` does exactly
that: take ``session.snapshot().generation`` *before* the read that sets the watch, then wait.
"""

from __future__ import annotations

import trio

from framework.zk import Session


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
