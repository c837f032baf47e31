"""Running a command line's verb: one line for a user mistake, never a traceback.

:func:`dispatch` is what the three command lines share (``framework``, the Katta-like
``ctl`` and the broker's ``ctl``): parse, find the verb's function, run it through
:func:`run_command`.  A verb is a function ``(args) -> exit status``; a command line is a
parser whose sub-commands set ``dest="command"`` and a mapping verb -> function.  A
:class:`~framework.errors.FrameworkError` (even one trio wrapped in exception groups) ends
in one line on stderr and exit status 2, Ctrl-C in 130.
"""

from __future__ import annotations

import argparse
import sys
from typing import Callable, Mapping, Sequence

from framework.errors import FrameworkError

Command = Callable[[argparse.Namespace], int]


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


def dispatch(prog: str, parser: argparse.ArgumentParser, verbs: Mapping[str, Command],
             argv: Sequence[str] | None = None, *, dest: str = "command") -> int:
    """Parse ``argv`` with ``parser`` and run the verb it names (``args.<dest>``, looked up
    in ``verbs``; else a ``func`` the sub-parser set as a default) with :func:`run_command`.
    No verb given: the help, exit status 2."""
    args = parser.parse_args(argv)
    func = verbs.get(getattr(args, dest, None) or "") or getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    return run_command(prog, func, args)
