"""The ``framework`` command (also ``python -m framework``).

Every user mistake ends in one line on stderr and exit status 2, never a stack trace.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from typing import Any, Awaitable, Callable, Sequence, TypeVar

from framework.errors import FrameworkError

Command = Callable[[argparse.Namespace], int]
T = TypeVar("T")

#: Default overall deadline of a one-shot command (seconds).
ONE_SHOT_DEADLINE = 30.0


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

    from framework.runtime import Master, run_component
    from framework.runtime.launch import load_class

    hosts, chroot = split_chroot(zk_hosts_from(args.zk), args.chroot)
    try:
        cls = load_class(args.component)
    except SyntaxError as exc:  # the user's module does not compile: where, in one line
        raise FrameworkError(_syntax_error(args.component, exc)) from None
    component = cls(args.app, name=args.name, address=args.address or "")
    if args.listen is not None:
        _set_listen(component, args.component, args.listen)
    if args.concurrency is not None:
        if isinstance(component, Master):
            raise FrameworkError(f"--concurrency is for workers; {args.component} is a Master")
        component.concurrency = args.concurrency  # this process's slots, not the class's
    if args.metrics_port is not None:
        from framework import metrics

        metrics.serve(args.metrics_port, args.metrics_listen)
    trio.run(lambda: run_component(component, hosts, session_timeout=args.session_timeout,
                                   chroot=chroot))
    done = getattr(component, "already_done", None)
    if done is not None:  # a master elected after the job had finished: it did not lead
        import time

        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(done.at))
        print(f"framework: the job of {component.app.name!r} is already done (by "
              f"{done.master or '?'} at {when}: {done.results:,} result records, "
              f"{done.dead_letters:,} dead-lettered); `framework rerun {component.app.name}` "
              "starts a new generation", file=sys.stderr, flush=True)
    if getattr(component, "stopped_by_cancel", False):
        print(f"framework: {component.app.name!r} is cancelled, so {component.name} stopped "
              f"(`framework resume {component.app.name}` makes it take tasks again; then "
              "start this again)", file=sys.stderr, flush=True)
        return 0
    summary = getattr(component, "summary", None)
    if summary is not None:  # a master whose lead() returned in this process
        print(f"job done: {summary['results']:,} result records, "
              f"{summary['dead_letters']:,} dead-lettered", flush=True)
        if summary["dead_letters"] and getattr(component, "fail_on_dead_letters", False):
            return 1
    return 0


def _set_listen(component: object, name: str, listen: str) -> None:
    """``--listen HOST[:PORT]`` for a component that serves others (a broker server, a
    Katta node: an attribute ``listen``, which its own environment variable sets too)."""
    from framework.addresses import parse_address

    if not hasattr(component, "listen"):
        raise FrameworkError(f"--listen is for a component that serves other processes (a "
                             f"broker server, a Katta node); {name} listens on nothing")
    parse_address(listen, what="--listen")  # one line for a malformed address
    component.listen = listen  # type: ignore[attr-defined]


def _syntax_error(component: str, exc: SyntaxError) -> str:
    """One line for a module of ``component`` that does not compile: file:line and why."""
    where = exc.filename or "?"
    if exc.lineno:
        where += f":{exc.lineno}"
    module = component.partition(":")[0]
    return (f"cannot import module {module!r}: {type(exc).__name__} at {where}: "
            f"{exc.msg or exc}")


def _quiet() -> None:
    """A one-shot reader's own session connect/close events are noise in its output."""
    from framework.logs import configure_logging

    configure_logging(level=os.environ.get("FRAMEWORK_LOG_LEVEL") or "warning")


def _connect(args: argparse.Namespace, work: Callable[[Any], Awaitable[T]], *,
             deadline: float | None = ONE_SHOT_DEADLINE) -> T:
    """``one_shot`` with the command's ``--zk``, ``--chroot`` and ``--connect-timeout``."""
    _quiet()
    return one_shot(zk_hosts_from(args.zk), work, chroot=args.chroot,
                    connect_timeout=args.connect_timeout, deadline=deadline)


def _app(name: str) -> Any:
    from framework.runtime import App

    return App(name)


