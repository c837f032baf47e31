"""``katta``: operate a Katta-like deployment (``python -m examples.katta_like.ctl``).

Commands: ``index`` (add an index, built as a job), ``search``, ``status [--json]``,
``alias`` (point an alias at an index: one atomic set), ``remove``.  Every user mistake, and
a record that cannot be read, ends in one line on stderr and exit status 2; a partial search
result in exit status 1; every command ends within its ``--timeout``.

The library functions work through the session they are given: on SUSPENDED their reads
wait for the connection (a request in flight fails with ``ConnectionLossError``); on LOST
a request in flight fails with ``SessionExpiredError`` and the ``wait_*`` functions go on
in the new session (their watches read again).  They raise :class:`FrameworkError` for a
user mistake and :class:`~framework.records.CorruptRecord` (naming the znode) for a record
they must read that is not one; :func:`gather_status` and the ``wait_*`` functions skip
such a record after a ``katta.bad_record`` event.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Collection, Sequence
from typing import Any, TypeVar

import attrs
import trio

from examples.katta_like.corpus import CorpusSource, CorpusSpec
from examples.katta_like.layout import (
    APP_NAME,
    MAX_INDEX_NAME,
    AliasRecord,
    IndexRecord,
    IndexState,
    KattaPaths,
    bad_record,
    decode_logged,
    discovery,
    read_record,
    serving_of,
    shard_name,
)
from framework import configure_logging, errors, records, store_location
from framework.cli import (
    add_connection_arguments,
    add_deadline_argument,
    dispatch,
    one_shot,
    positive_int,
    zk_hosts_from,
)
from framework.errors import FrameworkError
from framework.runtime import App, MasterIdentity, MemberState, MemberStatus, Plan
from framework.zk import Session, validate_name, watch_children, watch_data

R = TypeVar("R")

# ------------------------------------------------------------------ operations (library)


async def add_index(session: Session, record: IndexRecord, app: str = APP_NAME) -> None:
    """Create the index record (state ``building``); the master builds it and then places
    its shards.  :class:`FrameworkError` for a bad or taken name, a name longer than
    :data:`MAX_INDEX_NAME`, or a corpus that cannot be read now."""
    validate_name("index name", record.name)
    if len(record.name) > MAX_INDEX_NAME:
        raise FrameworkError(f"index name {record.name[:20]!r}... is longer than "
                             f"{MAX_INDEX_NAME} characters")
    record.corpus.check_available()
    paths = KattaPaths(App(app))
    await session.ensure_path(paths.indexes)
    try:
        await session.create(paths.index(record.name), records.encode(record))
    except errors.NodeExistsError:
        raise FrameworkError(f"index {record.name!r} already exists "
                             "(remove it first, or deploy a new version under another name "
                             "and switch an alias)") from None


async def read_index(session: Session, name: str, app: str = APP_NAME) -> IndexRecord:
    """The record of index ``name``: :class:`FrameworkError` if there is none,
    :class:`~framework.records.CorruptRecord` (naming the znode) if it is not a record."""
    path = KattaPaths(App(app)).index(name)
    try:
        data, _ = await session.get(path)
    except errors.NoNodeError:
        raise FrameworkError(f"no index named {name!r}") from None
    return read_record(data, IndexRecord, path)


async def set_alias(session: Session, alias: str, index: str, app: str = APP_NAME) -> None:
    """Point ``alias`` at ``index`` with one write (clients switch atomically per query);
    :class:`FrameworkError` if there is no such index."""
    validate_name("alias", alias)
    await read_index(session, index, app)
    path = KattaPaths(App(app)).alias(alias)
    data = records.encode(AliasRecord(index))
    try:
        await session.create(path, data, makepath=True)
    except errors.NodeExistsError:
        await session.set(path, data)


async def remove_index(session: Session, name: str, *, purge: bool = False,
                       app: str = APP_NAME) -> None:
    """Ask the master to undeploy and delete ``name`` (``purge``: its store files too):
    one version-checked set of its state.  :class:`FrameworkError` if there is no such
    index or an alias points at it."""
    paths = KattaPaths(App(app))
    for alias, target in (await _aliases(session, paths)).items():
        if target == name:
            raise FrameworkError(f"alias {alias!r} points at {name!r}: switch it first")
    while True:
        try:
            data, stat = await session.get(paths.index(name))
        except errors.NoNodeError:
            raise FrameworkError(f"no index named {name!r}") from None
        record = read_record(data, IndexRecord, paths.index(name)).evolve(
            state=IndexState.REMOVING, purge=purge)
        try:
            await session.set(paths.index(name), records.encode(record), version=stat.version)
            return
        except errors.BadVersionError:
            continue


async def wait_state(session: Session, name: str, states: Collection[IndexState],
                     app: str = APP_NAME) -> IndexRecord:
    """Wait (watch) until the index exists and is in one of ``states``; a record that is
    not one is a ``katta.bad_record`` event and waited past."""
    path = KattaPaths(App(app)).index(name)
    async for snap in watch_data(session, path):
        record = decode_logged(snap.data, IndexRecord, path) if snap.data else None
        if record is not None and record.state in states:
            return record
    raise AssertionError("unreachable")


async def wait_gone(session: Session, name: str, app: str = APP_NAME) -> None:
    """Wait (watch) until the index record is deleted (removed by the master)."""
    async for snap in watch_data(session, KattaPaths(App(app)).index(name)):
        if snap.stat is None:
            return


async def wait_replicated(session: Session, name: str, replicas: int,
                          app: str = APP_NAME, *, exclude: set[str] = frozenset()) -> None:
    """Wait (watches) until every shard of ``name`` has ``replicas`` serving records from
    nodes not in ``exclude``."""
    record = await read_index(session, name, app)
    paths = KattaPaths(App(app))
    done = [0]
    finished = trio.Event()

    async def shard(n: int) -> None:
        counted = False
        async for snap in watch_children(session, paths.deployed(name, n)):
            ok = len(set(snap.children) - exclude) >= replicas
            if ok != counted:
                counted = ok
                done[0] += 1 if ok else -1
                if done[0] == record.shards:
                    finished.set()

    async with trio.open_nursery() as nursery:
        for n in range(record.shards):
            nursery.start_soon(shard, n)
        await finished.wait()
        nursery.cancel_scope.cancel()


async def wait_balanced(session: Session, name: str, app: str = APP_NAME) -> dict[str, list[str]]:
    """Wait until the plan of ``name`` is settled: every shard on exactly R nodes, every
    planned replica serving and nothing else, node loads within one of each other.
    Read-and-watch of the plan and deployment records (no polling); returns the plan."""
    record = await read_index(session, name, app)
    the_app = App(app)
    paths = KattaPaths(the_app)
    while True:
        fired = trio.Event()
        waker = session.waker(fired)
        live = set(await session.children(the_app.workers, watch=waker))
        plan: dict[str, list[str]] = {}
        serving: dict[str, set[str]] = {}
        for n in range(record.shards):
            sname = shard_name(n)
            try:
                data, _ = await session.get(paths.plan(name, n), watch=waker)
                plan[sname] = list(_plan(data, paths.plan(name, n)).workers)
            except errors.NoNodeError:
                await session.exists(paths.plan(name, n), watch=waker)
                plan[sname] = []
            try:
                serving[sname] = set(await session.children(paths.deployed(name, n),
                                                            watch=waker))
            except errors.NoNodeError:
                await session.exists(paths.deployed(name, n), watch=waker)
                serving[sname] = set()
        load = {node: 0 for node in live}
        for nodes in plan.values():
            for node in nodes:
                load[node] = load.get(node, 0) + 1
        want = min(record.replication, len(live))
        if live and all(len(nodes) == want and set(nodes) == serving[s]
                        for s, nodes in plan.items()) and (
                max(load.values()) - min(load.values()) <= 1):
            return plan
        await fired.wait()


async def _children(session: Session, path: str) -> list[str]:
    try:
        return sorted(await session.children(path))
    except errors.NoNodeError:
        return []


def _plan(data: bytes, path: str) -> Plan:
    """The runtime's plan read from ``path``; an unreadable one is empty after a
    ``katta.bad_record`` event."""
    try:
        return Plan.decode(data)
    except records.CorruptRecord as exc:
        bad_record(path, exc)
        return Plan()


async def _read(session: Session, path: str, cls: type[R]) -> R | None:
    """The ``cls`` record at ``path``; ``None`` if there is none, or (after a
    ``katta.bad_record`` event) if it is not one."""
    try:
        data, _ = await session.get(path)
    except errors.NoNodeError:
        return None
    return decode_logged(data, cls, path)


async def _aliases(session: Session, paths: KattaPaths) -> dict[str, str]:
    """Alias -> index, of every alias with a readable record."""
    found = {}
    for alias in await _children(session, paths.aliases):
        record = await _read(session, paths.alias(alias), AliasRecord)
        if record is not None:
            found[alias] = record.index
    return found


@attrs.frozen
class NodeView:
    """A search node in ``katta status``; ``address``: its discovery instance's (``None``:
    not registered)."""

    address: str | None
    state: MemberState
    serving: int


@attrs.frozen
class ShardView:
    """One shard in ``katta status``: the nodes planned for it, the nodes serving it."""

    planned: tuple[str, ...]
    serving: tuple[str, ...]


@attrs.frozen
class IndexView:
    """An index in ``katta status``; ``errors`` lists ``<shard>~<node>`` refusals."""

    state: IndexState
    error: str
    shards: int
    replication: int
    errors: tuple[str, ...]
    placement: dict[str, ShardView]


@attrs.frozen
class ClusterStatus:
    """``katta status``: the leading master, the nodes, the indexes with their planned and
    serving replicas, the aliases, and the under-replicated shards (``<index>/<shard>``)."""

    app: str
    leader: str | None
    masters: int
    nodes: dict[str, NodeView]
    indexes: dict[str, IndexView]
    aliases: dict[str, str]
    under_replicated: tuple[str, ...]


async def gather_status(session: Session, app: str = APP_NAME) -> ClusterStatus:
    """Indexes, shards, replicas (planned and serving), nodes, under-replicated shards.
    Records that cannot be read are left out (after a ``katta.bad_record`` event)."""
    the_app = App(app)
    paths = KattaPaths(the_app)
    nodes: dict[str, NodeView] = {}
    registered = {i.id: i.endpoint for i in await discovery(session).instances(paths.service)}
    for name in await _children(session, the_app.workers):
        member = await _read(session, f"{the_app.workers}/{name}", MemberStatus)
        if member is not None:
            nodes[name] = NodeView(registered.get(name), member.state, serving_of(member))
    indexes: dict[str, IndexView] = {}
    under: list[str] = []
    for name in await _children(session, paths.indexes):
        record = await _read(session, paths.index(name), IndexRecord)
        if record is None:
            continue
        shards = {}
        refused: list[str] = []
        for n in range(record.shards):
            sname = shard_name(n)
            try:
                planned = _plan((await session.get(paths.plan(name, n)))[0],
                                paths.plan(name, n)).workers
            except errors.NoNodeError:
                planned = ()
            serving = tuple(await _children(session, paths.deployed(name, n)))
            shards[sname] = ShardView(planned, serving)
            refused += [f"{sname}~{node}" for node in
                        await _children(session, paths.refused(name, n))]
            if record.state in (IndexState.DEPLOYING, IndexState.DEPLOYED) and (
                    len(serving) < record.replication):
                under.append(f"{name}/{sname}")
        indexes[name] = IndexView(record.state, record.error, record.shards,
                                  record.replication, tuple(refused), shards)
    leader = None
    masters = await _children(session, the_app.masters)
    if masters:
        first = min(masters, key=lambda m: m.rsplit("-", 1)[-1])
        identity = await _read(session, f"{the_app.masters}/{first}", MasterIdentity)
        leader = identity.name if identity is not None else None
    return ClusterStatus(app, leader, len(masters), nodes, indexes,
                         await _aliases(session, paths), tuple(under))


def render_status(status: ClusterStatus) -> str:
    lines = [f"leader: {status.leader or '(none)'}   masters: {status.masters}",
             f"nodes ({len(status.nodes)}):"]
    for name, node in sorted(status.nodes.items()):
        lines.append(f"  {name:24} {node.address or '-':22} {node.state.value:9} "
                     f"serving {node.serving}")
    for name, index in sorted(status.indexes.items()):
        lines.append(f"index {name}: {index.state.value} {index.shards} shards x "
                     f"{index.replication} {index.error}".rstrip())
        for sname, shard in index.placement.items():
            lines.append(f"  shard {sname}: serving {','.join(shard.serving) or '-'}"
                         f"   planned {','.join(shard.planned) or '-'}")
        if index.errors:
            lines.append(f"  errors: {', '.join(index.errors)}")
    for alias, target in sorted(status.aliases.items()):
        lines.append(f"alias {alias} -> {target}")
    lines.append("under-replicated: " + (", ".join(status.under_replicated) or "none"))
    return "\n".join(lines)


# ------------------------------------------------------------------ CLI


def _session_args(parser: argparse.ArgumentParser) -> None:
    add_connection_arguments(parser, connect_timeout=False)
    parser.add_argument("--app", default=APP_NAME, help="application name (default katta)")
    add_deadline_argument(parser)


def _run(args: argparse.Namespace, work: Any) -> Any:
    return one_shot(zk_hosts_from(args.zk), work, chroot=args.chroot, deadline=args.timeout)


def _cmd_index(args: argparse.Namespace) -> int:
    if args.warc:
        corpus = CorpusSpec(CorpusSource.WARC, warc_dir=os.path.abspath(args.warc))
    else:
        corpus = CorpusSpec(CorpusSource.GENERATED, docs=args.docs, seed=args.seed)
    record = IndexRecord(validate_name("index name", args.name), args.shards, args.replication,
                         store_location(args.store), corpus)

    async def work(session: Session) -> IndexRecord | None:
        await add_index(session, record, args.app)
        if args.wait:
            return await wait_state(session, record.name,
                                    (IndexState.DEPLOYED, IndexState.ERROR), args.app)
        return None

    done = _run(args, work)
    if done is not None and done.state is IndexState.ERROR:
        raise FrameworkError(f"index {record.name!r} failed: {done.error}")
    print(f"index {record.name!r}: {done.state.value if done else 'submitted'}")
    return 0


def _cmd_search(args: argparse.Namespace) -> int:
    from examples.katta_like.client import SearchClient

    async def work(session: Session) -> Any:
        async with SearchClient.open(session, app=args.app,
                                     shard_timeout=args.shard_timeout) as client:
            return await client.search(args.query, index=args.index, top=args.top)

    result = _run(args, work)
    if args.json:
        print(json.dumps(result.to_json(), indent=2))
    else:
        for rank, hit in enumerate(result.hits, 1):
            print(f"{rank:3}. {hit.score:7.3f}  {hit.url}  {hit.title}")
        print(f"{result.count} hits in index {result.index}; shards answered "
              f"{len(result.answered)}/{len(result.answered) + len(result.missing)}")
    if result.partial:
        note = "" if result.state is IndexState.DEPLOYED else (
            f" (index {result.index} is {result.state.value})")
        print(f"PARTIAL RESULT: no live replica answered for shards "
              f"{', '.join(map(str, result.missing))}{note}", file=sys.stderr)
        return 1
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    status = _run(args, lambda s: gather_status(s, args.app))
    print(json.dumps(records.unstructure(status), indent=2) if args.json
          else render_status(status))
    return 0


def _cmd_alias(args: argparse.Namespace) -> int:
    _run(args, lambda s: set_alias(s, args.alias, args.index, args.app))
    print(f"alias {args.alias} -> {args.index}")
    return 0


def _cmd_remove(args: argparse.Namespace) -> int:
    async def work(session: Session) -> None:
        await remove_index(session, args.name, purge=args.purge, app=args.app)
        if args.wait:
            await wait_gone(session, args.name, args.app)

    _run(args, work)
    print(f"index {args.name!r}: {'removed' if args.wait else 'removing'}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="katta", description="Katta-like distributed search.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    index = sub.add_parser("index", help="add an index (built as a job, then deployed)")
    index.add_argument("name")
    index.add_argument("--shards", type=positive_int, default=8)
    index.add_argument("--replication", type=positive_int, default=2)
    index.add_argument("--store", default=os.environ.get("KATTA_STORE", "out/katta/store"),
                       help="the shard store: a path or file:// URL every node mounts, or "
                            "s3://bucket/prefix (default $KATTA_STORE or out/katta/store)")
    index.add_argument("--warc", help="index these WARC files (the crawler's out/warc)")
    index.add_argument("--docs", type=positive_int, default=2000, help="generated corpus size")
    index.add_argument("--seed", type=int, default=11)
    index.add_argument("--wait", action="store_true", help="wait until deployed")
    _session_args(index)
    index.set_defaults(func=_cmd_index)
    search = sub.add_parser("search", help="search an index or alias")
    search.add_argument("query")
    search.add_argument("--index", default="docs")
    search.add_argument("--top", type=positive_int, default=10)
    search.add_argument("--shard-timeout", type=float, default=1.0)
    search.add_argument("--json", action="store_true")
    _session_args(search)
    search.set_defaults(func=_cmd_search)
    status = sub.add_parser("status", help="indexes, shards, replicas, nodes")
    status.add_argument("--json", action="store_true")
    _session_args(status)
    status.set_defaults(func=_cmd_status)
    alias = sub.add_parser("alias", help="point ALIAS at INDEX (atomic switch)")
    alias.add_argument("alias")
    alias.add_argument("index")
    _session_args(alias)
    alias.set_defaults(func=_cmd_alias)
    remove = sub.add_parser("remove", help="undeploy and delete an index")
    remove.add_argument("name")
    remove.add_argument("--purge", action="store_true", help="delete its store files too")
    remove.add_argument("--wait", action="store_true")
    _session_args(remove)
    remove.set_defaults(func=_cmd_remove)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    return dispatch("katta", build_parser(), {}, argv)  # each sub-parser sets its func


def cli() -> int:
    """The program: :func:`main` with logging at warning unless ``FRAMEWORK_LOG_LEVEL`` says
    otherwise (a one-shot command's own session events are noise).  Logging is configured
    here, not in :func:`main`, because structlog binds the stream it is configured with."""
    configure_logging(level=os.environ.get("FRAMEWORK_LOG_LEVEL") or "warning")
    return main()


if __name__ == "__main__":
    sys.exit(cli())
