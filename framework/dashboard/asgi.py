"""The dashboard's web application: a small hand-written ASGI app.

Routes: ``/`` (the page), ``/static/*``, ``/events`` (server-sent events: the model's JSON
state at each new version, at most every :data:`PUSH_INTERVAL` per viewer), ``/api/state``,
``/api/result?app=&key=``, ``/metrics`` (Prometheus), and, only when actions are allowed,
``POST /api/requeue`` and ``POST /api/discard`` (JSON ``{"app": ..., "name": ...}``, with
the ``X-Dashboard-Action`` header so that another site's form cannot post them).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import trio

from framework import errors
from framework.dashboard import prom
from framework.dashboard.model import Model
from framework.logs import get_logger
from framework.runtime import actions
from framework.zk import Session

log = get_logger("framework.dashboard.web")

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

STATIC = Path(__file__).parent / "static"
STATIC_FILES = {
    "dashboard.js": "text/javascript; charset=utf-8",
    "dashboard.css": "text/css; charset=utf-8",
}
#: Shortest time between two pushes to one viewer (a burst of versions collapses).
PUSH_INTERVAL = 0.2
#: Largest request body accepted (actions are tiny JSON documents).
MAX_BODY = 16 * 1024


class DashboardApp:
    """ASGI callable serving ``model``; ``session`` is used only for lookups and actions."""

    def __init__(self, model: Model, session: Session) -> None:
        self.model = model
        self.session = session
        self.registry = prom.registry_for(model)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        method, path = scope["method"], scope["path"]
        try:
            if method == "GET" and path == "/":
                await _respond(send, 200, (STATIC / "index.html").read_bytes(),
                               "text/html; charset=utf-8")
            elif method == "GET" and path.startswith("/static/"):
                name = path.removeprefix("/static/")
                if name not in STATIC_FILES:
                    await _error(send, 404, "no such file")
                    return
                await _respond(send, 200, (STATIC / name).read_bytes(), STATIC_FILES[name])
            elif method == "GET" and path == "/events":
                await self._events(receive, send)
            elif method == "GET" and path == "/api/state":
                await _respond(send, 200, self.model.snapshot_bytes(), "application/json")
            elif method == "GET" and path == "/api/result":
                await self._result(scope, send)
            elif method == "GET" and path == "/metrics":
                await _respond(send, 200, prom.render(self.registry), prom.CONTENT_TYPE)
            elif method == "POST" and path in ("/api/requeue", "/api/discard"):
                await self._action(scope, receive, send, path.removeprefix("/api/"))
            else:
                await _error(send, 404, f"no route {method} {path}")
        except actions.ActionError as exc:
            await _error(send, 400, str(exc))
        except errors.ZooKeeperError as exc:
            await _error(send, 503, f"ZooKeeper: {type(exc).__name__}: {exc}")

    async def _events(self, receive: Receive, send: Send) -> None:
        """Server-sent events until the viewer goes away; reads the model only."""
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache"),
            (b"x-accel-buffering", b"no")]})
        self.model.viewers += 1
        log.info("dashboard.viewer_joined", viewers=self.model.viewers)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_until_disconnect, receive, nursery.cancel_scope)
                version = -1
                while True:
                    version = await self.model.wait_newer(version)
                    body = b"data: " + self.model.snapshot_bytes() + b"\n\n"
                    await send({"type": "http.response.body", "body": body, "more_body": True})
                    await trio.sleep(PUSH_INTERVAL)
        finally:
            self.model.viewers -= 1
            log.info("dashboard.viewer_left", viewers=self.model.viewers)

    async def _result(self, scope: Scope, send: Send) -> None:
        query = parse_qs(scope.get("query_string", b"").decode())
        app, key = query.get("app", [""])[0], query.get("key", [""])[0]
        if not app or not key:
            raise actions.ActionError("give app and key")
        record = await actions.lookup_result(self.session, app, key)
        await _json(send, 200, {"app": app, "key": key, "found": record is not None,
                                "result": record})

    async def _action(self, scope: Scope, receive: Receive, send: Send, what: str) -> None:
        if not self.model.allow_actions:
            await _error(send, 403, "read-only dashboard: start it with --allow-actions")
            return
        headers = dict(scope.get("headers", []))
        if headers.get(b"x-dashboard-action") != b"1":
            await _error(send, 403, "missing X-Dashboard-Action header")
            return
        try:
            doc = json.loads(await _body(receive))
            app, name = str(doc["app"]), str(doc["name"])
        except (ValueError, KeyError, TypeError):
            raise actions.ActionError('expected JSON {"app": ..., "name": ...}') from None
        if what == "requeue":
            item = await actions.requeue(self.session, app, name)
            await _json(send, 200, {"ok": True, "item": item})
        else:
            await actions.discard(self.session, app, name)
            await _json(send, 200, {"ok": True})


async def _until_disconnect(receive: Receive, scope: trio.CancelScope) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    scope.cancel()


async def _body(receive: Receive) -> bytes:
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise actions.ActionError("the request was cut off")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY:
            raise actions.ActionError("request body too large")
        chunks.append(chunk)
        if not message.get("more_body"):
            return b"".join(chunks)


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


async def _respond(send: Send, status: int, body: bytes, content_type: str) -> None:
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", content_type.encode()), (b"content-length", str(len(body)).encode()),
        (b"cache-control", b"no-store")]})
    await send({"type": "http.response.body", "body": body})


async def _json(send: Send, status: int, doc: Any) -> None:
    await _respond(send, status, json.dumps(doc, default=str).encode(), "application/json")


async def _error(send: Send, status: int, message: str) -> None:
    await _json(send, status, {"ok": False, "error": message})