def _console() -> Any:
    """A terminal's console; into a pipe or file, no width cap (rich would fold every table
    to 80 columns)."""
    from rich.console import Console

    console = Console()
    return console if console.is_terminal else Console(width=100_000)


def _print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, default=json_default))


def json_default(value: Any) -> Any:
    """For ``json.dumps``: an enum as its value (``"succeeded"``, not
    ``"Outcome.SUCCEEDED"``), anything else as its text."""
    import enum

    return value.value if isinstance(value, enum.Enum) else str(value)


def _cmd_status(args: argparse.Namespace) -> int:
    from framework.runtime.operations import gather_status, known_apps

    app = _app(args.app)
    if args.watch:
        return _connect(args, lambda s: _watch_status(s, app, args), deadline=None)

    async def work(session: Any) -> tuple[Any, list[str]]:
        status = await gather_status(session, app)
        return status, ([] if status.exists else await known_apps(session, app.root))

    status, known = _connect(args, work, deadline=args.timeout)
    if not status.exists and not args.json:
        print(f"framework: {_unknown(app.name, known)}", file=sys.stderr)
        return 1
    _show_status(status, args.json)
    return 0 if status.exists else 1


def _unknown(name: str, known: list[str]) -> str:
    listed = f"known: {', '.join(known)}" if known else "there are none"
    return f"no application {name!r} in this ZooKeeper ({listed})"


def _show_status(status: Any, as_json: bool, console: Any = None) -> None:
    from framework.runtime.operations import render_status

    if as_json:
        print(status.to_json(indent=None if console else 2), flush=True)
    else:
        (console or _console()).print(render_status(status))


async def _watch_status(session: Any, app: Any, args: argparse.Namespace) -> int:
    """Show the status again at every change of what it watches (at most once per
    ``--interval`` seconds), until Ctrl-C."""
    import time

    import trio

    from framework import errors
    from framework.runtime.operations import Watches, gather_status

    console = _console()
    watches = Watches()
    while True:
        watches.reset()
        try:
            status = await gather_status(session, app, watches=watches)
        except (errors.ConnectionLossError, errors.SessionExpiredError):
            await session.wait_connected()  # then read everything again, watches re-armed
            continue
        if not args.json and console.is_terminal:
            console.clear()
        elif not args.json:
            print(f"--- {time.strftime('%H:%M:%S')} ---", flush=True)
        _show_status(status, args.json, console)
        shown = trio.current_time()
        await watches.changed.wait()
        await trio.sleep_until(shown + args.interval)


def _cmd_apps(args: argparse.Namespace) -> int:
    import attrs

    from framework.runtime.operations import list_apps, render_apps

    apps = _connect(args, list_apps, deadline=args.timeout)
    if args.json:
        _print_json([attrs.asdict(a) | {"state": a.state} for a in apps])
    else:
        _console().print(render_apps(apps))
    return 0


def _cmd_result(args: argparse.Namespace) -> int:
    import trio

    from framework import records
    from framework.runtime import Client
    from framework.runtime.operations import require_app

    async def work(session: Any) -> Any:
        client = Client(session, args.app)
        await require_app(session, client.app)
        if not args.wait:
            return await client.result(args.key)
        try:
            return await client.result(args.key, wait=True, timeout=args.timeout)
        except trio.TooSlowError:
            return None

    record = _connect(args, work, deadline=None if args.wait else args.timeout or
                      ONE_SHOT_DEADLINE)
    if record is None:
        within = f" within {args.timeout:g}s" if args.wait and args.timeout else " (yet)"
        print(f"framework: no result for task {args.key!r} of {args.app!r}{within}",
              file=sys.stderr)
        return 1
    _print_json(records.unstructure(record))  # the outcome as its value: "succeeded"
    if not record.ok:
        ended = {"revoked": "was revoked",
                 "expired": "expired: not started before its expires time"}.get(
            record.outcome.value, f"{record.outcome.value}: {record.error}")
        print(f"framework: task {args.key!r} of {args.app!r} {ended}", file=sys.stderr)
        return 1
    return 0


