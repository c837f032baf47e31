"""The broker's znode layout and its records in ZooKeeper (YMB, Figure 3).

Everything lives under ``/apps/broker`` (the runtime's :class:`framework.runtime.App`); the
record class of each node's data is named on the right::

    masters/                      controller election (the runtime's)
    nodes/<server>                ephemeral, one per live server: what    NodeRecord
                                  it serves (no address: see below)
    shutdown                      exists => servers hand over and exit    ShutdownRequest
    migration_prohibited          exists => the controller makes no voluntary moves
    workers/<server>              ephemeral: the server as a runtime worker (its group)
    shards/<topic>, plan/<topic>  the runtime's replicated placement (the controller's intent;
                                  ``plan/<topic>``: the servers placed, :func:`decode_replicas`)
    assignments/<server>/<topic>  the same, per server (``Worker.serve_shard`` per topic)
    topics/<topic>                settings                                TopicSettings
    topics/<topic>/isr            in-sync replicas, last leader, term     Isr
    topics/<topic>/primary        ephemeral: the serving primary (its     PrimaryRecord
                                  name); its czxid is the epoch of this primary term
    topics/<topic>/subscribers/<name>   a subscriber's committed offset   Position
    subscriber_locks/<name>/lock-*      the live instance of a subscriber SubscriberIdentity

Where a server is reached is not in these records: every server registers itself with the
framework's :class:`~framework.primitives.ServiceDiscovery` (ephemeral, in the same session
as its ``nodes/`` and ``primary`` nodes)::

    /services/<app name>/<server> a ServiceInstance: advertised address and port, with a
                                  ServerPayload (TLS or not, host name) as its payload

Clients and backups read a topic's ``primary`` (who serves, with the epoch) and then that
server's instance (where), with a watch on both (:func:`find_server`).

Records are attrs classes written as compact JSON by :mod:`framework.records` (``records.
encode``) and read with :func:`decode`: keys a newer writer added are ignored, keys an older
writer lacked take their defaults, and data that is not the record raises
:class:`~framework.records.CorruptRecord` naming the class and the field.

ZooKeeper never sees a message: writes happen on topic creation, placement changes, failover,
in-sync set changes, status updates and batched subscriber commits only.
"""

from __future__ import annotations

import enum
from typing import Any, Callable, TypeVar

import attrs

from framework import records
from framework.addresses import parse_address
from framework.primitives import ServiceDiscovery, ServiceInstance
from framework.runtime import App, Plan
from framework.zk import Session, validate_name

APP_NAME = "broker"

T = TypeVar("T")


def decode(data: bytes | None, cls: type[T]) -> T:
    """The ``cls`` record in a znode's data; the class's defaults for a node without data
    (or one that does not exist: a watch's snapshot); :class:`~framework.records.
    CorruptRecord`, naming the class and what does not fit, for data that is not one."""
    return cls() if not data else records.decode(data, cls)


def decode_replicas(data: bytes | None) -> tuple[str, ...]:
    """The servers placed for a topic, from its ``plan/<topic>`` znode (the runtime's
    :class:`~framework.runtime.Plan`); :class:`~framework.records.CorruptRecord` if it is not
    a list of names."""
    return Plan.decode(data or b"").workers


class Mode(enum.Enum):
    """What a topic's primary does while no backup is in sync."""

    #: refuse writes (``no_in_sync_backup``): every acknowledged message is on two servers
    REFUSE = "refuse"
    #: acknowledge with one copy, once ZooKeeper's in-sync set names the primary alone
    ONE_COPY = "one_copy"


def _mode(value: Mode | str) -> Mode:
    try:
        return Mode(value)
    except ValueError:
        from framework.errors import ConfigurationError

        raise ConfigurationError(f"mode must be one of {', '.join(m.value for m in Mode)}, "
                                 f"got {value!r}") from None


@attrs.frozen
class TopicSettings:
    """``topics/<t>``: a topic's settings, written once by ``ctl create``."""

    mode: Mode = attrs.field(default=Mode.REFUSE, converter=_mode)
    #: a random id drawn when the topic is created: a server's log belongs to one topic
    #: incarnation, never to an earlier topic of the same name (empty for older topics)
    id: str = ""


@attrs.frozen
class Isr:
    """``topics/<t>/isr``: the in-sync replica record of a topic.

    ``in_sync`` lists the servers holding every acknowledged message; only one of them may
    become primary.  ``term`` grows with every takeover (a takeover sets this record with the
    version it read and creates ``primary`` in one multi, so two takeovers cannot both win and
    a deposed primary's later conditional write fails)."""

    in_sync: tuple[str, ...] = ()
    leader: str | None = None
    term: int = 0
    #: the backups' copies counted in sync (server -> copy token): a backup whose current
    #: copy is named here may take over even if the primary died before telling it so, or
    #: after a restart (the copy and its token survive on disk)
    copies: dict[str, str] = attrs.field(factory=dict)
    #: the primary's high watermark when this record was written (written only with an
    #: in-sync change, never per message: a lower bound of what was acknowledged)
    hw: int = 0
    #: set only by ``ctl force-leader``: this server may take over although its log may
    #: miss acknowledged records (an operator's decision, with a stated loss)
    forced: str | None = None


