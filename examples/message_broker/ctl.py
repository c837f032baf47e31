"""``python -m examples.message_broker.ctl``: create/list/describe topics, publish and read
messages (``produce``, ``consume``), central control (``migration_prohibited``, ``shutdown``),
``status`` (``--json``) and the operator's unclean takeover (``force-leader``).

Every user mistake ends in one line on stderr and exit status 2 (never a traceback).

* ``produce TOPIC [MESSAGE | -]``: one message, or one per line of stdin (``-`` or no
  message); returns once all are acknowledged, in order.
* ``consume TOPIC [--from OFFSET] [--follow] [--name SUBSCRIBER [--no-wait]]``: print each
  message on its own line (``--offsets``: ``OFFSET<TAB>MESSAGE``); without ``--follow`` it
  stops at the high watermark it found when it started.  Without ``--name`` it reads from
  ``--from`` (default 0) and commits nothing; with ``--name`` it is that durable, exclusive
  subscriber (from its committed position unless ``--from``; it waits for a live instance of
  the name to go, or with ``--no-wait`` refuses at once).
* ``list``: one row per topic (mode, primary, replicas, in-sync set, subscribers); ``--json``.
* ``force-leader TOPIC SERVER --may-lose N``: let ``SERVER``, outside the in-sync set, take
  over a topic that has no primary and whose in-sync replicas are all gone.  It says how many
  acknowledged messages are lost at least (the high watermark last recorded in ZooKeeper
  minus the records ``SERVER`` holds) and refuses if that exceeds ``N``; anything
  acknowledged after that record was written is lost too and cannot be counted.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import attrs
import trio

from examples.message_broker.client import Exclusive, Producer, Subscriber
from examples.message_broker.layout import (
    BrokerPaths,
    Isr,
    Mode,
    NodeRecord,
    Position,
    PrimaryRecord,
    ShutdownRequest,
    TopicSettings,
    check_topic,
    decode,
    decode_replicas,
    discovery,
    find_server,
)
from framework import errors, records
from framework.cli import (
    ONE_SHOT_DEADLINE,
    add_connection_arguments,
    add_deadline_argument,
    one_shot,
    preflight,
    run_command,
    split_chroot,
    zk_hosts_from,
)
from framework.logs import configure_logging
from framework.runtime import MasterIdentity
from framework.zk import Session

T = TypeVar("T")


@attrs.frozen
class PrimaryView:
    """A topic's serving primary, with its epoch (the czxid of its ``primary`` znode) and
    where it is registered (``""``: not registered)."""

    server: str
    address: str
    epoch: int


@attrs.frozen
class PlacementView:
    """The servers a topic is placed on (the controller's intent)."""

    replicas: tuple[str, ...]


@attrs.frozen
class IsrView:
    """A topic's in-sync set and its term."""

    in_sync: tuple[str, ...]
    term: int


@attrs.frozen
class TopicInfo:
    """``ctl describe``: one topic (``None``: that node does not exist)."""

    topic: str
    mode: Mode
    placement: PlacementView | None = None
    isr: IsrView | None = None
    primary: PrimaryView | None = None
    #: subscriber -> committed offset
    subscribers: dict[str, int] = attrs.field(factory=dict)


@attrs.frozen
class BrokerStatus:
    """``ctl status``: servers, topics, control znodes, the active controller."""

    servers: dict[str, NodeRecord]
    topics: dict[str, TopicInfo]
    controller: str | None
    migration_prohibited: bool
    shutdown: bool
    #: server -> ``host:port`` of its discovery instance (the servers registered now)
    addresses: dict[str, str] = attrs.field(factory=dict)


async def create_topics(session: Session, names: Sequence[str], *,
                        mode: Mode | str = Mode.REFUSE,
                        paths: BrokerPaths | None = None) -> list[str]:
    """Create topics (the controller places them); returns the ones that were new.
    :class:`~framework.errors.ConfigurationError` for a bad mode or name, before anything
    is created."""
    paths = paths or BrokerPaths()
    mode = TopicSettings(mode).mode
    for name in names:
        check_topic(name)
    await session.ensure_path(paths.topics)
    created: list[str] = []

    async def one(name: str) -> None:
        try:
            settings = TopicSettings(mode, uuid.uuid4().hex[:16])
            await session.create(paths.topic(name), records.encode(settings))
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
    doc = records.encode(ShutdownRequest(tuple(servers)))
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


async def topic_info(session: Session, name: str, paths: BrokerPaths) -> TopicInfo:
    """Settings, placement, in-sync set, primary and subscribers of one topic;
    :class:`~framework.errors.ConfigurationError` for an unknown topic,
    :class:`~framework.records.CorruptRecord` for a node that holds no record."""
    try:
        data, _ = await session.get(paths.topic(name))
    except errors.NoNodeError:
        raise errors.ConfigurationError(f"unknown topic {name!r}") from None

    async def read(path: str) -> tuple[bytes, Any]:
        """The node's data and stat; ``(b"", None)`` for a node that does not exist."""
        try:
            return await session.get(path)  # type: ignore[no-any-return]
        except errors.NoNodeError:
            return b"", None

    (placement, placed), (isr, isr_stat), (primary, primary_stat) = [
        await read(path) for path in (paths.placement(name), paths.isr(name),
                                      paths.primary(name))]
    subscribers: dict[str, int] = {}
    try:
        for sub in await session.children(paths.subscribers(name)):
            position, stat = await read(paths.subscriber(name, sub))
            if stat is not None:
                subscribers[sub] = decode(position, Position).offset
    except errors.NoNodeError:
        pass
    in_sync = decode(isr, Isr)
    serving = decode(primary, PrimaryRecord)
    address = ""
    if primary_stat is not None:
        address = await find_server(session, paths, serving.server) or ""
    return TopicInfo(
        name, decode(data, TopicSettings).mode,
        placement=None if placed is None else PlacementView(decode_replicas(placement)),
        isr=None if isr_stat is None else IsrView(in_sync.in_sync, in_sync.term),
        primary=None if primary_stat is None else PrimaryView(
            serving.server, address, primary_stat.czxid),
        subscribers=subscribers)


async def gather_status(session: Session, paths: BrokerPaths | None = None) -> BrokerStatus:
    """Servers (load, primaries, backups, backup lag), topics, control znodes, controller."""
    paths = paths or BrokerPaths()
    servers: dict[str, NodeRecord] = {}
    try:
        for name in await session.children(paths.nodes):
            try:
                servers[name] = decode((await session.get(f"{paths.nodes}/{name}"))[0],
                                       NodeRecord)
            except errors.NoNodeError:
                continue
    except errors.NoNodeError:
        pass
    controller = None
    try:
        raw, _ = await session.get(paths.app.rendezvous)
        controller = decode(raw, MasterIdentity).name or None
    except errors.NoNodeError:
        pass
    try:
        names = await session.children(paths.topics)
    except errors.NoNodeError:
        names = []
    topics: dict[str, TopicInfo] = {}
    for name in sorted(names):
        try:
            topics[name] = await topic_info(session, name, paths)
        except errors.ConfigurationError:
            continue
    addresses = {i.id: i.endpoint for i in await discovery(session).instances(paths.service)}
    return BrokerStatus(
        servers, topics, controller,
        migration_prohibited=await session.exists(paths.migration_prohibited) is not None,
        shutdown=await session.exists(paths.shutdown) is not None, addresses=addresses)


def render(status: BrokerStatus) -> str:
    """``ctl status``: servers, then topics, one line each."""
    lines = [f"controller: {status.controller or '-'}   migration_prohibited: "
             f"{status.migration_prohibited}   shutdown: {status.shutdown}", "servers:"]
    for name, node in sorted(status.servers.items()):
        lags = [v for v in node.lag.values() if v is not None]
        lines.append(f"  {name:<12} {status.addresses.get(name) or '-':<22} {node.state.value:<9}"
                     f" primaries={len(node.primaries)}"
                     f" backups={len(node.backups)}"
                     f" max_backup_lag={max(lags) if lags else '-'}"
                     + (f" stranded={','.join(sorted(node.stranded))}"
                        if node.stranded else ""))
    lines.append(f"topics: {len(status.topics)}")
    for name, info in status.topics.items():
        row = _topic_row(info)
        lines.append(f"  {name:<14} mode={row.mode:<8} primary={row.primary:<10} "
                     f"replicas={row.replicas:<22} in_sync={row.in_sync:<22} "
                     f"{row.subscribers}".rstrip())
    return "\n".join(lines)


@attrs.frozen
class _Row:
    """A topic as the tables show it."""

    mode: str
    primary: str
    epoch: str
    replicas: str
    in_sync: str
    subscribers: str


def _topic_row(info: TopicInfo) -> _Row:
    return _Row(info.mode.value,
                "NONE" if info.primary is None else info.primary.server,
                "-" if info.primary is None else str(info.primary.epoch),
                "" if info.placement is None else ",".join(info.placement.replicas),
                "" if info.isr is None else ",".join(info.isr.in_sync),
                " ".join(f"{k}@{v}" for k, v in sorted(info.subscribers.items())))


def render_topics(status: BrokerStatus) -> str:
    """``ctl list``: one row per topic."""
    if not status.topics:
        return "no topics (create some with `ctl create`)"
    rows = [("TOPIC", "MODE", "PRIMARY", "EPOCH", "REPLICAS", "IN-SYNC", "SUBSCRIBERS")]
    for name, info in status.topics.items():
        row = _topic_row(info)
        rows.append((name, row.mode, row.primary, row.epoch, row.replicas or "-",
                     row.in_sync or "-", row.subscribers or "-"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(row[i].ljust(widths[i]) for i in range(len(row))).rstrip()
             for row in rows]
    return "\n".join(lines)


async def produce(session: Session, topic: str, payloads: list[bytes],
                  paths: BrokerPaths | None = None) -> int:
    """Publish ``payloads`` to ``topic`` in order; returns once all are acknowledged."""
    check_topic(topic)
    async with Producer(session, producer_id="ctl", paths=paths) as producer:
        await producer.send_many(topic, payloads)
    return len(payloads)


async def consume(session: Session, topic: str, out: Any, *, start: int | None = None,
                  follow: bool = False, name: str | None = None, wait: bool = True,
                  offsets: bool = False, commit_interval: float = 1.0,
                  paths: BrokerPaths | None = None) -> int:
    """Write ``topic``'s messages to ``out``, one line each (module doc); returns how many."""
    check_topic(topic)
    if start is not None and start < 0:
        raise errors.ConfigurationError(f"--from must be an offset >= 0, got {start}")
    try:
        return await _consume(session, topic, out, start=start, follow=follow, name=name,
                              wait=wait, offsets=offsets, commit_interval=commit_interval,
                              paths=paths)
    except (errors.OwnershipLost, errors.SessionInterrupted) as exc:
        raise errors.FrameworkError(
            f"subscriber {name!r} is no longer the live instance ({exc}): after a pause or a "
            "partition another instance may hold the name; nothing more was printed or "
            "committed") from None


async def _consume(session: Session, topic: str, out: Any, *, start: int | None,
                   follow: bool, name: str | None, wait: bool, offsets: bool,
                   commit_interval: float, paths: BrokerPaths | None) -> int:
    count = 0
    async with Subscriber(session, name, [topic], paths=paths,
                          exclusive=Exclusive.WAIT if wait else Exclusive.REFUSE,
                          commit_interval=commit_interval,
                          start={topic: start} if start is not None else None) as sub:
        stop = math.inf
        if not follow:
            stop = await sub.head(topic)
            if sub.committed[topic] >= stop:
                return 0
        async for message in sub:
            text = message.payload.decode("utf-8", errors="backslashreplace")
            out.write(f"{message.offset}\t{text}\n" if offsets else f"{text}\n")
            out.flush()
            sub.ack(message)
            count += 1
            if message.offset + 1 >= stop:
                break
    return count


async def force_leader(session: Session, topic: str, server: str, may_lose: int,
                       paths: BrokerPaths | None = None) -> str:
    """Let ``server`` take ``topic`` over although it is outside the in-sync set (module
    doc); a conditional write of ``isr``, so it fails if anything changed meanwhile."""
    from framework.zk import validate_name

    paths = paths or BrokerPaths()
    check_topic(topic)
    validate_name("server name", server)
    if may_lose < 0:
        raise errors.ConfigurationError("--may-lose must be >= 0")
    info = await topic_info(session, topic, paths)
    if info.primary is not None:
        raise errors.ConfigurationError(
            f"topic {topic} has a primary ({info.primary.server}): nothing to force")
    try:
        raw, stat = await session.get(paths.isr(topic))
    except errors.NoNodeError:
        raise errors.ConfigurationError(f"topic {topic} was never placed") from None
    isr = decode(raw, Isr)
    live = await session.children(paths.nodes)
    alive = [s for s in isr.in_sync if s in live]
    if alive:
        raise errors.ConfigurationError(
            f"in-sync replica(s) {', '.join(alive)} of {topic} are live: they take over "
            "by themselves, without loss")
    try:
        record = decode((await session.get(f"{paths.nodes}/{server}"))[0], NodeRecord)
    except errors.NoNodeError:
        raise errors.ConfigurationError(f"server {server} is not live") from None
    held = record.stranded.get(topic)
    if held is None:
        raise errors.ConfigurationError(
            f"server {server} holds no copy of {topic} waiting for a primary (is it placed "
            "there? `ctl describe` shows the replicas)")
    lost = max(0, isr.hw - held)
    if lost > may_lose:
        raise errors.ConfigurationError(
            f"{server} holds {held} records of {topic}; the last recorded high watermark is "
            f"{isr.hw}: at least {lost} acknowledged messages would be lost (> --may-lose "
            f"{may_lose})")
    forced = Isr((server,), None, isr.term + 1, {}, hw=isr.hw, forced=server)
    try:
        await session.set(paths.isr(topic), records.encode(forced), version=stat.version)
    except errors.BadVersionError:
        raise errors.ConfigurationError(
            f"the in-sync set of {topic} changed meanwhile: look again") from None
    return (f"{server} takes over {topic} with {held} records: at least {lost} acknowledged "
            f"messages lost (last recorded high watermark {isr.hw}), and any acknowledged "
            "after that record was written")


# ---------------------------------------------------------------- command line


@attrs.frozen
class Verb:
    """One command of ``broker ctl``: its ``name`` and ``help`` line (``--help`` lists the
    verbs in the order of :data:`VERBS`), ``arguments`` adds its own arguments to its
    sub-parser (the connection options are every verb's), and ``run`` carries it out and
    returns the exit status.  A user mistake is raised as a
    :class:`~framework.errors.FrameworkError` (one line on stderr, status 2)."""

    name: str
    help: str
    run: Callable[[argparse.Namespace], int]
    arguments: Callable[[argparse.ArgumentParser], None] | None = None


def _ask(args: argparse.Namespace, work: Callable[[Session, BrokerPaths], Awaitable[T]]) -> T:
    """``await work(session, paths)`` in a one-shot session, within ``--timeout``."""
    hosts = zk_hosts_from(args.zk)
    paths = BrokerPaths()
    return one_shot(hosts, lambda session: work(session, paths), chroot=args.chroot,
                    deadline=args.timeout)


def _tell(args: argparse.Namespace,
          work: Callable[[Session, BrokerPaths], Awaitable[str]]) -> int:
    """Run ``work`` (:func:`_ask`) and print the line it returns."""
    print(_ask(args, work))
    return 0


def _print_json(value: object) -> int:
    print(json.dumps(records.unstructure(value), indent=2))
    return 0


def _cmd_create(args: argparse.Namespace) -> int:
    created = _ask(args, lambda session, paths: create_topics(
        session, args.topics, mode=args.mode, paths=paths))
    print(f"created {len(created)} topic(s): {' '.join(created)}" if created
          else "no new topic (all exist)")
    return 0


def _cmd_list(args: argparse.Namespace) -> int:
    status = _ask(args, gather_status)
    if args.json:
        print(json.dumps([records.unstructure(t) for t in status.topics.values()], indent=2))
    else:
        print(render_topics(status))
    return 0


def _cmd_describe(args: argparse.Namespace) -> int:
    return _print_json(_ask(args, lambda session, paths: topic_info(
        session, check_topic(args.topic), paths)))


def _cmd_status(args: argparse.Namespace) -> int:
    status = _ask(args, gather_status)
    if args.json:
        return _print_json(status)
    print(render(status))
    return 0


def _cmd_prohibit_migration(args: argparse.Namespace) -> int:
    async def work(session: Session, paths: BrokerPaths) -> str:
        await session.ensure_path(paths.base)
        try:
            await session.create(paths.migration_prohibited)
        except errors.NodeExistsError:
            pass
        return "migration prohibited"

    return _tell(args, work)


def _cmd_allow_migration(args: argparse.Namespace) -> int:
    async def work(session: Session, paths: BrokerPaths) -> str:
        await session.delete(paths.migration_prohibited, missing_ok=True)
        return "migration allowed"

    return _tell(args, work)


def _cmd_shutdown(args: argparse.Namespace) -> int:
    async def work(session: Session, paths: BrokerPaths) -> str:
        await request_shutdown(session, args.servers, paths)
        return f"shutdown requested for {', '.join(args.servers) or 'every server'}"

    return _tell(args, work)


def _cmd_clear_shutdown(args: argparse.Namespace) -> int:
    async def work(session: Session, paths: BrokerPaths) -> str:
        await session.delete(paths.shutdown, missing_ok=True)
        return "shutdown cleared"

    return _tell(args, work)


def _cmd_force_leader(args: argparse.Namespace) -> int:
    return _tell(args, lambda session, paths: force_leader(
        session, args.topic, args.server, args.may_lose, paths))


def _read_messages(args: argparse.Namespace) -> list[bytes]:
    if args.message is not None and args.message != "-":
        return [os.fsencode(args.message)]
    return sys.stdin.buffer.read().splitlines()


def _cmd_produce(args: argparse.Namespace) -> int:
    hosts = zk_hosts_from(args.zk)
    payloads = _read_messages(args)
    count = _run_data(args, hosts, args.timeout, "acknowledged",
                      lambda session: produce(session, args.topic, payloads, BrokerPaths()))
    if count is not None:
        print(f"produced {count} message(s) to {args.topic}", file=sys.stderr)
    return 0


def _cmd_consume(args: argparse.Namespace) -> int:
    hosts = zk_hosts_from(args.zk)
    _run_data(args, hosts, None if args.follow else args.timeout, "read to its end",
              lambda session: consume(
                  session, args.topic, sys.stdout, start=args.start, follow=args.follow,
                  name=args.name, wait=not args.no_wait, offsets=args.offsets,
                  commit_interval=args.commit_interval, paths=BrokerPaths()))
    return 0


def _broken_pipe(exc: BaseException) -> bool:
    if isinstance(exc, BrokenPipeError):
        return True
    if isinstance(exc, BaseExceptionGroup):
        return any(_broken_pipe(e) for e in exc.exceptions)
    return False


def _run_data(args: argparse.Namespace, hosts: str, limit: float | None, what: str,
              work: Callable[[Session], Awaitable[int]]) -> int | None:
    """``produce`` and ``consume``: ``await work(session)`` within ``limit`` seconds
    (``None``: no limit, a ``consume --follow`` runs until interrupted), past it a
    :class:`~framework.errors.FrameworkError` saying the topic was not ``what``; returns
    its count, or ``None`` when the reader of our stdout went away (``consume | head``)."""

    async def bounded(session: Session) -> int:
        with trio.move_on_after(math.inf if limit is None else limit):
            return await work(session)
        raise errors.FrameworkError(
            f"topic {args.topic} not {what} within {limit:g}s (no primary? see `ctl describe "
            f"{args.topic}`; --timeout sets the limit)")

    try:
        return _run_session(hosts, args, bounded)
    except BaseException as exc:  # `consume ... | head`: the reader went away, that is all
        if not _broken_pipe(exc):
            raise
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return None


def _run_session(hosts: str, args: argparse.Namespace,
                 work: Callable[[Session], Awaitable[int]]) -> int:
    """``one_shot`` with the command's session timeout (a durable subscriber's name is free
    for another instance once a dead one's session expired)."""
    hosts, chroot = split_chroot(hosts, args.chroot)

    async def run() -> int:
        await preflight(hosts)
        async with Session(hosts, chroot=chroot,
                           session_timeout=args.session_timeout) as session:
            return int(await work(session))

    return trio.run(run)


def _create_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("topics", nargs="+")
    parser.add_argument("--mode", choices=[m.value for m in Mode], default=Mode.REFUSE.value,
                        help="without an in-sync backup: refuse writes or ack one copy")


def _json_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true")


def _session_timeout_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--session-timeout", type=float, default=10.0,
                        help="ZooKeeper session timeout in seconds (default 10)")


def _produce_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("topic")
    parser.add_argument("message", nargs="?", help="the message; - or none: stdin")
    _session_timeout_argument(parser)


def _consume_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("topic")
    parser.add_argument("--from", dest="start", type=int, default=None, metavar="OFFSET",
                        help="first offset (default: 0, or the subscriber's position)")
    parser.add_argument("--follow", action="store_true",
                        help="keep reading new messages (until interrupted)")
    parser.add_argument("--name", default=None,
                        help="read as this durable, exclusive subscriber")
    parser.add_argument("--no-wait", action="store_true",
                        help="with --name: refuse if the subscriber is live elsewhere")
    parser.add_argument("--offsets", action="store_true", help="print OFFSET<TAB>MESSAGE")
    parser.add_argument("--commit-interval", type=float, default=1.0, help=argparse.SUPPRESS)
    _session_timeout_argument(parser)


def _force_leader_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("topic")
    parser.add_argument("server")
    parser.add_argument("--may-lose", type=int, required=True, metavar="N",
                        help="refuse if more than N acknowledged messages are known lost")


def _topic_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("topic")


def _shutdown_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("servers", nargs="*", help="only these servers (default: all)")


#: The verbs of ``broker ctl``, in the order ``--help`` lists them.
VERBS: tuple[Verb, ...] = (
    Verb("create", "create topics (the controller places them)", _cmd_create,
         _create_arguments),
    Verb("list", "topics: mode, primary, replicas, in-sync set, subscribers", _cmd_list,
         _json_argument),
    Verb("produce", "publish MESSAGE, or one message per line of stdin", _cmd_produce,
         _produce_arguments),
    Verb("consume", "print a topic's messages, one per line", _cmd_consume,
         _consume_arguments),
    Verb("force-leader", "unclean takeover by a replica outside the in-sync set",
         _cmd_force_leader, _force_leader_arguments),
    Verb("describe", "one topic's placement, in-sync set, primary", _cmd_describe,
         _topic_argument),
    Verb("prohibit-migration", "create migration_prohibited", _cmd_prohibit_migration),
    Verb("allow-migration", "delete migration_prohibited", _cmd_allow_migration),
    Verb("shutdown", "servers hand primaries over, drain and exit", _cmd_shutdown,
         _shutdown_arguments),
    Verb("clear-shutdown", "delete the shutdown znode", _cmd_clear_shutdown),
    Verb("status", "servers, topics, lag, subscribers", _cmd_status, _json_argument),
)

_BY_NAME = {verb.name: verb for verb in VERBS}


def _cmd(args: argparse.Namespace) -> int:
    """Run the verb ``args.command`` names."""
    return _BY_NAME[args.command].run(args)


def build_parser() -> argparse.ArgumentParser:
    # The connection options are accepted before or after the command ("broker status --zk
    # H" and "broker --zk H status"): SUPPRESS keeps the subcommand from resetting what was
    # given before it, and parse() fills in the defaults of those not given at all.
    common = argparse.ArgumentParser(add_help=False)
    add_connection_arguments(common, connect_timeout=False, shared=True)
    add_deadline_argument(common, shared=True)
    parser = argparse.ArgumentParser(prog="broker ctl", parents=[common],
                                     description="Control the YMB-style message broker.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for verb in VERBS:
        verb_parser = sub.add_parser(verb.name, parents=[common], help=verb.help)
        if verb.arguments is not None:
            verb.arguments(verb_parser)
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
