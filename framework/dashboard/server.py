"""``framework dashboard``: one ZooKeeper session, the feed, and the web application.

Access: with a token (``token=`` or ``FRAMEWORK_DASHBOARD_TOKEN``) every request must carry
it (``Authorization: Bearer TOKEN``, or HTTP basic authentication with any user name and the
token as password: a browser asks for it).  Without one the dashboard serves anybody, and so
it listens only on a loopback address: on any other it refuses to start, in one line.
"""

from __future__ import annotations

import os
from typing import Any

import trio

from framework import web
from framework.dashboard.asgi import dashboard_app
from framework.dashboard.feed import Feed
from framework.dashboard.model import Model
from framework.errors import ConfigurationError
from framework.logs import get_logger
from framework.web import Listener
from framework.zk import Session

log = get_logger("framework.dashboard")

#: The environment variable holding the dashboard's access token.
TOKEN_ENV = "FRAMEWORK_DASHBOARD_TOKEN"
#: Addresses on which the dashboard may serve without a token.
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def token_from_env() -> str | None:
    """The token in ``FRAMEWORK_DASHBOARD_TOKEN`` (``None`` if unset or empty)."""
    return os.environ.get(TOKEN_ENV, "").strip() or None


def check_access(host: str, token: str | None) -> None:
    """A one-line :class:`ConfigurationError` if the dashboard would listen on ``host`` (not
    a loopback address) without a token."""
    if token is None and host not in LOOPBACK:
        raise ConfigurationError(
            f"the dashboard would serve {host} without authentication: set {TOKEN_ENV} "
            "(its viewers then need that token) or listen on 127.0.0.1")


def listen(host: str = "127.0.0.1", port: int = 8321) -> Listener:
    """Listen on ``host:port`` now (port 0: any free port), or a one-line error."""
    return web.listen(host, port, what="dashboard")


async def run_dashboard(session: Session, listener: Listener, *, allow_actions: bool = False,
                        token: str | None = None, schedules: dict[str, list[Any]] | None = None,
                        task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    """Feed a model from ``session`` and serve it on ``listener`` until cancelled;
    ``task_status.started`` gets the URL (``http://host:port``).  ``token``: required of
    every request (see the module doc; :func:`check_access` is applied to the listener).
    ``schedules``: each app's schedule definitions (by app name), for the scheduled view's
    next fires (ZooKeeper records only the last slot of each)."""
    check_access(listener.address.rsplit(":", 1)[0].strip("[]"), token)
    model = Model(allow_actions=allow_actions, schedules=dict(schedules or {}))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(Feed(session, model).run)
        url = await nursery.start(lambda task_status: web.serve(
            dashboard_app(model, session, token=token), listener, task_status=task_status))
        log.info("dashboard.serving", url=url, zk=session.hosts, allow_actions=allow_actions,
                 authentication=token is not None)
        task_status.started(url)


async def serve_dashboard(hosts: str, *, host: str = "127.0.0.1", port: int = 8321,
                          allow_actions: bool = False, chroot: str | None = None,
                          token: str | None = None, session_timeout: float = 10.0,
                          connect_timeout: float = 10.0,
                          schedules: dict[str, list[Any]] | None = None,
                          task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    """Listen, connect to ZooKeeper at ``hosts`` and serve until cancelled.  ``token``:
    ``None`` takes ``FRAMEWORK_DASHBOARD_TOKEN``; without either, ``host`` must be a
    loopback address (a one-line :class:`ConfigurationError` before anything starts)."""
    token = token or token_from_env()
    check_access(host, token)
    listener = listen(host, port)
    async with Session(hosts, chroot=chroot, session_timeout=session_timeout,
                       connect_timeout=connect_timeout) as session:
        await run_dashboard(session, listener, allow_actions=allow_actions, token=token,
                            schedules=schedules, task_status=task_status)
