"""The one place where kazoo's threads meet trio.

kazoo completes requests on its own threads.  A completion may touch trio only through
``TrioToken.run_sync_soon`` (never ``trio.from_thread.run_sync``, never anything blocking),
and must tolerate the trio run having finished.  kazoo re-runs *every* linked callback when a
later one is linked to a finished result, so callbacks here are idempotent (setting an already
set ``trio.Event`` is a no-op).
"""

from __future__ import annotations

from typing import Any, Callable

import trio
from kazoo import exceptions as kz

from framework import errors

_KAZOO_TO_FRAMEWORK: dict[type[BaseException], type[errors.ZooKeeperError]] = {
    kz.NoNodeError: errors.NoNodeError,
    kz.NodeExistsError: errors.NodeExistsError,
    kz.BadVersionError: errors.BadVersionError,
    kz.NotEmptyError: errors.NotEmptyError,
    kz.NoChildrenForEphemeralsError: errors.NoChildrenForEphemeralsError,
    kz.ConnectionLoss: errors.ConnectionLossError,
    kz.ConnectionClosedError: errors.NotConnectedError,
    kz.SessionExpiredError: errors.SessionExpiredError,
    kz.RolledBackError: errors.RolledBackError,
}


def translate(exc: BaseException) -> BaseException:
    """Map a kazoo exception to the framework's typed error (others pass through)."""
    for kazoo_type, ours in _KAZOO_TO_FRAMEWORK.items():
        if isinstance(exc, kazoo_type):
            new = ours(str(exc) or kazoo_type.__name__)
            new.__cause__ = exc
            return new
    if isinstance(exc, kz.ZookeeperError):
        new = errors.ZooKeeperError(f"{type(exc).__name__}: {exc}")
        new.__cause__ = exc
        return new
    return exc


def waker(token: trio.lowlevel.TrioToken, event: trio.Event) -> Callable[..., None]:
    """A thread-safe, idempotent callback that sets ``event`` in the trio run of ``token``."""

    def wake(*_args: Any) -> None:
        try:
            token.run_sync_soon(event.set)
        except trio.RunFinishedError:
            pass

    return wake


async def wait_result(async_result: Any, token: trio.lowlevel.TrioToken) -> Any:
    """Wait for a kazoo ``IAsyncResult`` without blocking trio; return its value.

    Raises the framework's typed error for a failed request.  Cancelling this wait does not
    withdraw the request: a write's outcome is unknown after cancellation.
    """
    if not async_result.ready():
        event = trio.Event()
        async_result.rawlink(waker(token, event))
        await event.wait()
    else:
        await trio.lowlevel.checkpoint()
    return async_result.get_nowait()
