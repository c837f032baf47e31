"""The verbs that run in the foreground until stopped: ``zk``, ``run``, ``dashboard``."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from typing import Any

from framework.cli.common import schedules_class, schedules_of, syntax_error
from framework.cli.connection import split_chroot, zk_hosts_from
from framework.errors import FrameworkError


def cmd_zk(args: argparse.Namespace) -> int:
    """``framework zk``: a local ZooKeeper (standalone or an ensemble) until Ctrl-C or SIGTERM."""
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


def cmd_run(args: argparse.Namespace) -> int:
    """``framework run MODULE:CLASS``: run a Master or Worker in this process until it is
    done or stopped; exit status 1 for a finished job with dead letters when the class asks."""
    import trio

    from framework.runtime import Master, run_component
    from framework.runtime.launch import load_class

    hosts, chroot = split_chroot(zk_hosts_from(args.zk), args.chroot)
    try:
        cls = load_class(args.component)
    except SyntaxError as exc:  # the user's module does not compile: where, in one line
        raise FrameworkError(syntax_error(args.component, exc)) from None
    component = cls(args.app, name=args.name, address=args.address or "")
    if args.listen is not None:
        _set_listen(component, args.component, args.listen)
    if args.concurrency is not None:
        if isinstance(component, Master):
            raise FrameworkError(f"--concurrency is for workers; {args.component} is a Master")
        component.concurrency = args.concurrency  # this process's slots, not the class's
    if args.queues is not None:
        if isinstance(component, Master):
            raise FrameworkError(f"-Q/--queues is for workers; {args.component} is a Master")
        from framework.runtime.queues import queue_list

        component.queues = queue_list(args.queues)  # this process's queues, not the class's
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


def cmd_dashboard(args: argparse.Namespace) -> int:
    """``framework dashboard``: serve the live web dashboard until Ctrl-C."""
    import trio

    from framework.dashboard import serve_dashboard
    from framework.logs import configure_logging

    configure_logging(level=os.environ.get("FRAMEWORK_LOG_LEVEL") or "info")
    hosts, chroot = split_chroot(zk_hosts_from(args.zk), args.chroot)
    schedules: dict[str, list[Any]] = {}
    for component in args.schedules:
        cls = schedules_class(component)
        app = getattr(cls, "app_name", None)
        if not app:
            raise FrameworkError(f"--schedules {component}: the class names no app_name")
        schedules.setdefault(app, []).extend(schedules_of(component))
    trio.run(lambda: serve_dashboard(hosts, host=args.host, port=args.port,
                                     allow_actions=args.allow_actions, chroot=chroot,
                                     connect_timeout=args.connect_timeout,
                                     schedules=schedules))
    return 0
