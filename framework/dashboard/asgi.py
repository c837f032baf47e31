"""The dashboard's web application (Starlette).

Routes: ``/`` (the page), ``/static/*``, ``/events`` (server-sent events: the model's JSON
state at each new version, at most every :data:`PUSH_INTERVAL` per viewer), ``/api/state``,
``/api/result?app=&key=``, ``/metrics`` (Prometheus), and, only when actions are allowed,
``POST /api/requeue``, ``POST /api/discard`` (``name``: a dead letter) and ``POST
/api/revoke`` (``name``: a task id; ``framework revoke``'s contract: never run if queued or
delayed, cancelled if running; an id that is not there is refused, 400), each JSON ``{"app":
..., "name": ...}`` with the ``X-Dashboard-Action`` header so that another site's form cannot
post them.  Errors are
JSON ``{"ok": false, "error": ...}``: 400 for a bad request, 401 without the token (when
one is set), 403 for a refused action, 404 for an unknown route, 503 when ZooKeeper cannot
answer.

With a token every request (page, events, API, metrics) must carry it: ``Authorization:
Bearer TOKEN``, or HTTP basic authentication with any user name and the token as password
(a 401 asks a browser for it; it then sends it with the page's own requests too).
"""

from __future__ import annotations

import base64
import binascii
import enum
import hmac
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import trio
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from framework import errors
from framework.dashboard import prom
from framework.dashboard.model import Model
from framework.logs import get_logger
from framework.runtime import operations as actions
from framework.runtime.app import App
from framework.zk import Session

log = get_logger("framework.dashboard.web")

STATIC = Path(__file__).parent / "static"
#: Shortest time between two pushes to one viewer (a burst of versions collapses).
PUSH_INTERVAL = 0.2
#: Largest request body accepted (actions are tiny JSON documents).
MAX_BODY = 16 * 1024
NO_STORE = {"cache-control": "no-store"}


def dashboard_app(model: Model, session: Session, *, token: str | None = None) -> Any:
    """The ASGI application serving ``model``; ``session`` is used only for lookups and
    actions; ``token``: required of every request (see the module doc)."""
    endpoints = _Endpoints(model, session)
    app = Starlette(
        routes=[
            Route("/", endpoints.page),
            Mount("/static", StaticFiles(directory=STATIC)),
            Route("/events", endpoints.events),
            Route("/api/state", endpoints.state),
            Route("/api/result", endpoints.result),
            Route("/metrics", endpoints.metrics),
            Route("/api/{action:str}", endpoints.act, methods=["POST"]),
        ],
        exception_handlers={
            actions.ActionError: _bad_request,
            errors.ZooKeeperError: _unavailable,
            HTTPException: _http_error,
        },
    )
    return app if token is None else _guarded(app, token)


class _Endpoints:
    """The routes' handlers: ``model`` is what they show, ``session`` serves lookups and
    actions (``POST /api/<action>`` with JSON ``{"app": ..., "name": ...}``)."""

    def __init__(self, model: Model, session: Session) -> None:
        self.model = model
        self.session = session
        self.registry = prom.registry_for(model)
        self.actions: dict[str, Callable[[str, str], Awaitable[dict[str, Any]]]] = {
            "requeue": self._requeue, "revoke": self._revocation, "discard": self._discard,
        }

    async def page(self, request: Request) -> Response:
        return Response((STATIC / "index.html").read_bytes(), headers=NO_STORE,
                        media_type="text/html; charset=utf-8")

    async def state(self, request: Request) -> Response:
        return Response(self.model.snapshot_bytes(), media_type="application/json",
                        headers=NO_STORE)

    async def metrics(self, request: Request) -> Response:
        return Response(prom.render(self.registry), media_type=prom.CONTENT_TYPE,
                        headers=NO_STORE)

    async def events(self, request: Request) -> Response:
        return StreamingResponse(_pushes(self.model), media_type="text/event-stream", headers={
            "cache-control": "no-cache", "x-accel-buffering": "no"})

    async def result(self, request: Request) -> Response:
        app, key = request.query_params.get("app", ""), request.query_params.get("key", "")
        if not app or not key:
            raise actions.ActionError("give app and key")
        record = await actions.lookup_result(self.session, app, key)
        return _json({"app": app, "key": key, "found": record is not None, "result": record})

    async def act(self, request: Request) -> Response:
        """An action: refused (403) unless allowed and asked for by the page's header; its
        target read from the body (400 if malformed) before the action is looked up (404
        if unknown)."""
        if not self.model.allow_actions:
            return _error(403, "read-only dashboard: start it with --allow-actions")
        if request.headers.get("x-dashboard-action") != "1":
            return _error(403, "missing X-Dashboard-Action header")
        app, name = await _action_target(request)
        perform = self.actions.get(request.path_params["action"])
        if perform is None:
            return _error(404, f"no route POST {request.url.path}")
        return _json(await perform(app, name))

    async def _requeue(self, app: str, name: str) -> dict[str, Any]:
        return {"ok": True, "item": await actions.requeue(self.session, app, name)}

    async def _revocation(self, app: str, name: str) -> dict[str, Any]:
        return {"ok": True, "revocation": await _revoke(self.session, app, name)}

    async def _discard(self, app: str, name: str) -> dict[str, Any]:
        await actions.discard(self.session, app, name)
        return {"ok": True}


