"""What the framework's verbs share: their session, their app, their console and JSON.

Not for the examples (their toolkit is :mod:`framework.cli.connection`,
:mod:`framework.cli.numbers` and :mod:`framework.cli.running`).
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any, Awaitable, Callable, TypeVar

from framework.cli.connection import ONE_SHOT_DEADLINE, one_shot, zk_hosts_from
from framework.errors import FrameworkError

T = TypeVar("T")


def quiet() -> None:
    """A one-shot reader's own session connect/close events are noise in its output."""
    from framework.logs import configure_logging

    configure_logging(level=os.environ.get("FRAMEWORK_LOG_LEVEL") or "warning")


def connect(args: argparse.Namespace, work: Callable[[Any], Awaitable[T]], *,
            deadline: float | None = ONE_SHOT_DEADLINE) -> T:
    """``one_shot`` with the command's ``--zk``, ``--chroot`` and ``--connect-timeout``."""
    quiet()
    return one_shot(zk_hosts_from(args.zk), work, chroot=args.chroot,
                    connect_timeout=args.connect_timeout, deadline=deadline)


def app_named(name: str) -> Any:
    """The :class:`~framework.runtime.App` of ``name`` (a bad name is a one-line error)."""
    from framework.runtime import App

    return App(name)


def new_console() -> Any:
    """A terminal's console; into a pipe or file, no width cap (rich would fold every table
    to 80 columns)."""
    from rich.console import Console

    console = Console()
    return console if console.is_terminal else Console(width=100_000)


def print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, default=json_default))


def json_default(value: Any) -> Any:
    """For ``json.dumps``: an enum as its value (``"succeeded"``, not
    ``"Outcome.SUCCEEDED"``), anything else as its text."""
    import enum

    return value.value if isinstance(value, enum.Enum) else str(value)


def unknown_app(name: str, known: list[str]) -> str:
    listed = f"known: {', '.join(known)}" if known else "there are none"
    return f"no application {name!r} in this ZooKeeper ({listed})"


def who() -> str:
    """Who does it, for the records that say so: this host and process."""
    import socket

    return f"{socket.gethostname()}-{os.getpid()}"


def syntax_error(component: str, exc: SyntaxError) -> str:
    """One line for a module of ``component`` that does not compile: file:line and why."""
    where = exc.filename or "?"
    if exc.lineno:
        where += f":{exc.lineno}"
    module = component.partition(":")[0]
    return (f"cannot import module {module!r}: {type(exc).__name__} at {where}: "
            f"{exc.msg or exc}")


def schedules_class(component: str) -> Any:
    from framework.runtime.launch import load_class

    try:
        return load_class(component)
    except SyntaxError as exc:
        raise FrameworkError(syntax_error(component, exc)) from None


def schedules_of(component: str) -> list[Any]:
    """The ``schedules`` of class ``MODULE:CLASS`` (a Master or a Worker), checked."""
    from framework.runtime.worker_parts import check_schedules

    cls = schedules_class(component)
    return check_schedules(cls, getattr(cls, "schedules", []))
