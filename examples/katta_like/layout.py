"""The znode layout of a Katta-like deployment, and its records.

Under the runtime's application root ``/apps/<app>`` (masters/, workers/ = live nodes,
tasks/ = the index build queue, results/ = build results; the replicated placement of the
runtime's push mode, see docs/architecture.md)::

    katta/indexes/<index>                 IndexRecord: shards, replication, store, corpus,
                                          state (IndexState), by ctl then the master (fenced)
    katta/aliases/<alias>                 AliasRecord: switched with one set (atomic)
    shards/<index>.<shard>                the runtime's shard: ShardSpec (fenced)
    plan/<index>.<shard>                  the master's plan: the runtime's Plan (fenced)
    assignments/<node>/<index>.<shard>    per-node plan (same fenced multi), watched by the node
    deployed/<index>.<shard>/<node>       EPHEMERAL, by the node once the shard is copied,
                                          verified and open: DeploymentInfo
    refused/<index>.<shard>/<node>        the node found the shard corrupt (persistent)

and, outside the application root, where each node is reached: every node registers itself
with the framework's :class:`~framework.primitives.ServiceDiscovery` (before it announces
any shard, ephemeral, registered again after a session loss)::

    /services/<app>/<node>                a ServiceInstance: the address and port the node
                                          advertises, with a NodePayload (TLS, host name)

Ideal state (plan, assignments) is written by the master; observed state (deployed/, and
the nodes' own registrations) by the nodes; clients route by deployed/ and the
registrations only.

Every record is an attrs class encoded by :mod:`framework.records` (compact JSON).
:func:`read_record` decodes one read from a znode and raises
:class:`~framework.records.CorruptRecord` naming the znode when the bytes are not a record
of that class; readers that follow a record with a watch log ``katta.bad_record`` and skip
it instead (see :func:`decode_logged`).
"""

from __future__ import annotations

import enum
import math
import os
from typing import Any, TypeVar

import attrs

from examples.katta_like.corpus import CorpusSpec
from framework import get_logger, records
from framework.addresses import parse_address
from framework.errors import ConfigurationError
from framework.primitives import ServiceDiscovery, ServiceInstance
from framework.runtime import App, MemberStatus
from framework.zk import Session

log = get_logger("examples.katta_like.layout")

APP_NAME = "katta"
R = TypeVar("R")


class IndexState(enum.Enum):
    """Where an index is in its life (``IndexRecord.state``)."""

    BUILDING = "building"  # added; the master builds its shards as a job
    DEPLOYING = "deploying"  # built; being placed
    DEPLOYED = "deployed"  # every shard had min(R, live nodes) serving replicas once
    ERROR = "error"  # a build failed, or every eligible node refused a shard
    REMOVING = "removing"  # asked to go; deleted once no shard of it is served


@attrs.frozen
class KattaPaths:
    app: App

    @property
    def base(self) -> str:
        return f"{self.app.base}/katta"

    indexes = property(lambda self: f"{self.base}/indexes")
    aliases = property(lambda self: f"{self.base}/aliases")

    def index(self, name: str) -> str:
        return f"{self.indexes}/{name}"

    def plan(self, name: str, shard: int) -> str:
        """The runtime's plan of one shard of index ``name`` (JSON list of nodes)."""
        return self.app.plan_path(replica_name(name, shard))

    def deployed(self, name: str, shard: int) -> str:
        """The serving records of one shard of index ``name``."""
        return self.app.deployed_dir(replica_name(name, shard))

    def refused(self, name: str, shard: int) -> str:
        """The nodes that found one shard of index ``name`` corrupt."""
        return self.app.refused_dir(replica_name(name, shard))

    def node(self, node: str) -> str:
        """A node's assignments (``<index>.<shard>`` children)."""
        return self.app.assignment_dir(node)

    def alias(self, name: str) -> str:
        return f"{self.aliases}/{name}"

    @property
    def service(self) -> str:
        """The discovery service the nodes register as (the application's name)."""
        return self.app.name


def env_seconds(name: str, default: float) -> float:
    """A duration setting from the environment: a finite number of seconds, 0 or more;
    anything else is a :class:`ConfigurationError` naming the variable (one line for a
    ``framework run`` user, never a traceback)."""
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        raise ConfigurationError(f"{name} must be a number of seconds, not {text!r}") from None
    if not 0 <= value < math.inf:
        raise ConfigurationError(f"{name} must be a finite number of seconds, 0 or more, "
                                 f"not {text!r}")
    return value


def shard_name(shard: int) -> str:
    return f"{shard:05d}"


#: Longest index name: ``<index>.<shard>`` must fit a runtime shard name (100 characters).
MAX_INDEX_NAME = 90


