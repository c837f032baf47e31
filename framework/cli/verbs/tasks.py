"""The verbs about tasks: ``submit``, ``revoke``, ``dead`` (list, requeue, purge)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from framework.cli.common import app_named, connect, new_console, print_json
from framework.cli.running import user_error
from framework.errors import FrameworkError


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


def cmd_submit(args: argparse.Namespace) -> int:
    """``framework submit APP TASK [PAYLOAD_JSON]``: queue one task and print its id."""
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
    app_named(args.app)

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
                                   eta=eta, expires=args.expires, queue=args.queue)

    task = connect(args, work, deadline=args.timeout)
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


def _unchecked_note(app: str, name: str) -> None:
    print(f"framework: note: no worker of {app!r} has registered its task types yet, so "
          f"task type {name!r} was queued without a check against them (without --queue, "
          f"in 'default' until a worker registers the type, then in the type's queue)",
          file=sys.stderr)


def cmd_revoke(args: argparse.Namespace) -> int:
    """``framework revoke APP TASK_ID``: the task never runs (cancelled if running);
    exit status 1 for a task this app never had."""
    import socket

    from framework.runtime import Client, Revocation
    from framework.runtime.client import UnknownTask
    from framework.runtime.operations import require_app

    app = app_named(args.app)
    by = f"{socket.gethostname()}-{os.getpid()}"
    async def work(session: Any) -> Any:
        await require_app(session, app)  # a missing app: one line naming the known ones
        return await Client(session, app).revoke(args.task_id, by=by)

    try:
        done = connect(args, work, deadline=args.timeout)
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


def cmd_dead(args: argparse.Namespace) -> int:
    """``framework dead APP list|requeue|purge``: list the dead letters, requeue some (or
    ``--all``) or delete them all; a dead letter's older, superseded copies go with it."""
    _check_dead_arguments(args)
    app_named(args.app)
    done = connect(args, lambda session: _dead_letters_work(session, args),
                   deadline=args.timeout)
    _show_dead(args, done)
    return 0


def _check_dead_arguments(args: argparse.Namespace) -> None:
    if args.action != "requeue" and (args.all or args.keys):
        raise FrameworkError(f"dead {args.action} takes no KEY and no --all")
    if args.action == "requeue" and bool(args.all) == bool(args.keys):
        raise FrameworkError("dead requeue needs the KEYs of the dead letters, or --all")


async def _dead_letters_work(session: Any, args: argparse.Namespace) -> list[Any]:
    """The letters (``list``), the letters deleted (``purge``), or (letter, new item) for
    each one requeued."""
    from framework.runtime import Client
    from framework.runtime.operations import require_app

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
    done = []
    for letter in _chosen_letters(args, letters):
        done.append((letter, await client.requeue(letter.name)))
        for name in letter.older:  # superseded by the one requeued
            await client.discard(name)
    return done


def _chosen_letters(args: argparse.Namespace, letters: list[Any]) -> list[Any]:
    """``dead requeue``'s letters: all of them (``--all``), or those its KEYs name (a key,
    a dead letter's name or an older copy's); a KEY that names none is a one-line error."""
    if args.all:
        return letters
    missing = [k for k in args.keys if not any(k in (d.key, d.name, *d.older) for d in letters)]
    if missing:
        raise FrameworkError(f"no dead letter {missing[0]!r} in {args.app!r} "
                             "(`framework dead APP list` shows them)")
    return [d for d in letters if d.key in args.keys or {d.name, *d.older} & set(args.keys)]


def _show_dead(args: argparse.Namespace, done: list[Any]) -> None:
    if args.action == "list":
        if args.json:
            import attrs

            print_json([attrs.asdict(d) for d in done])
        elif not done:
            print(f"No dead letters in {args.app!r}.")
        else:
            from framework.cli import render

            new_console().print(render.render_dead_letters(args.app, done))
    elif args.action == "purge":
        print(f"deleted {len(done)} dead letter(s) of {args.app!r}")
    else:
        for letter, item in done:
            print(f"requeued {letter.key} (dead letter {letter.name}) as {item}")
        print(f"requeued {len(done)} dead letter(s) of {args.app!r}")
