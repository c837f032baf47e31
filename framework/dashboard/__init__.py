"""A live web dashboard of every application in a ZooKeeper (``framework dashboard``).

:mod:`.model` (the shared picture), :mod:`.feed` (the watches that fill it, held once per
dashboard process), :mod:`.asgi` (the page, server-sent events, JSON API, ``/metrics``),
:mod:`.actions` (result lookup, requeue, discard), :mod:`.prom` (Prometheus families from the
model), :mod:`.server` (hypercorn on trio).  See ``docs/dashboard.md``.
"""

from framework.dashboard.model import AppModel, Model
from framework.dashboard.server import listen, run_dashboard, serve_dashboard

__all__ = ["AppModel", "Model", "listen", "run_dashboard", "serve_dashboard"]