def replica_name(index: str, shard: int) -> str:
    """The runtime's name of one shard of an index (its shard number has no ``.``)."""
    return f"{index}.{shard_name(shard)}"


def parse_replica(name: str) -> tuple[str, int]:
    index, _, shard = name.rpartition(".")
    return index, int(shard)


@attrs.frozen
class IndexRecord:
    """An index (``katta/indexes/<name>``): how many shards, how many replicas each, where
    its documents come from, and its state.  Building one with a shard count outside
    1..1000 or a replication outside 1..10 raises :class:`ConfigurationError`."""

    name: str
    shards: int
    replication: int
    store: str
    corpus: CorpusSpec
    state: IndexState = IndexState.BUILDING
    error: str = ""
    purge: bool = False  # removing: delete the store files too
    built: bool = False  # every shard was built (its shards stay placed in state error)

    def __attrs_post_init__(self) -> None:
        if not 1 <= self.shards <= 1000:
            raise ConfigurationError(f"shards must be 1..1000, not {self.shards}")
        if not 1 <= self.replication <= 10:
            raise ConfigurationError(f"replication must be 1..10, not {self.replication}")

    @property
    def placed(self) -> bool:
        """Whether its shards are wanted on nodes (deploying, deployed, or in error once
        built)."""
        return self.state in (IndexState.DEPLOYING, IndexState.DEPLOYED) or (
            self.state is IndexState.ERROR and self.built)

    def evolve(self, **changes: Any) -> IndexRecord:
        return attrs.evolve(self, **changes)


@attrs.frozen
class AliasRecord:
    """``katta/aliases/<alias>``: the index the alias names."""

    index: str


@attrs.frozen
class ShardSpec:
    """The runtime's ``shards/<index>.<shard>``: which shard of which index, in which
    store (written by the master, read by the node that serves it)."""

    index: str
    shard: int
    store: str


@attrs.frozen
class DeploymentInfo:
    """A node's ``deployed/<index>.<shard>/<node>`` record: how many documents its copy
    holds (the runtime adds an ``incarnation``, ignored here).  Where the node answers is
    its discovery instance (:func:`node_instance`), not this record."""

    docs: int = 0


@attrs.frozen
class NodePayload:
    """The payload of a node's discovery instance (``/services/<app>/<node>``)."""

    #: whether its query links are TLS (clients need ``$KATTA_TLS_CA`` then)
    tls: bool = False
    host: str = ""


def discovery(session: Session) -> ServiceDiscovery:
    """The nodes' registry (``/services``, the recipe's default base)."""
    return ServiceDiscovery(session)


def node_instance(paths: KattaPaths, node: str, advertised: str, *, tls: bool,
                  host: str = "") -> ServiceInstance:
    """The discovery instance of ``node`` reached at ``advertised`` (``host:port``)."""
    address, port = parse_address(advertised, what="advertised address")
    assert address is not None and port is not None, advertised
    return ServiceInstance(paths.service, address, port, id=node,
                           payload=records.unstructure(NodePayload(tls, host)))


@attrs.frozen
class NodeHealth:
    """The ``health`` of a search node's status (``workers/<node>``)."""

    ok: bool = True
    serving: int = 0
    queries: int = 0


def serving_of(member: MemberStatus) -> int:
    """How many shards a search node says it serves (the health in its status)."""
    try:
        return records.structure(member.health, NodeHealth).serving
    except records.CorruptRecord:
        return 0


@attrs.frozen
class BuildTask:
    """The payload of one build task: the index record and the shard to build."""

    record: IndexRecord
    shard: int


@attrs.frozen
class BuildResult:
    """The result of one build task: the shard's documents and manifest checksum."""

    docs: int
    checksum: str


def read_record(data: bytes, cls: type[R], path: str) -> R:
    """``data`` read from the znode ``path`` as a ``cls`` record;
    :class:`~framework.records.CorruptRecord` naming ``path`` if it is not one."""
    try:
        return records.decode(data, cls)
    except records.CorruptRecord as exc:
        raise records.CorruptRecord(f"{path}: {exc}") from None


def decode_logged(data: bytes, cls: type[R], path: str) -> R | None:
    """``data`` read from ``path`` as a ``cls`` record, or ``None`` after a
    ``katta.bad_record`` event (for readers that follow the record and skip what is not
    one until it is rewritten)."""
    try:
        return records.decode(data, cls)
    except records.CorruptRecord as exc:
        bad_record(path, exc)
        return None


def bad_record(path: str, exc: records.CorruptRecord) -> None:
    """The ``katta.bad_record`` event: what was read from ``path`` is not a record."""
    log.error("katta.bad_record", path=path, error=str(exc))
