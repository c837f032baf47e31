"""A live web dashboard of every application in a ZooKeeper (``framework dashboard``).

:mod:`.model` (the shared picture: applications, their states and the task totals the
workers publish), :mod:`.feed` (the watches that fill it, held once per dashboard process),
:mod:`.asgi` (the page, server-sent events, JSON API, ``/metrics``, the token check),
:mod:`.prom` (Prometheus families from the model, ``framework_app_*``), :mod:`.server`
(hypercorn on trio; no token off loopback is refused).  Lookups and actions are
:mod:`framework.runtime.operations.actions`.  See ``docs/dashboard.md``.
"""

from framework.dashboard.model import AppModel, Model
from framework.dashboard.server import listen, run_dashboard, serve_dashboard

__all__ = ["AppModel", "Model", "listen", "run_dashboard", "serve_dashboard"]