def _cmd_dead(args: argparse.Namespace) -> int:
    import attrs
    from rich.table import Table

    from framework.runtime import Client

    if args.action != "requeue" and (args.all or args.keys):
        raise FrameworkError(f"dead {args.action} takes no KEY and no --all")
    if args.action == "requeue" and bool(args.all) == bool(args.keys):
        raise FrameworkError("dead requeue needs the KEYs of the dead letters, or --all")

    from framework.runtime.operations import require_app

    async def work(session: Any) -> list[Any]:
        client = Client(session, args.app)
        await require_app(session, client.app)
        letters = await client.dead_letters()
        if args.action == "list":
            return letters
        if args.action == "purge":
            for letter in letters:
                for name in (*letter.older, letter.name):
                    await client.discard(name)
            return letters
        chosen = letters
        if not args.all:
            missing = [k for k in args.keys
                       if not any(k in (d.key, d.name, *d.older) for d in letters)]
            if missing:
                raise FrameworkError(f"no dead letter {missing[0]!r} in {args.app!r} "
                                     "(`framework dead APP list` shows them)")
            chosen = [d for d in letters
                      if d.key in args.keys or {d.name, *d.older} & set(args.keys)]
        done = []
        for letter in chosen:
            done.append((letter, await client.requeue(letter.name)))
            for name in letter.older:  # superseded by the one requeued
                await client.discard(name)
        return done

    _app(args.app)
    done = _connect(args, work, deadline=args.timeout)
    if args.action == "list":
        if args.json:
            _print_json([attrs.asdict(d) for d in done])
        elif not done:
            print(f"No dead letters in {args.app!r}.")
        else:
            table = Table(title=f"dead letters of {args.app}", title_justify="left")
            for column in ("key", "attempts", "error", "name"):
                table.add_column(column, overflow="fold")
            for d in done:
                name = d.name + (f" (and {len(d.older)} older, superseded)" if d.older else "")
                table.add_row(str(d.key), str(d.attempts), str(d.error or "-"), name)
            _console().print(table)
    elif args.action == "purge":
        print(f"deleted {len(done)} dead letter(s) of {args.app!r}")
    else:
        for letter, item in done:
            print(f"requeued {letter.key} (dead letter {letter.name}) as {item}")
        print(f"requeued {len(done)} dead letter(s) of {args.app!r}")
    return 0


def _cmd_purge(args: argparse.Namespace) -> int:
    from framework.runtime import Client
    from framework.runtime.operations import known_apps

    app = _app(args.app)

    async def work(session: Any) -> list[str] | None:
        if await Client(session, app).purge(force=args.force, grace=args.grace, by=_by()):
            return None
        return await known_apps(session, app.root)

    known = _connect(args, work, deadline=args.timeout + (args.grace if args.force else 0))
    if known is not None:
        print(f"framework: {_unknown(app.name, known)}", file=sys.stderr)
        return 1
    print(f"deleted {app.base}")
    return 0


def _by() -> str:
    """Who does it, for the records that say so: this host and process."""
    import socket

    return f"{socket.gethostname()}-{os.getpid()}"


def _cmd_resume(args: argparse.Namespace) -> int:
    import time

    from framework.runtime import Client

    app = _app(args.app)
    record = _connect(args, lambda s: Client(s, app).resume(), deadline=args.timeout)
    if record is None:
        print(f"{app.name!r} was not cancelled: nothing to resume")
        return 0
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(record.at)) if record.at else "?"
    print(f"resumed {app.name!r}: deleted its cancel node (cancelled at {when} by "
          f"{record.by or '?'}); it takes tasks again, start its masters and workers")
    return 0


def _cmd_rerun(args: argparse.Namespace) -> int:
    from framework.runtime import Client

    app = _app(args.app)
    past = _connect(args, lambda s: Client(s, app).rerun(by=_by()), deadline=args.timeout)
    print(f"{app.name!r}: generation {past.generation} kept in {app.base}/history "
          f"({past.done.results:,} result records, {past.done.dead_letters:,} "
          f"dead-lettered); its results, failures and dead letters are cleared and done is "
          f"deleted: the next master started runs generation {past.generation + 1}")
    return 0


