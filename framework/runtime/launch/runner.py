"""Run a ``Master`` or ``Worker`` in this process until done, stopped, or signalled.

SIGTERM or Ctrl-C asks for a graceful stop (a master resigns at once so a standby takes over;
a worker drains); a second signal cancels everything.
"""

from __future__ import annotations

import importlib
import os
import signal
import sys
from typing import Any

import trio

from framework import metrics
from framework.errors import ConfigurationError
from framework.logs import get_logger
from framework.runtime.master import Master
from framework.runtime.worker import Worker
from framework.zk import Session

log = get_logger(__name__)

Component = Master | Worker


async def run_component(component: Component, hosts: str, *, session_timeout: float = 10.0,
                        chroot: str | None = None) -> None:
    """Connect, run ``component`` and handle SIGTERM/SIGINT; return when it is done."""
    async with Session(hosts, chroot=chroot, session_timeout=session_timeout) as session:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_on_signals, component, nursery.cancel_scope)
            nursery.start_soon(_count_session_states, session)
            await component.run(session)
            nursery.cancel_scope.cancel()


async def _on_signals(component: Component, everything: trio.CancelScope) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        first = True
        async for signum in signals:
            if first:
                log.info("runtime.stop_requested", signal=signal.Signals(signum).name)
                component.request_stop()
                first = False
            else:
                log.warning("runtime.forced_stop", signal=signal.Signals(signum).name)
                everything.cancel()


async def _count_session_states(session: Session) -> None:
    """Feed the session's state changes to this process's metrics."""
    async for change in session.states():
        metrics.session_state_changed(change.state.value)


def load_class(spec: str) -> type[Any]:
    """``package.module:ClassName`` -> the class, with clear errors for user mistakes."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigurationError(f"expected MODULE:CLASS (like myapp.jobs:Fetcher), got {spec!r}")
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)  # `framework run myapp.jobs:Boss` from the project's folder
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise ConfigurationError(f"cannot import module {module_name!r}: {exc}") from None
    try:
        cls = getattr(module, attr)
    except AttributeError:
        raise ConfigurationError(f"module {module_name!r} has no attribute {attr!r}") from None
    if not (isinstance(cls, type) and issubclass(cls, (Master, Worker))):
        raise ConfigurationError(f"{spec} is not a subclass of framework.Master or Worker")
    return cls
