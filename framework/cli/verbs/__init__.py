"""The ``framework`` command's verbs, one module per group: ``processes`` (zk, run,
dashboard), ``reading`` (status, apps, inspect, result), ``tasks`` (submit, revoke, dead),
``app_state`` (cancel, resume, rerun, purge).  Each verb is ``cmd_<verb>(args) -> exit
status``; :data:`framework.cli.parser.VERBS` maps the command line's words to them."""
