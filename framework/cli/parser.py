"""The ``framework`` command line: its parser and its verbs (one module per group of verbs
in :mod:`framework.cli.verbs`), run by :func:`~framework.cli.running.dispatch`."""

from __future__ import annotations

import argparse
import os
from typing import Sequence

from framework.cli.connection import (
    ONE_SHOT_DEADLINE,
    add_connection_arguments,
    add_deadline_argument,
)
from framework.cli.numbers import (
    non_negative_int,
    non_negative_seconds,
    port_number,
    positive_int,
    positive_seconds,
)
from framework.cli.running import Command, dispatch
from framework.cli.verbs import app_state, processes, reading, tasks

#: Each verb of ``framework`` and its function.
VERBS: dict[str, Command] = {
    "zk": processes.cmd_zk,
    "run": processes.cmd_run,
    "dashboard": processes.cmd_dashboard,
    "status": reading.cmd_status,
    "apps": reading.cmd_apps,
    "inspect": reading.cmd_inspect,
    "result": reading.cmd_result,
    "submit": tasks.cmd_submit,
    "revoke": tasks.cmd_revoke,
    "dead": tasks.cmd_dead,
    "cancel": app_state.cmd_cancel,
    "resume": app_state.cmd_resume,
    "rerun": app_state.cmd_rerun,
    "purge": app_state.cmd_purge,
}


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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="framework",
        description="Distributed master/worker jobs on Apache ZooKeeper.",
        epilog=_environment_help(),
    )
    parser.add_argument("--version", action="version", version=f"framework {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    def command(name: str, help: str) -> argparse.ArgumentParser:
        cmd = sub.add_parser(name, help=help, description=help[0].upper() + help[1:] + ".",
                             epilog=_environment_help())
        return cmd

    zk = sub.add_parser("zk", help="run a local ZooKeeper in the foreground until Ctrl-C")
    zk.add_argument("--port", type=int, default=2181, help="client port (standalone only)")
    zk.add_argument("--size", type=int, default=1, help="members (1 = standalone, 3 = ensemble)")
    zk.add_argument("--data-dir", default=None, help="keep data here (default: a temp dir)")
    zk.add_argument("--tick-ms", type=int, default=200, help="ZooKeeper tickTime in ms")

    run = command("run", "run a Master or Worker subclass in this process")
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
    run.add_argument("-Q", "--queues", default=None, metavar="Q1,Q2",
                     help="the queues a worker takes tasks from, comma-separated; replaces "
                          "the class's queues, so list 'default' too to keep serving it "
                          "(default: the class's queues, else 'default')")

    apps = command("apps", "list the applications with their leader, worker "
                           "count, queue depth and state (active, done, cancelled)")
    add_connection_arguments(apps)
    apps.add_argument("--json", action="store_true", help="machine-readable output")
    add_deadline_argument(apps)

    status = command("status",
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

    result = command("result", "print a task's result record as JSON "
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

    dead = command("dead", "list, requeue or delete an application's dead letters")
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

    purge = command("purge", "delete an application's whole subtree "
                             "(refused while masters or workers are alive)")
    purge.add_argument("app", metavar="APP")
    purge.add_argument("--force", action="store_true",
                       help="with live masters or workers: cancel the app, wait until they "
                            "drained and left, then delete it")
    purge.add_argument("--grace", type=positive_seconds, default=30.0, metavar="S",
                       help="with --force: wait at most S seconds for them to leave "
                            "(default 30; past it nothing is deleted)")
    purge.add_argument("--queue", default=None, metavar="Q",
                       help="delete only the tasks waiting in queue Q ('default' or a named "
                            "queue), not the app (refused while a live worker serves Q)")
    add_connection_arguments(purge)
    add_deadline_argument(purge)

    for name, text in (
        ("cancel", "cancel an application: its masters and workers drain and stop"),
        ("resume", "undo a cancel: delete the app's cancel node (then start its processes)"),
        ("rerun", "run a finished job again: a new generation (the old one's done record is "
                  "kept in history/; its results, failures and dead letters are cleared)"),
    ):
        one = command(name, text)
        one.add_argument("app", metavar="APP")
        add_connection_arguments(one)
        add_deadline_argument(one)

    revoke = command("revoke",
                     "revoke one task: never run if queued, cancelled if running")
    revoke.add_argument("app", metavar="APP")
    revoke.add_argument("task_id", metavar="TASK_ID")
    add_connection_arguments(revoke)
    add_deadline_argument(revoke)

    submit = command("submit", "queue one task for an application's workers "
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
    submit.add_argument("--queue", default=None, metavar="Q",
                        help="the queue to put it in (default: the task type's queue, else "
                             "'default'); only workers serving Q take it")
    add_connection_arguments(submit)
    add_deadline_argument(submit)

    inspect = command("inspect",
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

    dash = command("dashboard",
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
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """``framework`` / ``python -m framework``: run the verb ``argv`` names."""
    return dispatch("framework", build_parser(), VERBS, argv)