@attrs.frozen
class PrimaryRecord:
    """``topics/<t>/primary`` (ephemeral): the serving primary; the node's czxid is the
    epoch of its term."""

    server: str = ""


class ServerState(enum.Enum):
    """A server's state in its ``nodes/`` record."""

    RUNNING = "running"
    #: handing its primaries over before it leaves (the controller keeps its replicas)
    STOPPING = "stopping"


@attrs.frozen
class NodeRecord:
    """``nodes/<server>`` (ephemeral): what a server serves, as the controller and ``ctl
    status`` read it."""

    name: str = ""
    state: ServerState = ServerState.RUNNING
    #: whether the server saw ``migration_prohibited``
    migration_prohibited: bool = False
    load: int = 0
    primaries: tuple[str, ...] = ()
    backups: tuple[str, ...] = ()
    #: per topic it leads: how far its slowest in-sync backup is behind (``None``: none)
    lag: dict[str, int | None] = attrs.field(factory=dict)
    #: per topic it leads: placed backups it dropped from the in-sync set, or reports slow
    #: (the controller places a replacement for each)
    out_of_sync: dict[str, tuple[str, ...]] = attrs.field(factory=dict)
    #: topics with no primary it cannot take over: its log's end (``ctl force-leader``)
    stranded: dict[str, int] = attrs.field(factory=dict)


@attrs.frozen
class ServerPayload:
    """The payload of a server's discovery instance (``/services/<app>/<server>``)."""

    #: whether its links are TLS (clients need ``$BROKER_TLS_CA`` then)
    tls: bool = False
    host: str = ""


@attrs.frozen
class Position:
    """``topics/<t>/subscribers/<name>``: a durable subscriber's committed offset."""

    offset: int = 0


@attrs.frozen
class ShutdownRequest:
    """``shutdown``: the servers to stop (empty: every server)."""

    servers: tuple[str, ...] = ()


@attrs.frozen
class SubscriberIdentity:
    """The data of a subscriber's lock node: which process holds or waits for the name."""

    host: str = ""
    pid: int = 0


@attrs.frozen
class BrokerPaths:
    """Paths of one broker installation (``app`` defaults to ``/apps/broker``)."""

    app: App = attrs.field(factory=lambda: App(APP_NAME))

    base = property(lambda self: self.app.base)
    #: the discovery service the servers register as (one per broker installation)
    service = property(lambda self: self.app.name)
    nodes = property(lambda self: f"{self.app.base}/nodes")
    shutdown = property(lambda self: f"{self.app.base}/shutdown")
    migration_prohibited = property(lambda self: f"{self.app.base}/migration_prohibited")
    topics = property(lambda self: f"{self.app.base}/topics")

    def topic(self, name: str) -> str:
        return f"{self.topics}/{name}"

    def placement(self, name: str) -> str:
        """The topic's placement: the runtime's ``plan/<topic>`` (:func:`decode_replicas`)."""
        return self.app.plan_path(name)

    def isr(self, name: str) -> str:
        return f"{self.topics}/{name}/isr"

    def primary(self, name: str) -> str:
        return f"{self.topics}/{name}/primary"

    def subscribers(self, name: str) -> str:
        return f"{self.topics}/{name}/subscribers"

    def subscriber(self, topic: str, name: str) -> str:
        return f"{self.topics}/{topic}/subscribers/{name}"

    #: exclusive subscribers: one lock per subscriber name (``Subscriber``)
    subscriber_locks = property(lambda self: f"{self.app.base}/subscriber_locks")

    def subscriber_lock(self, name: str) -> str:
        return f"{self.subscriber_locks}/{name}"

    def assign_dir(self, server: str) -> str:
        """The topics assigned to ``server``: the runtime's ``assignments/<server>``."""
        return self.app.assignment_dir(server)


def check_topic(name: str) -> str:
    """A topic name, or a clear :class:`ConfigurationError`."""
    return validate_name("topic name", name)


def discovery(session: Session) -> ServiceDiscovery:
    """The servers' registry (``/services``, the recipe's default base)."""
    return ServiceDiscovery(session)


def server_instance(paths: BrokerPaths, server: str, advertised: str, *, tls: bool,
                    host: str = "") -> ServiceInstance:
    """The discovery instance of ``server`` reached at ``advertised`` (``host:port``)."""
    address, port = parse_address(advertised, what="advertised address")
    assert address is not None and port is not None, advertised
    return ServiceInstance(paths.service, address, port, id=server,
                           payload=records.unstructure(ServerPayload(tls, host)))


async def find_server(session: Session, paths: BrokerPaths, server: str,
                      watch: Callable[..., Any] | None = None) -> str | None:
    """``host:port`` where ``server`` is registered, or ``None`` while it is not;
    ``watch`` is armed on its instance (set when it registers or goes).  A connection loss
    or expiry is raised, as for the caller's other watched reads."""
    if watch is None:
        instance = await discovery(session).instance(paths.service, server)
    else:
        instance = await discovery(session).instance(paths.service, server, watch=watch)
    return None if instance is None else instance.endpoint
