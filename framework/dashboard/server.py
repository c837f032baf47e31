"""``framework dashboard``: one ZooKeeper session, the feed, and hypercorn on trio."""

from __future__ import annotations

import logging
from typing import Any

import attrs
import trio
from hypercorn.config import Config, Sockets
from hypercorn.trio.run import worker_serve
from hypercorn.utils import wrap_app

from framework.dashboard.asgi import DashboardApp
from framework.dashboard.feed import Feed
from framework.dashboard.model import Model
from framework.errors import ConfigurationError, FrameworkError
from framework.logs import get_logger
from framework.zk import Session

log = get_logger("framework.dashboard")


@attrs.frozen
class Listener:
    """Listening sockets, bound before anything else starts (so a taken port is reported
    at once, before connecting to ZooKeeper)."""

    config: Config
    sockets: Sockets


def listen(host: str = "127.0.0.1", port: int = 8321) -> Listener:
    """Listen on ``host:port`` now (port 0: any free port), or a one-line error."""
    if not 0 <= port <= 65535:
        raise ConfigurationError(f"--port must be between 0 and 65535, got {port}")
    config = Config()
    config.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    config.accesslog = None
    config.errorlog = logging.getLogger("hypercorn.error")
    config.graceful_timeout = 1.0
    try:
        sockets = config.create_sockets()
        for sock in sockets.insecure_sockets:
            sock.listen(config.backlog)
    except OSError as exc:
        raise FrameworkError(
            f"cannot listen on {host}:{port}: {exc.strerror or exc} "
            "(is another dashboard running there? choose another --port)"
        ) from None
    return Listener(config, sockets)


async def run_dashboard(session: Session, listener: Listener, *, allow_actions: bool = False,
                        task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    """Feed a model from ``session`` and serve it on ``listener`` until cancelled;
    ``task_status.started`` gets the URL (``http://host:port``)."""
    model = Model(allow_actions=allow_actions)
    app = DashboardApp(model, session)
    config = listener.config
    async with trio.open_nursery() as nursery:
        nursery.start_soon(Feed(session, model).run)
        binds = await nursery.start(lambda task_status: worker_serve(
            wrap_app(app, config.wsgi_max_body_size, "asgi"), config,
            sockets=listener.sockets, task_status=task_status))
        log.info("dashboard.serving", url=binds[0], zk=session.hosts,
                 allow_actions=allow_actions)
        task_status.started(binds[0])


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