def _cmd_revoke(args: argparse.Namespace) -> int:
    import socket

    from framework.runtime import Client, Revocation
    from framework.runtime.client import UnknownTask
    from framework.runtime.operations import require_app

    app = _app(args.app)
    by = f"{socket.gethostname()}-{os.getpid()}"
    async def work(session: Any) -> Any:
        await require_app(session, app)  # a missing app: one line naming the known ones
        return await Client(session, app).revoke(args.task_id, by=by)

    try:
        done = _connect(args, work, deadline=args.timeout)
    except BaseException as exc:  # maybe inside trio's exception groups
        refused = user_error(exc)
        if not isinstance(refused, UnknownTask):
            raise
        print(f"framework: {refused}", file=sys.stderr)
        return 1
    print({
        Revocation.REVOKED: f"revoked task {args.task_id!r} of {app.name!r}: it will not run "
                            "(cancelled now if it is running), recorded as revoked",
        Revocation.ALREADY: f"task {args.task_id!r} of {app.name!r} was already revoked",
        Revocation.FINISHED: f"task {args.task_id!r} of {app.name!r} has finished: nothing "
                             f"to revoke (framework result {app.name} {args.task_id})",
    }[done])
    return 0


def _cmd_cancel(args: argparse.Namespace) -> int:
    import socket

    from framework.runtime import Client

    app = _app(args.app)
    by = f"{socket.gethostname()}-{os.getpid()}"
    new = _connect(args, lambda s: Client(s, app).cancel(by=by), deadline=args.timeout)
    if new:
        print(f"cancelled {app.name!r}: its masters and workers drain and stop ({app.cancel})")
    else:
        print(f"{app.name!r} was already cancelled ({app.cancel})")
    return 0


def _payload_text(args: argparse.Namespace) -> tuple[str, str]:
    """The payload's JSON text and where it came from (the argument, a file, stdin)."""
    if args.payload_file is not None and args.payload is not None:
        raise FrameworkError("give PAYLOAD_JSON or --payload-file, not both")
    if args.payload_file is None:
        return (args.payload if args.payload is not None else "null"), "PAYLOAD_JSON"
    if args.payload_file == "-":
        return sys.stdin.read(), "standard input"
    try:
        with open(args.payload_file, encoding="utf-8") as file:
            return file.read(), args.payload_file
    except OSError as exc:
        raise FrameworkError(f"cannot read --payload-file {args.payload_file}: "
                             f"{exc.strerror}") from None


def _cmd_submit(args: argparse.Namespace) -> int:
    from framework.runtime import Client
    from framework.runtime.operations import require_app

    if args.eta is not None and args.countdown is not None:
        raise FrameworkError("give --countdown or --eta, not both")
    eta = parse_eta(args.eta) if args.eta is not None else None
    text, source = _payload_text(args)
    try:
        payload = json.loads(text)
    except ValueError as exc:
        raise FrameworkError(f"the payload in {source} is not JSON ({exc})") from None
    _app(args.app)

    async def work(session: Any) -> Any:
        client = Client(session, args.app, create=args.create)
        client.unchecked = _unchecked_note  # type: ignore[method-assign]
        if not args.create:
            await require_app(session, client.app, hint="--create to create it")
        if args.key is not None:
            found = await client.existing(args.key)
            if found is not None and found.state in ("failed", "revoked", "expired"):
                print(f"framework: task {args.key!r} of {args.app!r} {found.describe()}: "
                      "queued again", file=sys.stderr)
        return await client.submit(args.task, payload, key=args.key, priority=args.priority,
                                   time_limit=args.time_limit, countdown=args.countdown,
                                   eta=eta, expires=args.expires)

    task = _connect(args, work, deadline=args.timeout)
    print(task.id)
    return 0


