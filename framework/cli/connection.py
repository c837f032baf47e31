"""Connecting a one-shot command to ZooKeeper: its arguments, its checks, its deadline.

``add_connection_arguments`` (``--zk``, ``--chroot``, ``--connect-timeout``) and
``add_deadline_argument`` (``--timeout``) give every command line the same options;
``zk_hosts_from`` and ``split_chroot`` read them; :func:`one_shot` runs the command's work
in one session within an overall deadline, after :func:`preflight` has told an unknown host
or a refused connection in one line.  A command built on these never hangs and never shows
a traceback for a connection mistake.
"""

from __future__ import annotations

import argparse
import os
from typing import Any, Awaitable, Callable, TypeVar

from framework.cli.numbers import positive_seconds
from framework.errors import FrameworkError

T = TypeVar("T")

#: Default overall deadline of a one-shot command (seconds).
ONE_SHOT_DEADLINE = 30.0


def zk_hosts_from(args_value: str | None) -> str:
    """The connect string from ``--zk`` or ``FRAMEWORK_ZK_HOSTS``, or a clear error."""
    hosts = args_value or os.environ.get("FRAMEWORK_ZK_HOSTS")
    if not hosts:
        raise FrameworkError(
            "no ZooKeeper given: pass --zk HOST:PORT[,HOST:PORT...] or set FRAMEWORK_ZK_HOSTS "
            "(start a local server with `python -m framework zk`)"
        )
    return hosts


def add_connection_arguments(parser: argparse.ArgumentParser, *,
                             connect_timeout: bool = True, shared: bool = False) -> None:
    """``--zk``, ``--chroot`` (and ``--connect-timeout``), with their defaults in the help.

    ``shared``: for a parent parser shared by a program and its subcommands (the options
    may come before or after the command); ``--zk`` and ``--chroot`` are then left unset when
    not given (fill in ``None`` after parsing)."""
    unset: dict[str, Any] = {"default": argparse.SUPPRESS} if shared else {}
    parser.add_argument("--zk", metavar="HOSTS",
                        help="ZooKeeper connect string HOST:PORT[,HOST:PORT...][/CHROOT] "
                             "(default: $FRAMEWORK_ZK_HOSTS)", **unset)
    parser.add_argument("--chroot", help="ZooKeeper chroot for every path (default: none; "
                                         "nested inside a /CHROOT of the connect string)",
                        **unset)
    if connect_timeout:
        parser.add_argument("--connect-timeout", type=positive_seconds, default=10.0,
                            metavar="S", help="seconds to connect (default 10)")


def add_deadline_argument(parser: argparse.ArgumentParser,
                          default: float = ONE_SHOT_DEADLINE, *, shared: bool = False) -> None:
    """``--timeout SECONDS``: the overall deadline of a one-shot command.

    ``shared``: for a parent parser shared by a program and its subcommands, so the option
    may come before or after the command; it is then left unset when not given (fill in
    ``default`` after parsing)."""
    parser.add_argument("--timeout", type=positive_seconds,
                        default=argparse.SUPPRESS if shared else default,
                        help=f"give up after this many seconds (default {default:g})")


def split_chroot(hosts: str, chroot: str | None = None) -> tuple[str, str | None]:
    """``HOST:PORT[,...]/CHROOT`` -> the hosts and the chroot (``--chroot``, if given too,
    nested inside the connect string's); a bad chroot is a :class:`FrameworkError`."""
    from framework.zk import validate_path

    hosts, slash, path = hosts.partition("/")
    parts = [p.strip("/") for p in ((path if slash else ""), chroot or "") if p.strip("/")]
    if not parts:
        return hosts, None
    full = "/" + "/".join(parts)
    validate_path(full, allow_root=False)
    return hosts, full


#: Seconds the checks before connecting (name lookup, TCP connect) may take.
PREFLIGHT_TIMEOUT = 2.0


async def preflight(hosts: str, timeout: float = PREFLIGHT_TIMEOUT) -> None:
    """Fail fast, in one line, when no server of ``hosts`` can be reached: every host name
    unknown to DNS, or every server refusing the connection.  Anything else (a slow DNS, a
    silent network) is left to the session's own connect timeout."""
    import socket

    import trio
    from kazoo.hosts import collect_hosts

    from framework import errors

    unresolved: list[str] = []
    refused: list[str] = []
    pairs = collect_hosts(hosts)[0]

    async def check(host: str, port: int) -> None:
        try:
            await trio.socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except socket.gaierror:
            unresolved.append(host)
            return
        try:
            stream = await trio.open_tcp_stream(host, port)
        except OSError as exc:
            # trio raises one OSError for all the addresses tried, each attempt's error in
            # its cause (an exception group)
            tried = getattr(exc.__cause__, "exceptions", None) or [exc]
            if all(isinstance(e, ConnectionRefusedError) for e in tried):
                refused.append(f"{host}:{port}")
            return
        await stream.aclose()

    with trio.move_on_after(timeout):
        async with trio.open_nursery() as nursery:
            for host, port in pairs:
                nursery.start_soon(check, host, port)
    if unresolved and len(unresolved) == len(pairs):
        raise errors.NotConnectedError(f"cannot resolve host {unresolved[0]} (DNS lookup "
                                       f"failed; check the connect string {hosts!r})")
    if pairs and len(refused) + len(unresolved) == len(pairs):
        raise errors.NotConnectedError(
            f"could not connect to ZooKeeper at {hosts}: connection refused by "
            f"{', '.join(refused)} (is a server running there? `python -m framework zk` "
            "starts a local one)"
        )


def one_shot(hosts: str, work: Callable[[Any], Awaitable[T]], *, chroot: str | None = None,
             connect_timeout: float = 10.0,
             deadline: float | None = ONE_SHOT_DEADLINE) -> T:
    """Run ``await work(session)`` in a new trio run, all of it within ``deadline`` seconds
    (``None``: connecting within ``connect_timeout``, then no limit).

    A one-shot command must never hang: reads wait for a lost connection to come back, so
    without an overall deadline a ZooKeeper that dies mid-command would keep the command
    waiting forever.  Past the deadline (connecting included) :class:`FrameworkError` says
    so in one line.  ``hosts`` may end in ``/CHROOT``; an unknown host name or a refused
    connection is told at once (:func:`preflight`), not after the connect timeout.
    """
    import math

    import trio

    from framework.zk import Session

    hosts, chroot = split_chroot(hosts, chroot)
    limit = math.inf if deadline is None else deadline

    async def run() -> T:
        session = Session(hosts, chroot=chroot, connect_timeout=min(connect_timeout, limit))
        with trio.move_on_after(limit):
            await preflight(hosts, min(PREFLIGHT_TIMEOUT, limit))
            async with session:
                return await work(session)
        raise FrameworkError(
            f"ZooKeeper at {hosts} did not answer within {limit:g}s "
            "(is it running and reachable? --timeout sets the limit)"
        )

    return trio.run(run)
