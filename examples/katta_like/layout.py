"""The znode layout of a Katta-like deployment, and its records.

Under the runtime's application root ``/apps/<app>`` (masters/, workers/ = live nodes,
tasks/ = the index build queue, results/ = build results)::

    katta/indexes/<index>                 IndexRecord (JSON): shards, replication, corpus,
                                          state building|deploying|deployed|error, by ctl
                                          then the master (fenced)
    katta/indexes/<index>/plan/<shard>    the master's plan: JSON list of nodes (fenced)
    katta/indexes/<index>/deployed/<shard>/<node>
                                          written by the node itself, EPHEMERAL, once the
                                          shard is verified and open: {"address": ...}
    katta/indexes/<index>/errors/<shard>~<node>
                                          a node found the shard corrupt (persistent)
    katta/nodes/<node>/<index>~<shard>    per-node assignment (same fenced multi as the
                                          plan), so a node watches only its own directory
    katta/aliases/<alias>                 {"index": name}: switched with one set (atomic)

Ideal state (plan, nodes/) is written by the master; observed state (deployed/) by the nodes;
clients route by deployed/ only.
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
    nodes = property(lambda self: f"{self.base}/nodes")
    aliases = property(lambda self: f"{self.base}/aliases")

    def index(self, name: str) -> str:
        return f"{self.indexes}/{name}"

    def plan(self, name: str) -> str:
        return f"{self.index(name)}/plan"

    def deployed(self, name: str, shard: int | None = None) -> str:
        path = f"{self.index(name)}/deployed"
        return path if shard is None else f"{path}/{shard_name(shard)}"

    def errors(self, name: str) -> str:
        return f"{self.index(name)}/errors"

    def node(self, node: str) -> str:
        return f"{self.nodes}/{node}"

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


def assignment_name(index: str, shard: int) -> str:
    return f"{index}~{shard_name(shard)}"


def parse_assignment(name: str) -> tuple[str, int]:
    index, _, shard = name.rpartition("~")
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
