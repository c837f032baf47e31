"""Ownership scopes: run a block only while an ephemeral node of ours provably exists.

A lock holding or a queue claim is proven by one ephemeral node created in one session.  The
proof ends when the node is deleted (by anyone), when that session is LOST (expired, closed,
replaced) or when the connection stays SUSPENDED past the session's ``suspended_grace`` (a
suspended client cannot know whether the server already expired it), and at the latest at
the session's trust deadline, which trio's scheduler enforces itself (a paused process starts
no new step after it).  :func:`node_scope` cancels the block at that moment and raises the
caller's typed error from the ``async with``.

The node's data can be watched too (``on_data``): the revocable lock uses it to notice an
``unlock`` request.  Everything runs in a nursery owned by the scope: nothing outlives it.
"""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import AsyncIterator, Awaitable, Callable

import trio

from framework import errors
from framework.zk import Session

#: Given the node's data, return a reason to end the scope (or ``None`` to keep it).
DataCheck = Callable[[bytes], "str | None"]


@asynccontextmanager
async def node_scope(
    session: Session,
    path: str,
    *,
    session_id: int | None,
    error: Callable[[str], BaseException],
    on_data: DataCheck | None = None,
    keepalive: Callable[[], Awaitable[str | None]] | None = None,
    watch_after: float = 0.0,
) -> AsyncIterator[None]:
    """Run the block while ``path`` exists in session ``session_id`` and that session is
    trusted; otherwise cancel the block and raise ``error(reason)``.

    ``reason`` is ``"node deleted"``, ``"lost"``, ``"suspended"``, what ``on_data``
    returned for the node's current data, or what ``keepalive`` returned: it runs beside the
    block (renewing a lease, say) and returns a reason once the holding cannot be kept.

    ``watch_after``: watch the node only once the block has run that long, for nodes
    nobody else can delete sooner (a block that ends earlier costs no request).  The
    session is watched from the start.
    """
    reason: list[str] = []

    def end(why: str, scope: trio.CancelScope) -> None:
        if not reason:
            reason.append(why)
        scope.cancel()

    body_error: BaseException | None = None
    async with trio.open_nursery() as nursery:
        scope = nursery.cancel_scope
        try:
            with session.trusting(scope, session_id, session.suspended_grace) as trust:
                if session_id is None or session.session_id != session_id:
                    end("lost", scope)
                else:
                    nursery.start_soon(_watch_session, session, session_id, end, scope)
                    nursery.start_soon(_watch_node, session, path, session_id, on_data, end,
                                       scope, watch_after)
                    if keepalive is not None:
                        nursery.start_soon(_keep, keepalive, end, scope)
                try:
                    yield
                except trio.Cancelled:
                    raise
                except BaseException as exc:
                    if isinstance(exc, BaseExceptionGroup) and exc.subgroup(_is_cancelled):
                        raise
                    # keep the body's own error out of the nursery, so it is not wrapped
                    body_error = exc
        finally:
            scope.cancel()  # after the trust is settled (see Trust)
    if body_error is not None:
        raise body_error
    if not reason and trust.expired:
        reason.append(session.expired_reason(session_id))
    if reason:
        raise error(reason[0])


async def _keep(
    keepalive: Callable[[], Awaitable[str | None]],
    end: Callable[[str, trio.CancelScope], None],
    scope: trio.CancelScope,
) -> None:
    why = await keepalive()
    if why is not None:
        end(why, scope)


def _is_cancelled(exc: BaseException) -> bool:
    return isinstance(exc, trio.Cancelled)


async def _watch_session(
    session: Session, session_id: int, end: Callable[[str, trio.CancelScope], None],
    scope: trio.CancelScope,
) -> None:
    end(await session.wait_untrusted(session_id, session.suspended_grace, scope=scope), scope)


async def _watch_node(
    session: Session,
    path: str,
    session_id: int,
    on_data: DataCheck | None,
    end: Callable[[str, trio.CancelScope], None],
    scope: trio.CancelScope,
    watch_after: float = 0.0,
) -> None:
    if watch_after > 0:
        await trio.sleep(watch_after)  # a deferral (see node_scope), not a synchronisation
    while True:
        fired = trio.Event()
        try:
            if on_data is None:
                stat = await session.exists(path, watch=session.waker(fired))
                if stat is None:
                    end("node deleted", scope)
                    return
            else:
                try:
                    data, _stat = await session.get(path, watch=session.waker(fired))
                except errors.NoNodeError:
                    end("node deleted", scope)
                    return
                why = on_data(data)
                if why is not None:
                    end(why, scope)
                    return
        except (errors.SessionExpiredError, errors.NotConnectedError):
            end("lost", scope)
            return
        except errors.ConnectionLossError:
            await session.wait_connected()
            continue
        await fired.wait()
        if session.session_id not in (session_id, None):
            end("lost", scope)
            return
