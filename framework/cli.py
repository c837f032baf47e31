"""The ``framework`` command (also ``python -m framework``).

Every user mistake ends in one line on stderr and exit status 2, never a stack trace.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from typing import Any, Awaitable, Callable, Sequence, TypeVar

from framework.errors import FrameworkError

Command = Callable[[argparse.Namespace], int]
T = TypeVar("T")


def _cmd_zk(args: argparse.Namespace) -> int:
    from framework.zkserver import ZooKeeperEnsemble

    ensemble = ZooKeeperEnsemble(
        args.size,
        client_port=args.port if args.size == 1 else None,
        base_dir=args.data_dir,
        tick_ms=args.tick_ms,
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with ensemble:
        kind = "standalone server" if args.size == 1 else f"{args.size}-node ensemble"
        print(f"ZooKeeper {kind} serving at {ensemble.connect_string}", flush=True)
        print(f"  export FRAMEWORK_ZK_HOSTS={ensemble.connect_string}", flush=True)
        print("Press Ctrl-C to stop.", flush=True)
        try:
            stop.wait()
        except KeyboardInterrupt:
            pass
    print("ZooKeeper stopped.", flush=True)
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    import trio

    from framework.runtime import load_class, run_component

    hosts = zk_hosts_from(args.zk)
    cls = load_class(args.component)
    component = cls(args.app, name=args.name, address=args.address or "")
    if args.metrics_port is not None:
        from framework import metrics

        metrics.serve(args.metrics_port)
    trio.run(lambda: run_component(component, hosts, session_timeout=args.session_timeout,
                                   chroot=args.chroot))
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    from rich.console import Console

    from framework.logs import configure_logging
    from framework.runtime import App, gather_status, render_status

    # a one-shot reader: its own session's connect/close events are noise in a status view
    configure_logging(level=os.environ.get("FRAMEWORK_LOG_LEVEL") or "warning")
    hosts = zk_hosts_from(args.zk)
    app = App(args.app)

    status = one_shot(hosts, lambda s: gather_status(s, app), chroot=args.chroot,
                      connect_timeout=args.connect_timeout, deadline=args.timeout)
    if args.json:
        print(status.to_json())
    else:
        Console().print(render_status(status))
    return 0 if status.exists else 1


def _cmd_dashboard(args: argparse.Namespace) -> int:
    import trio

    from framework.dashboard import serve_dashboard
    from framework.logs import configure_logging

    configure_logging(level=os.environ.get("FRAMEWORK_LOG_LEVEL") or "info")
    hosts = zk_hosts_from(args.zk)
    trio.run(lambda: serve_dashboard(hosts, host=args.host, port=args.port,
                                     allow_actions=args.allow_actions, chroot=args.chroot,
                                     connect_timeout=args.connect_timeout))
    return 0


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"a port is between 0 and 65535, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="framework",
        description="Distributed master/worker jobs on Apache ZooKeeper.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    zk = sub.add_parser("zk", help="run a local ZooKeeper in the foreground until Ctrl-C")
    zk.add_argument("--port", type=int, default=2181, help="client port (standalone only)")
    zk.add_argument("--size", type=int, default=1, help="members (1 = standalone, 3 = ensemble)")
    zk.add_argument("--data-dir", default=None, help="keep data here (default: a temp dir)")
    zk.add_argument("--tick-ms", type=int, default=200, help="ZooKeeper tickTime in ms")
    zk.set_defaults(func=_cmd_zk)
    zk_help = "ZooKeeper connect string (default: $FRAMEWORK_ZK_HOSTS)"
    run = sub.add_parser("run", help="run a Master or Worker subclass in this process")
    run.add_argument("component", metavar="MODULE:CLASS", help="e.g. myapp.jobs:Fetcher")
    run.add_argument("--zk", help=zk_help)
    run.add_argument("--app", help="application name (default: the class's app_name)")
    run.add_argument("--name", help="this process's name (default: HOST-PID)")
    run.add_argument("--address", help="address to publish (master) or report (worker)")
    run.add_argument("--chroot", help="ZooKeeper chroot for every path")
    run.add_argument("--session-timeout", type=float, default=10.0, help="seconds")
    run.add_argument("--metrics-port", type=_port, default=None,
                     help="serve this process's Prometheus metrics at :PORT/metrics")
    run.set_defaults(func=_cmd_run)
    status = sub.add_parser("status", help="show an application's leader, workers and queue")
    status.add_argument("app", metavar="APP")
    status.add_argument("--zk", help=zk_help)
    status.add_argument("--chroot", help="ZooKeeper chroot")
    status.add_argument("--json", action="store_true", help="machine-readable output")
    status.add_argument("--connect-timeout", type=float, default=10.0, help="seconds")
    add_deadline_argument(status)
    status.set_defaults(func=_cmd_status)
    dash = sub.add_parser("dashboard", help="serve a live web dashboard of every application")
    dash.add_argument("--zk", help=zk_help)
    dash.add_argument("--chroot", help="ZooKeeper chroot")
    dash.add_argument("--host", default="127.0.0.1", help="address to listen on")
    dash.add_argument("--port", type=_port, default=8321, help="HTTP port (default 8321)")
    dash.add_argument("--allow-actions", action="store_true",
                      help="enable the requeue and discard buttons (read-only otherwise)")
    dash.add_argument("--connect-timeout", type=float, default=10.0, help="seconds")
    dash.set_defaults(func=_cmd_dashboard)
    for register in _extra_commands:
        register(sub)
    return parser


#: Later layers add sub-commands here (each gets the subparsers object).
_extra_commands: list[Callable[[argparse._SubParsersAction], None]] = []


def zk_hosts_from(args_value: str | None) -> str:
    """The connect string from ``--zk`` or ``FRAMEWORK_ZK_HOSTS``, or a clear error."""
    hosts = args_value or os.environ.get("FRAMEWORK_ZK_HOSTS")
    if not hosts:
        raise FrameworkError(
            "no ZooKeeper given: pass --zk HOST:PORT[,HOST:PORT...] or set FRAMEWORK_ZK_HOSTS "
            "(start a local server with `python -m framework zk`)"
        )
    return hosts


#: Default overall deadline of a one-shot command (seconds).
ONE_SHOT_DEADLINE = 30.0


def add_deadline_argument(parser: argparse.ArgumentParser,
                          default: float = ONE_SHOT_DEADLINE, *, shared: bool = False) -> None:
    """``--timeout SECONDS``: the overall deadline of a one-shot command.

    ``shared``: for a parent parser shared by a program and its subcommands, so the option
    may come before or after the command; it is then left unset when not given (fill in
    ``default`` after parsing)."""
    parser.add_argument("--timeout", type=_positive_seconds,
                        default=argparse.SUPPRESS if shared else default,
                        help=f"give up after this many seconds (default {default:g})")


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text!r}")
    return value


def one_shot(hosts: str, work: Callable[[Any], Awaitable[T]], *, chroot: str | None = None,
             connect_timeout: float = 10.0, deadline: float = ONE_SHOT_DEADLINE) -> T:
    """Run ``await work(session)`` in a new trio run, all of it within ``deadline`` seconds.

    A one-shot command must never hang: reads wait for a lost connection to come back, so
    without an overall deadline a ZooKeeper that dies mid-command would keep the command
    waiting forever.  Past the deadline (connecting included) :class:`FrameworkError` says
    so in one line.
    """
    import trio

    from framework.zk import Session

    async def run() -> T:
        with trio.move_on_after(deadline):
            async with Session(hosts, chroot=chroot,
                               connect_timeout=min(connect_timeout, deadline)) as session:
                return await work(session)
        raise FrameworkError(
            f"ZooKeeper at {hosts} did not answer within {deadline:g}s "
            "(is it running and reachable? --timeout sets the limit)"
        )

    return trio.run(run)


def user_error(exc: BaseException) -> FrameworkError | None:
    """The :class:`FrameworkError` that ``exc`` is, or that trio wrapped in exception groups
    (with nothing else in them but cancellations); ``None`` if it is something else."""
    if isinstance(exc, FrameworkError):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        import trio

        found = [user_error(e) for e in exc.exceptions if not isinstance(e, trio.Cancelled)]
        if found and all(found):
            return found[0]
    return None


def run_command(prog: str, func: Command, args: argparse.Namespace) -> int:
    """Run a sub-command: a user mistake (a :class:`FrameworkError`, even one raised inside
    a nursery) ends in one line on stderr and exit status 2, Ctrl-C in status 130."""
    try:
        return func(args)
    except KeyboardInterrupt:
        return 130
    except BaseException as exc:
        error = user_error(exc)
        if error is None:
            raise
        print(f"{prog}: error: {error}", file=sys.stderr)
        return 2


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return run_command("framework", args.func, args)


if __name__ == "__main__":
    sys.exit(main())
