"""``python -m examples.message_broker.ctl``: create/list/describe topics, central control
(``migration_prohibited``, ``shutdown``) and ``status`` (``--json``).

Every user mistake ends in one line on stderr and exit status 2 (never a traceback).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

import trio

from examples.message_broker.layout import (
    BrokerPaths,
    Isr,
    TopicSettings,
    check_topic,
    dumps,
    loads,
)
from framework import errors
from framework.cli import (
    ONE_SHOT_DEADLINE,
    add_deadline_argument,
    one_shot,
    run_command,
    zk_hosts_from,
)
from framework.logs import configure_logging
from framework.zk import Session


async def create_topics(session: Session, names: Sequence[str], *, mode: str = "refuse",
                        paths: BrokerPaths | None = None) -> list[str]:
    """Create topics (the controller places them); returns the ones that were new."""
    paths = paths or BrokerPaths()
    settings = TopicSettings(mode)
    for name in names:
        check_topic(name)
    await session.ensure_path(paths.topics)
    created: list[str] = []

    async def one(name: str) -> None:
        try:
            await session.create(paths.topic(name), settings.encode())
            created.append(name)
        except errors.NodeExistsError:
            pass

    async with trio.open_nursery() as nursery:
        for name in names:
            nursery.start_soon(one, name)
    return sorted(created)


async def request_shutdown(session: Session, servers: Sequence[str] = (),
                           paths: BrokerPaths | None = None) -> None:
    """Create (or set) the ``shutdown`` znode: the named servers (default: all) hand their
    primaries to their in-sync backups, drain and exit."""
    paths = paths or BrokerPaths()
    await session.ensure_path(paths.base)
    doc = dumps({"servers": list(servers)} if servers else {})
    try:
        await session.create(paths.shutdown, doc)
    except errors.NodeExistsError:
        await session.set(paths.shutdown, doc)


async def wait_placed(session: Session, names: Sequence[str],
                      paths: BrokerPaths | None = None) -> None:
    """Return once every topic in ``names`` has a serving primary (watches, no polling)."""
    from framework.zk import wait_exists

    paths = paths or BrokerPaths()
    async with trio.open_nursery() as nursery:
        for name in names:
            nursery.start_soon(wait_exists, session, paths.primary(name))


async def topic_info(session: Session, name: str, paths: BrokerPaths) -> dict[str, Any]:
    """Settings, placement, in-sync set, primary and subscribers of one topic."""
    try:
        data, _ = await session.get(paths.topic(name))
    except errors.NoNodeError:
        raise errors.ConfigurationError(f"unknown topic {name!r}") from None
    info: dict[str, Any] = {"topic": name, "mode": TopicSettings.decode(data).mode}
    for key, path in (("placement", paths.placement(name)), ("isr", paths.isr(name)),
                      ("primary", paths.primary(name))):
        try:
            raw, stat = await session.get(path)
            doc = loads(raw)
            if key == "primary":
                doc["epoch"] = stat.czxid
            if key == "isr":
                doc = {"in_sync": list(Isr.decode(raw).in_sync), "term": Isr.decode(raw).term}
            info[key] = doc
        except errors.NoNodeError:
            info[key] = None
    subs: dict[str, int] = {}
    try:
        for sub in await session.children(paths.subscribers(name)):
            raw, _ = await session.get(paths.subscriber(name, sub))
            subs[sub] = int(loads(raw).get("offset", 0))
    except errors.NoNodeError:
        pass
    info["subscribers"] = subs
    return info


async def gather_status(session: Session, paths: BrokerPaths | None = None) -> dict[str, Any]:
    """Servers (load, primaries, backups, backup lag), topics, control znodes, controller."""
    paths = paths or BrokerPaths()
    status: dict[str, Any] = {"servers": {}, "topics": {}, "controller": None}
    try:
        for name in await session.children(paths.nodes):
            try:
                status["servers"][name] = loads((await session.get(f"{paths.nodes}/{name}"))[0])
            except errors.NoNodeError:
                continue
    except errors.NoNodeError:
        pass
    status["migration_prohibited"] = await session.exists(paths.migration_prohibited) is not None
    status["shutdown"] = await session.exists(paths.shutdown) is not None
    try:
        raw, _ = await session.get(paths.app.rendezvous)
        status["controller"] = loads(raw).get("name")
    except errors.NoNodeError:
        pass
    try:
        names = await session.children(paths.topics)
    except errors.NoNodeError:
        names = []
    for name in sorted(names):
        try:
            status["topics"][name] = await topic_info(session, name, paths)
        except errors.ConfigurationError:
            continue
    return status


def render(status: dict[str, Any]) -> str:
    lines = [f"controller: {status['controller'] or '-'}   migration_prohibited: "
             f"{status['migration_prohibited']}   shutdown: {status['shutdown']}", "servers:"]
    for name, doc in sorted(status["servers"].items()):
        lags = [v for v in (doc.get("lag") or {}).values() if v is not None]
        lines.append(f"  {name:<12} {doc.get('address', '-'):<22} {doc.get('state', '?'):<9}"
                     f" primaries={len(doc.get('primaries', []))}"
                     f" backups={len(doc.get('backups', []))}"
                     f" max_backup_lag={max(lags) if lags else '-'}")
    lines.append(f"topics: {len(status['topics'])}")
    for name, info in status["topics"].items():
        primary = (info.get("primary") or {}).get("server", "NONE")
        replicas = ",".join((info.get("placement") or {}).get("replicas", []))
        in_sync = ",".join((info.get("isr") or {}).get("in_sync", []))
        subs = " ".join(f"{k}@{v}" for k, v in info["subscribers"].items())
        lines.append(f"  {name:<14} mode={info['mode']:<8} primary={primary:<10} "
                     f"replicas={replicas:<22} in_sync={in_sync:<22} {subs}")
    return "\n".join(lines)


# ---------------------------------------------------------------- command line


def _cmd(args: argparse.Namespace) -> int:
    hosts = zk_hosts_from(args.zk)
    paths = BrokerPaths()

    async def work(session: Session) -> Any:
        if args.command == "create":
            return await create_topics(session, args.topics, mode=args.mode, paths=paths)
        if args.command == "list":
            return sorted(await session.children(paths.topics)) \
                if await session.exists(paths.topics) else []
        if args.command == "describe":
            return await topic_info(session, check_topic(args.topic), paths)
        if args.command == "prohibit-migration":
            await session.ensure_path(paths.base)
            try:
                await session.create(paths.migration_prohibited)
            except errors.NodeExistsError:
                pass
            return "migration prohibited"
        if args.command == "allow-migration":
            await session.delete(paths.migration_prohibited, missing_ok=True)
            return "migration allowed"
        if args.command == "shutdown":
            await request_shutdown(session, args.servers, paths)
            return f"shutdown requested for {', '.join(args.servers) or 'every server'}"
        if args.command == "clear-shutdown":
            await session.delete(paths.shutdown, missing_ok=True)
            return "shutdown cleared"
        return await gather_status(session, paths)

    result = one_shot(hosts, work, chroot=args.chroot, deadline=args.timeout)
    if args.command == "status" and not args.json:
        print(render(result))
    elif args.command == "create":
        print(f"created {len(result)} topic(s): {' '.join(result)}" if result
              else "no new topic (all exist)")
    elif isinstance(result, str):
        print(result)
    else:
        print(json.dumps(result, indent=None if args.command == "list" else 2))
    return 0


def build_parser() -> argparse.ArgumentParser:
    # The connection options are accepted before or after the command ("broker status --zk
    # H" and "broker --zk H status"): SUPPRESS keeps the subcommand from resetting what was
    # given before it, and parse() fills in the defaults of those not given at all.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--zk", default=argparse.SUPPRESS,
                        help="ZooKeeper connect string (default: $FRAMEWORK_ZK_HOSTS)")
    common.add_argument("--chroot", default=argparse.SUPPRESS, help="ZooKeeper chroot")
    add_deadline_argument(common, shared=True)
    parser = argparse.ArgumentParser(prog="broker ctl", parents=[common],
                                     description="Control the YMB-style message broker.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def command(name: str, help: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, parents=[common], help=help)

    create = command("create", "create topics (the controller places them)")
    create.add_argument("topics", nargs="+")
    create.add_argument("--mode", choices=["refuse", "one_copy"], default="refuse",
                        help="without an in-sync backup: refuse writes or ack one copy")
    command("list", "list topics")
    describe = command("describe", "one topic's placement, in-sync set, primary")
    describe.add_argument("topic")
    command("prohibit-migration", "create migration_prohibited")
    command("allow-migration", "delete migration_prohibited")
    shutdown = command("shutdown", "servers hand primaries over, drain and exit")
    shutdown.add_argument("servers", nargs="*", help="only these servers (default: all)")
    command("clear-shutdown", "delete the shutdown znode")
    status = command("status", "servers, topics, lag, subscribers")
    status.add_argument("--json", action="store_true")
    return parser


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    args = build_parser().parse_args(argv)
    for name, default in (("zk", None), ("chroot", None), ("timeout", ONE_SHOT_DEADLINE)):
        if not hasattr(args, name):
            setattr(args, name, default)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    return run_command("broker ctl", _cmd, args)


def cli() -> int:
    """The ``broker`` program: ``broker ctl COMMAND`` and ``broker COMMAND`` are the same
    (so ``broker status`` and ``broker ctl status`` both work).  Logging at warning: a
    one-shot command's own session events are noise."""
    configure_logging(level=os.environ.get("FRAMEWORK_LOG_LEVEL") or "warning")
    argv = sys.argv[1:]
    return main(argv[1:] if argv[:1] == ["ctl"] else argv)


if __name__ == "__main__":
    sys.exit(cli())
