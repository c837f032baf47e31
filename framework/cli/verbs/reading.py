"""The verbs that read an application: ``status``, ``apps``, ``inspect``, ``result``.

The runtime returns data (:mod:`framework.runtime.operations`); these print it, as tables
(:mod:`framework.cli.render`) or as JSON (``--json``).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from framework.cli.common import (
    app_named,
    connect,
    new_console,
    print_json,
    schedules_of,
    unknown_app,
)
from framework.cli.connection import ONE_SHOT_DEADLINE


def cmd_status(args: argparse.Namespace) -> int:
    """``framework status APP``: one look (or ``--watch``: one per change); exit status 1
    for an unknown app."""
    from framework.runtime.operations import gather_status, known_apps

    app = app_named(args.app)
    if args.watch:
        return connect(args, lambda s: _watch_status(s, app, args), deadline=None)

    async def work(session: Any) -> tuple[Any, list[str]]:
        status = await gather_status(session, app)
        return status, ([] if status.exists else await known_apps(session, app.root))

    status, known = connect(args, work, deadline=args.timeout)
    if not status.exists and not args.json:
        print(f"framework: {unknown_app(app.name, known)}", file=sys.stderr)
        return 1
    _show_status(status, args.json)
    return 0 if status.exists else 1


def _show_status(status: Any, as_json: bool, console: Any = None) -> None:
    from framework.cli import render

    if as_json:
        print(status.to_json(indent=None if console else 2), flush=True)
    else:
        (console or new_console()).print(render.render_status(status))


async def _watch_status(session: Any, app: Any, args: argparse.Namespace) -> int:
    """Show the status again at every change of what it watches (at most once per
    ``--interval`` seconds), until Ctrl-C."""
    import time

    import trio

    from framework import errors
    from framework.runtime.operations import Watches, gather_status

    console = new_console()
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


def cmd_apps(args: argparse.Namespace) -> int:
    """``framework apps``: every application with its leader, counts and state."""
    import attrs

    from framework.cli import render
    from framework.runtime.operations import list_apps

    apps = connect(args, list_apps, deadline=args.timeout)
    if args.json:
        print_json([attrs.asdict(a) | {"state": a.state} for a in apps])
    else:
        new_console().print(render.render_apps(apps))
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    """``framework inspect APP WHAT``: active, scheduled, delayed, types or queues."""
    from framework.cli import render
    from framework.runtime import operations as look
    from framework.runtime.operations import require_app

    app = app_named(args.app)
    schedules = schedules_of(args.schedules) if args.schedules else None

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
        return await look.queue_reports(session, app, sample=args.sample)

    found = connect(args, work, deadline=args.timeout)
    if args.what == "scheduled":
        delayed, states = found
        if args.json:
            print_json({"delayed": look.unstructure(delayed),
                         "schedules": look.unstructure(states)})
        else:
            console = new_console()
            console.print(render.render_delayed(delayed))
            console.print(render.render_schedules(states))
        return 0
    if args.json:
        print_json(look.unstructure(found))
        return 0
    table_of = {"active": render.render_active, "delayed": render.render_delayed,
                "types": render.render_types, "queues": render.render_queues}
    new_console().print(table_of[args.what](found))
    return 0


def cmd_result(args: argparse.Namespace) -> int:
    """``framework result APP KEY``: the task's result record as JSON; exit status 1 if
    there is none or the task did not succeed."""
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

    record = connect(args, work, deadline=None if args.wait else args.timeout or
                      ONE_SHOT_DEADLINE)
    if record is None:
        within = f" within {args.timeout:g}s" if args.wait and args.timeout else " (yet)"
        print(f"framework: no result for task {args.key!r} of {args.app!r}{within}",
              file=sys.stderr)
        return 1
    print_json(records.unstructure(record))  # the outcome as its value: "succeeded"
    if not record.ok:
        ended = {"revoked": "was revoked",
                 "expired": "expired: not started before its expires time"}.get(
            record.outcome.value, f"{record.outcome.value}: {record.error}")
        print(f"framework: task {args.key!r} of {args.app!r} {ended}", file=sys.stderr)
        return 1
    return 0
