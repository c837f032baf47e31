"""Cancelling an application: ``framework cancel APP`` creates ``/apps/<app>/cancel``.

Every worker and master of the app watches that znode (one ``exists`` watch each, no
polling): a worker drains as on SIGTERM and leaves; the active master's ``lead`` is
cancelled and it exits without writing ``done``; standby masters exit too.  A master elected
after the cancel reads it (with ``done``) before leading, so ``lead`` never starts again.
``framework resume APP`` (``Client.resume``) deletes the znode: the app takes tasks again and
processes started after it run.  ``framework purge --force`` cancels an app this way before
deleting it, and waits until its processes have left
(:func:`framework.runtime.operations.actions.purge`).
"""

from __future__ import annotations

from framework.runtime.app import App
from framework.zk import Session, wait_exists


async def wait_cancelled(session: Session, app: App) -> None:
    """Return once ``app`` is cancelled (at once if it already is)."""
    await wait_exists(session, app.cancel)


async def is_cancelled(session: Session, app: App) -> bool:
    """Whether ``app`` is cancelled now (one read)."""
    return await session.exists(app.cancel) is not None