async def _action_target(request: Request) -> tuple[str, str]:
    """The ``app`` and ``name`` an action's body names (an ``ActionError`` if it does not)."""
    try:
        doc = json.loads(await _body(request))
        return str(doc["app"]), str(doc["name"])
    except (ValueError, KeyError, TypeError):
        raise actions.ActionError('expected JSON {"app": ..., "name": ...}') from None


async def _bad_request(request: Request, exc: Exception) -> Response:
    return _error(400, str(exc))


async def _unavailable(request: Request, exc: Exception) -> Response:
    return _error(503, f"ZooKeeper: {type(exc).__name__}: {exc}")


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        return _error(404, f"no route {request.method} {request.url.path}")
    return _error(exc.status_code, str(exc.detail))


async def _revoke(session: Session, app: str, task_id: str) -> str:
    """Revoke ``task_id`` of ``app`` as ``framework revoke`` does; an unknown app or task,
    or a bad name, is an :class:`~framework.runtime.operations.actions.ActionError` (400)."""
    from framework.runtime import Client
    from framework.runtime.client import UnknownTask

    try:
        done = await Client(session, App(app)).revoke(task_id, by="dashboard")
    except (UnknownTask, errors.ConfigurationError, ValueError) as exc:
        raise actions.ActionError(str(exc)) from None
    log.info("dashboard.revoked", app=app, task=task_id, revocation=done.value)
    return str(done.value)


#: What a browser is told when it must authenticate.
CHALLENGE = 'Basic realm="framework dashboard", charset="UTF-8"'


def authorized(header: str | None, token: str) -> bool:
    """Whether an ``Authorization`` header carries ``token``: ``Bearer TOKEN``, or
    ``Basic`` with any user name and the token as password (compared in constant time)."""
    if not header:
        return False
    scheme, _, value = header.strip().partition(" ")
    given = value.strip()
    if scheme.lower() == "basic":
        try:
            given = base64.b64decode(given, validate=True).decode().partition(":")[2]
        except (binascii.Error, UnicodeDecodeError):
            return False
    elif scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(given.encode(), token.encode())


def _guarded(app: Any, token: str) -> Any:
    """``app`` behind the token: any other request gets 401 and the basic challenge."""

    async def guarded(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            header = next((v.decode("latin-1") for k, v in scope["headers"]
                           if k == b"authorization"), None)
            if not authorized(header, token):
                response = _error(401, "this dashboard needs its token (HTTP basic "
                                       "authentication: any user name, the token as password)")
                response.headers["www-authenticate"] = CHALLENGE
                await response(scope, receive, send)
                return
        await app(scope, receive, send)

    return guarded


async def _pushes(model: Model) -> AsyncIterator[bytes]:
    """The model's state at each new version until the viewer goes away (Starlette
    cancels the stream when it disconnects); reads the model only."""
    model.viewers += 1
    log.info("dashboard.viewer_joined", viewers=model.viewers)
    try:
        version = -1
        while True:
            version = await model.wait_newer(version)
            yield b"data: " + model.snapshot_bytes() + b"\n\n"
            await trio.sleep(PUSH_INTERVAL)
    finally:
        model.viewers -= 1
        log.info("dashboard.viewer_left", viewers=model.viewers)


async def _body(request: Request) -> bytes:
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY:
            raise actions.ActionError("request body too large")
        chunks.append(chunk)
    return b"".join(chunks)


def _json(doc: Any, status: int = 200) -> Response:
    return Response(json.dumps(doc, default=_plain).encode(), status_code=status,
                    media_type="application/json", headers=NO_STORE)


def _plain(value: Any) -> Any:
    """An enum as its value (a result's ``"outcome": "succeeded"``), else its text."""
    return value.value if isinstance(value, enum.Enum) else str(value)


def _error(status: int, message: str) -> Response:
    return _json({"ok": False, "error": message}, status)