def parse_eta(text: str, now: float | None = None) -> Any:
    """``--eta``'s ISO 8601 time as an aware datetime: a time with no offset is UTC
    (``2026-11-28T18:00:00`` = ``...T18:00:00Z``); a date alone is its midnight UTC.  A
    malformed or past time is a one-line :class:`FrameworkError`."""
    import time
    from datetime import UTC, datetime

    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise FrameworkError(f"--eta {text!r} is not an ISO 8601 time (e.g. "
                             "2026-11-28T18:00:00Z or 2026-11-28T19:00:00+01:00; no offset "
                             "means UTC)") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    now = time.time() if now is None else now
    if when.timestamp() < now:
        current = datetime.fromtimestamp(now, UTC).isoformat(timespec="seconds")
        raise FrameworkError(f"--eta {text!r} is in the past ({when.isoformat()}; now is "
                             f"{current.replace('+00:00', 'Z')})")
    return when


def _cmd_inspect(args: argparse.Namespace) -> int:
    from framework.runtime import operations as look
    from framework.runtime.operations import require_app

    app = _app(args.app)
    schedules = _schedules_of(args.schedules) if args.schedules else None

    async def work(session: Any) -> Any:
        await require_app(session, app)  # a missing app: one line naming the known ones
        if args.what == "active":
            return await look.active(session, app)
        if args.what == "delayed":
            return await look.delayed_tasks(session, app, limit=args.limit)
        if args.what == "scheduled":
            return (await look.delayed_tasks(session, app, limit=args.limit),
                    await look.schedule_states(session, app, schedules))
        if args.what == "types":
            return await look.type_rows(session, app)
        return [await look.queue_report(session, app, sample=args.sample)]

    found = _connect(args, work, deadline=args.timeout)
    if args.what == "scheduled":
        delayed, states = found
        if args.json:
            _print_json({"delayed": look.unstructure(delayed),
                         "schedules": look.unstructure(states)})
        else:
            console = _console()
            console.print(look.render_delayed(delayed))
            console.print(look.render_schedules(states))
        return 0
    if args.json:
        _print_json(look.unstructure(found))
        return 0
    render = {"active": look.render_active, "delayed": look.render_delayed,
              "types": look.render_types, "queues": lambda r: look.render_queue(r[0])}
    _console().print(render[args.what](found))
    return 0


def _schedules_class(component: str) -> Any:
    from framework.runtime.launch import load_class

    try:
        return load_class(component)
    except SyntaxError as exc:
        raise FrameworkError(_syntax_error(component, exc)) from None


def _schedules_of(component: str) -> list[Any]:
    """The ``schedules`` of class ``MODULE:CLASS`` (a Master or a Worker), checked."""
    from framework.runtime.worker_parts import check_schedules

    cls = _schedules_class(component)
    return check_schedules(cls, getattr(cls, "schedules", []))


def _unchecked_note(app: str, name: str) -> None:
    print(f"framework: note: no worker of {app!r} has registered its task types yet, so "
          f"task type {name!r} was queued without a check against them",
          file=sys.stderr)


def _cmd_dashboard(args: argparse.Namespace) -> int:
    import trio

    from framework.dashboard import serve_dashboard
    from framework.logs import configure_logging

    configure_logging(level=os.environ.get("FRAMEWORK_LOG_LEVEL") or "info")
    hosts, chroot = split_chroot(zk_hosts_from(args.zk), args.chroot)
    schedules: dict[str, list[Any]] = {}
    for component in args.schedules:
        cls = _schedules_class(component)
        app = getattr(cls, "app_name", None)
        if not app:
            raise FrameworkError(f"--schedules {component}: the class names no app_name")
        schedules.setdefault(app, []).extend(_schedules_of(component))
    trio.run(lambda: serve_dashboard(hosts, host=args.host, port=args.port,
                                     allow_actions=args.allow_actions, chroot=chroot,
                                     connect_timeout=args.connect_timeout,
                                     schedules=schedules))
    return 0


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("framework")
    except PackageNotFoundError:
        return "unknown"


STATUS_HELP = (
    "queue depth = tasks queued or being handled; running = tasks being handled now (their "
    "progress in the running-tasks table); results = tasks finished, successfully or failed "
    "for good; dead letters = tasks given up and not requeued; a worker's done = tasks that "
    "process finished successfully since it started; failed = its failed attempts (each "
    "retry of a task counts again); a listed worker is alive (its session's pings keep its "
    "node, no status writes needed), changed = when its status last changed"
)

