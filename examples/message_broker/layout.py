"""The broker's znode layout and the small records kept in ZooKeeper (YMB, Figure 3).

Everything lives under ``/apps/broker`` (the runtime's :class:`framework.runtime.App`)::

    masters/                      controller election (the runtime's)
    nodes/<server>                ephemeral, one per live server: address, load, status, lag
    shutdown                      exists => servers hand their primaries over and exit
    migration_prohibited          exists => the controller makes no voluntary moves
    workers/<server>              ephemeral: the server as a runtime worker (its group)
    shards/<topic>, plan/<topic>  the runtime's replicated placement (the controller's intent):
                                  ``plan/<topic>`` is a JSON list of the servers placed
    assignments/<server>/<topic>  the same, per server (``Worker.serve_shard`` per topic)
    topics/<topic>                settings (mode: ``refuse`` or ``one_copy``)
    topics/<topic>/isr            in-sync replicas, last leader, term (written by the primary
                                  on a change of in-sync set and by a backup taking over)
    topics/<topic>/primary        ephemeral: the serving primary (server, address); its czxid
                                  is the epoch of this primary term
    topics/<topic>/subscribers/<name>   a subscriber's committed position (batched)
    subscriber_locks/<name>/lock-*      the live instance of subscriber ``name`` (a lock: one
                                  at a time; its position commits check its node)

ZooKeeper never sees a message: writes happen on topic creation, placement changes, failover,
in-sync set changes, status updates and batched subscriber commits only.
"""

from __future__ import annotations

import json
from typing import Any

import attrs

from framework.runtime import App
from framework.zk import validate_name

APP_NAME = "broker"

MODES = ("refuse", "one_copy")


def loads(data: bytes | None) -> dict[str, Any]:
    """JSON object from znode data (empty or broken data -> ``{}``)."""
    if not data:
        return {}
    try:
        value = json.loads(data)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def decode_replicas(data: bytes | None) -> list[str]:
    """The servers placed for a topic, from its ``plan/<topic>`` znode (a JSON list)."""
    if not data:
        return []
    try:
        value = json.loads(data)
    except ValueError:
        return []
    if isinstance(value, dict):
        value = value.get("replicas", [])
    return [str(s) for s in value] if isinstance(value, list) else []


def dumps(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


@attrs.frozen
class TopicSettings:
    """A topic's settings.  ``mode``: what the primary does while no backup is in sync:
    ``refuse`` (the default) refuses writes, ``one_copy`` acknowledges with one copy."""

    mode: str = attrs.field(default="refuse")
    #: a random id drawn when the topic is created: a server's log belongs to one topic
    #: incarnation, never to an earlier topic of the same name (empty for older topics)
    id: str = ""

    @mode.validator
    def _check(self, _attr: object, value: str) -> None:
        if value not in MODES:
            from framework.errors import ConfigurationError

            raise ConfigurationError(f"mode must be one of {', '.join(MODES)}, got {value!r}")

    def encode(self) -> bytes:
        return dumps({"mode": self.mode, **({"id": self.id} if self.id else {})})

    @classmethod
    def decode(cls, data: bytes | None) -> TopicSettings:
        doc = loads(data)
        mode, topic_id = doc.get("mode", "refuse"), doc.get("id", "")
        return cls(mode if mode in MODES else "refuse",
                   topic_id if isinstance(topic_id, str) else "")


@attrs.frozen
class Isr:
    """The in-sync replica record of a topic.

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

    def encode(self) -> bytes:
        doc: dict[str, Any] = {"in_sync": list(self.in_sync), "leader": self.leader,
                               "term": self.term, "copies": self.copies, "hw": self.hw}
        if self.forced is not None:
            doc["forced"] = self.forced
        return dumps(doc)

    @classmethod
    def decode(cls, data: bytes | None) -> Isr:
        doc = loads(data)
        copies = doc.get("copies") or {}
        hw, forced = doc.get("hw", 0), doc.get("forced")
        return cls(tuple(doc.get("in_sync") or ()), doc.get("leader"), int(doc.get("term", 0)),
                   {str(k): str(v) for k, v in copies.items()} if isinstance(copies, dict)
                   else {}, hw if isinstance(hw, int) else 0,
                   forced if isinstance(forced, str) else None)


@attrs.frozen
class BrokerPaths:
    """Paths of one broker installation (``app`` defaults to ``/apps/broker``)."""

    app: App = attrs.field(factory=lambda: App(APP_NAME))

    base = property(lambda self: self.app.base)
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
