"""The znode layout of a Katta-like deployment, and its records.

Under the runtime's application root ``/apps/<app>`` (masters/, workers/ = live nodes,
tasks/ = the index build queue, results/ = build results; the replicated placement of the
runtime's push mode, see docs/architecture.md)::

    katta/indexes/<index>                 IndexRecord (JSON): shards, replication, corpus,
                                          state building|deploying|deployed|error|removing,
                                          by ctl then the master (fenced)
    katta/aliases/<alias>                 {"index": name}: switched with one set (atomic)
    shards/<index>.<shard>                the runtime's shard: spec {"index", "shard", "store"}
    plan/<index>.<shard>                  the master's plan: JSON list of nodes (fenced)
    assignments/<node>/<index>.<shard>    per-node plan (same fenced multi), watched by the node
    deployed/<index>.<shard>/<node>       EPHEMERAL, by the node once the shard is copied,
                                          verified and open: {"address", "docs"}
    refused/<index>.<shard>/<node>        the node found the shard corrupt (persistent)

Ideal state (plan, assignments) is written by the master; observed state (deployed/) by the
nodes; clients route by deployed/ only.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

import attrs

from examples.katta_like.corpus import CorpusSpec
from framework.errors import ConfigurationError
from framework.runtime import App

APP_NAME = "katta"
STATES = ("building", "deploying", "deployed", "error", "removing")


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
    """An index: how many shards, how many replicas each, where its documents come from."""

    name: str
    shards: int
    replication: int
    store: str
    corpus: CorpusSpec
    state: str = "building"
    error: str = ""
    purge: bool = False  # removing: delete the store files too
    built: bool = False  # every shard was built (its shards stay placed in state error)

    def __attrs_post_init__(self) -> None:
        if not 1 <= self.shards <= 1000:
            raise ConfigurationError(f"shards must be 1..1000, not {self.shards}")
        if not 1 <= self.replication <= 10:
            raise ConfigurationError(f"replication must be 1..10, not {self.replication}")
        if self.state not in STATES:
            raise ConfigurationError(f"unknown index state {self.state!r}")

    def encode(self) -> bytes:
        doc = attrs.asdict(self)
        doc["corpus"] = self.corpus.to_json()
        return json.dumps(doc, sort_keys=True).encode()

    @classmethod
    def decode(cls, data: bytes) -> IndexRecord:
        doc: dict[str, Any] = json.loads(data)
        doc["corpus"] = CorpusSpec.from_json(doc["corpus"])
        return cls(**doc)

    def evolve(self, **changes: Any) -> IndexRecord:
        return attrs.evolve(self, **changes)