ENVIRONMENT_HELP = (
    "environment: FRAMEWORK_ZK_HOSTS (the connect string when --zk is not given; now: "
    "{hosts}), FRAMEWORK_LOG_LEVEL (log level; default: info for run/dashboard, warning for "
    "the other commands; now: {level})"
)


def _environment_help() -> str:
    return ENVIRONMENT_HELP.format(
        hosts=repr(os.environ["FRAMEWORK_ZK_HOSTS"]) if os.environ.get("FRAMEWORK_ZK_HOSTS")
        else "unset", level=os.environ.get("FRAMEWORK_LOG_LEVEL") or "unset")


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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="framework",
        description="Distributed master/worker jobs on Apache ZooKeeper.",
        epilog=_environment_help(),
    )
    parser.add_argument("--version", action="version", version=f"framework {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    def command(name: str, func: Command, help: str) -> argparse.ArgumentParser:
        cmd = sub.add_parser(name, help=help, description=help[0].upper() + help[1:] + ".",
                             epilog=_environment_help())
        cmd.set_defaults(func=func)
        return cmd

    zk = sub.add_parser("zk", help="run a local ZooKeeper in the foreground until Ctrl-C")
    zk.add_argument("--port", type=int, default=2181, help="client port (standalone only)")
    zk.add_argument("--size", type=int, default=1, help="members (1 = standalone, 3 = ensemble)")
    zk.add_argument("--data-dir", default=None, help="keep data here (default: a temp dir)")
    zk.add_argument("--tick-ms", type=int, default=200, help="ZooKeeper tickTime in ms")
    zk.set_defaults(func=_cmd_zk)

    run = command("run", _cmd_run, "run a Master or Worker subclass in this process")
    run.add_argument("component", metavar="MODULE:CLASS", help="e.g. myapp.jobs:Fetcher")
    add_connection_arguments(run, connect_timeout=False)
    run.add_argument("--app", help="application name (default: the class's app_name)")
    run.add_argument("--name", help="this process's name (default: HOST-PID)")
    run.add_argument("--address", help="address to publish (master) or report (worker); a "
                                       "server's advertised address (see docs/deploy.md)")
    run.add_argument("--listen", metavar="HOST[:PORT]", default=None,
                     help="where a serving component (broker server, Katta node) listens: an "
                          "address of this host or 0.0.0.0 (default: the address that routes "
                          "to ZooKeeper; see docs/deploy.md)")
    run.add_argument("--session-timeout", type=float, default=10.0,
                     help="seconds (default 10)")
    run.add_argument("--metrics-port", type=port_number, default=None,
                     help="serve this process's Prometheus metrics at :PORT/metrics")
    run.add_argument("--metrics-listen", metavar="HOST", default=None,
                     help="where the metrics endpoint listens (default "
                          "$FRAMEWORK_METRICS_LISTEN, else 0.0.0.0)")
    run.add_argument("--concurrency", type=positive_int, default=None, metavar="N",
                     help="a worker's tasks at once in this process (default: the class's "
                          "concurrency)")

    apps = command("apps", _cmd_apps, "list the applications with their leader, worker "
                                      "count, queue depth and state (active, done, cancelled)")
    add_connection_arguments(apps)
    apps.add_argument("--json", action="store_true", help="machine-readable output")
    add_deadline_argument(apps)

    status = command("status", _cmd_status,
                     "show an application's state, masters, workers, queue and running tasks")
    status.description = f"{status.description} Counts: {STATUS_HELP}."
    status.add_argument("app", metavar="APP")
    add_connection_arguments(status)
    status.add_argument("--json", action="store_true",
                        help="machine-readable output (with --watch: one line per change)")
    status.add_argument("--watch", action="store_true",
                        help="show it again at every change (ZooKeeper watches) until Ctrl-C")
    status.add_argument("--interval", type=positive_seconds, default=1.0, metavar="S",
                        help="with --watch: at most one re-render per S seconds (default 1)")
    add_deadline_argument(status)

    result = command("result", _cmd_result, "print a task's result record as JSON "
                                            "(exit status 1 if there is none, or if the "
                                            "task failed)")
    result.add_argument("app", metavar="APP")
    result.add_argument("key", metavar="KEY", help="the task's id or idempotency key")
    add_connection_arguments(result)
    result.add_argument("--wait", action="store_true",
                        help="wait until it exists (a ZooKeeper watch, no polling)")
    result.add_argument("--timeout", type=positive_seconds, default=None, metavar="S",
                        help=f"give up after S seconds (default: {ONE_SHOT_DEADLINE:g}; "
                             "with --wait: no limit)")

    dead = command("dead", _cmd_dead, "list, requeue or delete an application's dead letters")
    dead.add_argument("app", metavar="APP")
    dead.add_argument("action", choices=("list", "requeue", "purge"),
                      help="list: key, attempts, error; requeue: put them back on the task "
                           "queue; purge: delete them all")
    dead.add_argument("keys", metavar="KEY", nargs="*",
                      help="requeue: these tasks (key or dead-letter name)")
    dead.add_argument("--all", action="store_true", help="requeue: every dead letter")
    dead.add_argument("--json", action="store_true", help="list: machine-readable output")
    add_connection_arguments(dead)
    add_deadline_argument(dead)

    purge = command("purge", _cmd_purge, "delete an application's whole subtree "
                                         "(refused while masters or workers are alive)")
    purge.add_argument("app", metavar="APP")
    purge.add_argument("--force", action="store_true",
                       help="with live masters or workers: cancel the app, wait until they "
                            "drained and left, then delete it")
    purge.add_argument("--grace", type=positive_seconds, default=30.0, metavar="S",
                       help="with --force: wait at most S seconds for them to leave "
                            "(default 30; past it nothing is deleted)")
    add_connection_arguments(purge)
    add_deadline_argument(purge)

    for name, func, text in (
        ("cancel", _cmd_cancel, "cancel an application: its masters and workers drain and "
                                "stop"),
        ("resume", _cmd_resume, "undo a cancel: delete the app's cancel node (then start its "
                                "processes)"),
        ("rerun", _cmd_rerun, "run a finished job again: a new generation (the old one's done "
                              "record is kept in history/; its results, failures and dead "
                              "letters are cleared)"),
    ):
        one = command(name, func, text)
        one.add_argument("app", metavar="APP")
        add_connection_arguments(one)
        add_deadline_argument(one)

    revoke = command("revoke", _cmd_revoke,
                     "revoke one task: never run if queued, cancelled if running")
    revoke.add_argument("app", metavar="APP")
    revoke.add_argument("task_id", metavar="TASK_ID")
    add_connection_arguments(revoke)
    add_deadline_argument(revoke)

    submit = command("submit", _cmd_submit, "queue one task for an application's workers "
                                            "and print its task id")
    submit.add_argument("app", metavar="APP")
    submit.add_argument("task", metavar="TASK",
                        help="the task type (a worker's @task method, or 'handle')")
    submit.add_argument("payload", metavar="PAYLOAD_JSON", nargs="?", default=None,
                        help="the task's payload, as JSON (default: null)")
    submit.add_argument("--payload-file", metavar="F", default=None,
                        help="read the payload's JSON from file F ('-': standard input); a "
                             "task is at most 64 KiB as JSON unless FRAMEWORK_PAYLOAD_STORE "
                             "names a store (a directory, or s3://bucket/prefix) for larger "
                             "payloads")
    submit.add_argument("--create", action="store_true",
                        help="create the application if it does not exist (default: refused, "
                             "naming the known ones)")
    submit.add_argument("--countdown", type=non_negative_seconds, default=None, metavar="S",
                        help="queue it S seconds from now (a delayed task)")
    submit.add_argument("--eta", default=None, metavar="TIME",
                        help="queue it at TIME, ISO 8601 (2026-11-28T18:00:00Z, or with an "
                             "offset like +01:00; no offset means UTC; a past time is "
                             "refused)")
    submit.add_argument("--key", help="task id and idempotency key (default: a new id; a key "
                                      "that succeeded, is queued or is running is refused, "
                                      "saying so; a failed one is queued again)")
    submit.add_argument("--priority", type=int, default=None,
                        help="lower is taken first (default: the task type's, else 0)")
    submit.add_argument("--time-limit", type=positive_seconds, default=None, metavar="S",
                        help="seconds the handler may take (default: the worker's)")
    submit.add_argument("--expires", type=positive_seconds, default=None, metavar="S",
                        help="seconds from its due time by which it must start, else it is "
                             "recorded 'expired' and never run (default: the task type's)")
    add_connection_arguments(submit)
    add_deadline_argument(submit)

    inspect = command("inspect", _cmd_inspect,
                      "look into an application: active (tasks running now), scheduled "
                      "(delayed tasks and periodic schedules), delayed, types (task types "
                      "and the workers taking them), queues (counts per priority lane and "
                      "task type)")
    inspect.add_argument("app", metavar="APP")
    inspect.add_argument("what", choices=("active", "scheduled", "delayed", "types", "queues"))
    inspect.add_argument("--json", action="store_true", help="machine-readable output")
    inspect.add_argument("--limit", type=positive_int, default=100, metavar="N",
                         help="delayed, scheduled: read and show the N soonest delayed "
                              "tasks (all are counted; default 100)")
    inspect.add_argument("--sample", type=non_negative_int, default=200, metavar="N",
                         help="queues: read the first N items for the per-type counts (one "
                              "read each; 0: none; default 200)")
    inspect.add_argument("--schedules", metavar="MODULE:CLASS", default=None,
                         help="scheduled: the class whose schedules fire (a Master or "
                              "Worker), to show each schedule's next fire")
    add_connection_arguments(inspect)
    add_deadline_argument(inspect)

    dash = command("dashboard", _cmd_dashboard,
                   "serve a live web dashboard of every application")
    add_connection_arguments(dash)
    dash.add_argument("--host", default=os.environ.get("FRAMEWORK_DASHBOARD_HOST", "127.0.0.1"),
                      help="address to listen on (default $FRAMEWORK_DASHBOARD_HOST, else "
                           "127.0.0.1)")
    dash.add_argument("--port", type=port_number, default=8321, help="HTTP port (default 8321)")
    dash.add_argument("--allow-actions", action="store_true",
                      help="enable the requeue, discard and revoke buttons (read-only "
                           "otherwise)")
    dash.add_argument("--schedules", metavar="MODULE:CLASS", action="append", default=[],
                      help="a class whose schedules fire (a Master or Worker; its app_name "
                           "names the app), to show each schedule's next fire; repeatable")
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


def add_deadline_argument(parser: argparse.ArgumentParser,
                          default: float = ONE_SHOT_DEADLINE, *, shared: bool = False) -> None:
    """``--timeout SECONDS``: the overall deadline of a one-shot command.

    ``shared``: for a parent parser shared by a program and its subcommands, so the option
    may come before or after the command; it is then left unset when not given (fill in
    ``default`` after parsing)."""
    parser.add_argument("--timeout", type=positive_seconds,
                        default=argparse.SUPPRESS if shared else default,
                        help=f"give up after this many seconds (default {default:g})")


def _bounded(kind: type[Any], what: str, low: float, high: float | None = None,
             *, above: bool = False) -> Callable[[str], Any]:
    """An argparse type: ``kind`` parsed from the text and checked against its bounds
    (``above``: strictly above ``low``), each mistake one line."""
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not {what}: {text!r}") from None
        if high is not None and not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be between {low:g} and {high:g}: {text!r}")
        if (value <= low) if above else (value < low):
            bound = "positive" if above and low == 0 else f"{low:g} or more"
            raise argparse.ArgumentTypeError(f"must be {bound}: {text!r}")
        return value

    return parse


#: argparse types shared by every command line (the framework's and the examples')
positive_seconds = _bounded(float, "a number of seconds", 0, above=True)
non_negative_seconds = _bounded(float, "a number of seconds", 0)
positive_int = _bounded(int, "a whole number", 1)
non_negative_int = _bounded(int, "a whole number", 0)
port_number = _bounded(int, "a port number", 0, 65535)


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
