"""``framework dashboard``: one ZooKeeper session, the feed, and the web application."""

from __future__ import annotations

from typing import Any

import trio

from framework import web
from framework.dashboard.asgi import dashboard_app
from framework.dashboard.feed import Feed
from framework.dashboard.model import Model
from framework.logs import get_logger
from framework.web import Listener
from framework.zk import Session

log = get_logger("framework.dashboard")


def listen(host: str = "127.0.0.1", port: int = 8321) -> Listener:
    """Listen on ``host:port`` now (port 0: any free port), or a one-line error."""
    return web.listen(host, port, what="dashboard")


async def run_dashboard(session: Session, listener: Listener, *, allow_actions: bool = False,
                        task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    """Feed a model from ``session`` and serve it on ``listener`` until cancelled;
    ``task_status.started`` gets the URL (``http://host:port``)."""
    model = Model(allow_actions=allow_actions)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(Feed(session, model).run)
        url = await nursery.start(lambda task_status: web.serve(
            dashboard_app(model, session), listener, task_status=task_status))
        log.info("dashboard.serving", url=url, zk=session.hosts, allow_actions=allow_actions)
        task_status.started(url)


async def serve_dashboard(hosts: str, *, host: str = "127.0.0.1", port: int = 8321,
                          allow_actions: bool = False, chroot: str | None = None,
                          session_timeout: float = 10.0, connect_timeout: float = 10.0,
                          task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    """Listen, connect to ZooKeeper at ``hosts`` and serve until cancelled."""
    listener = listen(host, port)
    async with Session(hosts, chroot=chroot, session_timeout=session_timeout,
                       connect_timeout=connect_timeout) as session:
        await run_dashboard(session, listener, allow_actions=allow_actions,
                            task_status=task_status)
