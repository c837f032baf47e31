"""The verbs that change an application's state: ``cancel``, ``resume``, ``rerun``,
``purge``."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from framework.cli.common import app_named, connect, unknown_app, who
from framework.errors import FrameworkError


def cmd_cancel(args: argparse.Namespace) -> int:
    """``framework cancel APP``: the app's masters and workers drain and stop."""
    import socket

    from framework.runtime import Client

    app = app_named(args.app)
    by = f"{socket.gethostname()}-{os.getpid()}"
    new = connect(args, lambda s: Client(s, app).cancel(by=by), deadline=args.timeout)
    if new:
        print(f"cancelled {app.name!r}: its masters and workers drain and stop ({app.cancel})")
    else:
        print(f"{app.name!r} was already cancelled ({app.cancel})")
    return 0


def cmd_resume(args: argparse.Namespace) -> int:
    """``framework resume APP``: undo a cancel (delete the app's cancel node)."""
    import time

    from framework.runtime import Client

    app = app_named(args.app)
    record = connect(args, lambda s: Client(s, app).resume(), deadline=args.timeout)
    if record is None:
        print(f"{app.name!r} was not cancelled: nothing to resume")
        return 0
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(record.at)) if record.at else "?"
    print(f"resumed {app.name!r}: deleted its cancel node (cancelled at {when} by "
          f"{record.by or '?'}); it takes tasks again, start its masters and workers")
    return 0


def cmd_rerun(args: argparse.Namespace) -> int:
    """``framework rerun APP``: a finished job runs again as a new generation."""
    from framework.runtime import Client

    app = app_named(args.app)
    past = connect(args, lambda s: Client(s, app).rerun(by=who()), deadline=args.timeout)
    print(f"{app.name!r}: generation {past.generation} kept in {app.base}/history "
          f"({past.done.results:,} result records, {past.done.dead_letters:,} "
          f"dead-lettered); its results, failures and dead letters are cleared and done is "
          f"deleted: the next master started runs generation {past.generation + 1}")
    return 0


def cmd_purge(args: argparse.Namespace) -> int:
    """``framework purge APP``: delete the app's subtree (``--force``: cancel it and wait
    for its processes to leave first); exit status 1 for an unknown app."""
    from framework.runtime import Client
    from framework.runtime.operations import known_apps

    app = app_named(args.app)
    if args.queue is not None:
        return _purge_queue(args, app)

    async def work(session: Any) -> list[str] | None:
        if await Client(session, app).purge(force=args.force, grace=args.grace, by=who()):
            return None
        return await known_apps(session, app.root)

    known = connect(args, work, deadline=args.timeout + (args.grace if args.force else 0))
    if known is not None:
        print(f"framework: {unknown_app(app.name, known)}", file=sys.stderr)
        return 1
    print(f"deleted {app.base}")
    return 0


def _purge_queue(args: argparse.Namespace, app: Any) -> int:
    """``framework purge APP --queue Q``: delete the tasks waiting in one queue."""
    from framework.runtime import Client

    if args.force:
        raise FrameworkError("--force is for purging the whole app; --queue Q is refused "
                             "while a live worker serves Q")

    async def work(session: Any) -> int:
        return await Client(session, app).purge_queue(args.queue, by=who())

    deleted = connect(args, work, deadline=args.timeout)
    print(f"deleted {deleted} task(s) waiting in queue {args.queue!r} of {app.name!r}")
    return 0
