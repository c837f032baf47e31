"""The ``framework`` command (also ``python -m framework``) and the toolkit every command
line of the project is built with.

The toolkit (what the examples' ``ctl`` programs import from here): connection arguments and
one-shot commands (:mod:`framework.cli.connection`: ``add_connection_arguments``,
``add_deadline_argument``, ``zk_hosts_from``, ``split_chroot``, ``preflight``, ``one_shot``),
number types (:mod:`framework.cli.numbers`), and running a verb
(:mod:`framework.cli.running`: ``dispatch``, ``run_command``, ``user_error``).  The
framework's own verbs are in :mod:`framework.cli.verbs`, its parser in
:mod:`framework.cli.parser`, its tables in :mod:`framework.cli.render`.

Every user mistake ends in one line on stderr and exit status 2, never a stack trace.
"""

from framework.cli.connection import (
    ONE_SHOT_DEADLINE,
    PREFLIGHT_TIMEOUT,
    add_connection_arguments,
    add_deadline_argument,
    one_shot,
    preflight,
    split_chroot,
    zk_hosts_from,
)
from framework.cli.numbers import (
    non_negative_int,
    non_negative_seconds,
    port_number,
    positive_int,
    positive_seconds,
)
from framework.cli.parser import build_parser, main
from framework.cli.running import Command, dispatch, run_command, user_error
from framework.cli.verbs.tasks import parse_eta

__all__ = [
    "ONE_SHOT_DEADLINE", "PREFLIGHT_TIMEOUT", "Command", "add_connection_arguments",
    "add_deadline_argument", "build_parser", "dispatch", "main", "non_negative_int",
    "non_negative_seconds", "one_shot", "parse_eta", "port_number", "positive_int",
    "positive_seconds", "preflight", "run_command", "split_chroot", "user_error",
    "zk_hosts_from",
]
