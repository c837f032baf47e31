"""The framework's one HTTP stack: Starlette applications served by hypercorn on trio.

:func:`listen` binds the sockets first (a taken port is a one-line error before anything
else starts); :func:`serve` runs an ASGI application on them until cancelled and reports the
URL it serves through ``task_status``.  The dashboard, the Katta node and the examples' test
sites are Starlette applications served this way.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import attrs
import trio
from hypercorn.config import Config, Sockets
from hypercorn.trio.run import worker_serve
from hypercorn.utils import wrap_app

from framework.errors import ConfigurationError, FrameworkError


@attrs.frozen
class Listener:
    """Listening sockets, bound before anything else starts."""

    config: Config
    sockets: Sockets

    @property
    def address(self) -> str:
        """``host:port`` of the first socket."""
        host, port = self.sockets.insecure_sockets[0].getsockname()[:2]
        return f"{host}:{port}"

    @property
    def ports(self) -> tuple[int, ...]:
        """The port of each socket, in the order they were asked for."""
        return tuple(int(sock.getsockname()[1]) for sock in self.sockets.insecure_sockets)


def listen(host: str = "127.0.0.1", port: int = 0, *, ports: Sequence[int] | None = None,
           what: str = "server", graceful_timeout: float = 1.0,
           keep_alive_timeout: float | None = None, server_header: bool = True) -> Listener:
    """Listen on ``host:port`` now (port 0: any free port), or raise a one-line error.

    ``ports``: listen on each of these instead (one socket per port, all served by one
    application, which tells them apart by ``scope["server"]``: virtual hosts by port).
    ``graceful_timeout``: seconds open requests may finish once serving is cancelled;
    ``keep_alive_timeout``: seconds an idle client connection is kept (hypercorn's default
    if ``None``); ``server_header``: send hypercorn's ``server`` header."""
    wanted = list(ports) if ports is not None else [port]
    for number in wanted:
        if not 0 <= number <= 65535:
            raise ConfigurationError(f"--port must be between 0 and 65535, got {number}")
    config = Config()
    config.bind = [f"[{host}]:{n}" if ":" in host else f"{host}:{n}" for n in wanted]
    config.include_server_header = server_header
    config.accesslog = None
    config.errorlog = logging.getLogger("hypercorn.error")
    config.graceful_timeout = graceful_timeout
    if keep_alive_timeout is not None:
        config.keep_alive_timeout = keep_alive_timeout
    try:
        sockets = config.create_sockets()
        for sock in sockets.insecure_sockets:
            sock.listen(config.backlog)
    except OSError as exc:
        where = ", ".join(f"{host}:{n}" for n in wanted)
        raise FrameworkError(
            f"cannot listen on {where}: {exc.strerror or exc} "
            f"(is another {what} running there? choose another port)"
        ) from None
    return Listener(config, sockets)


async def serve(app: Any, listener: Listener, *,
                task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    """Serve ASGI ``app`` on ``listener`` until cancelled; ``task_status.started`` gets the
    URL (``http://host:port``)."""
    config = listener.config

    async def run(task_status: Any) -> None:
        await worker_serve(wrap_app(app, config.wsgi_max_body_size, "asgi"), config,
                           sockets=listener.sockets, task_status=task_status)

    async with trio.open_nursery() as nursery:
        binds = await nursery.start(run)
        task_status.started(binds[0])
