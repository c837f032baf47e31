"""Cancelling an application: ``framework cancel APP`` creates ``/apps/<app>/cancel``.

Every worker and master of the app watches that znode (one ``exists`` watch each, no
polling): a worker drains as on SIGTERM and leaves; the active master's ``lead`` is
cancelled and it exits without writing ``done``; standby masters exit too.  A master elected
after the cancel reads it (with ``done``) before leading, so ``lead`` never starts again.
Delete the znode to run the app again.
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
