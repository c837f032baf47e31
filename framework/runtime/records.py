"""The runtime's znode records, as attrs classes through :mod:`framework.records`.

Where each lives (see :mod:`framework.runtime.app` for the layout):

* :class:`MasterIdentity`: a master's election node and, while it leads, ``rendezvous``;
* :class:`JobDone`: ``done``, written once in the term that finished the job (fenced);
* :class:`CancelRecord`: ``cancel``, written by ``framework cancel``;
* :class:`PastRun`: ``history/g-<n>``, a finished generation (``framework rerun``);
* :class:`RevokeRecord`: ``revoked/<task id>``, written by ``framework revoke``;
* :class:`RunningRecord`: ``running/<task id>``, the ephemeral marker of a delivery;
* :class:`MemberStatus`: ``workers/<name>``, a service's status, as readers see it (with
  its task consumer's :class:`~framework.metrics.TaskStats`);
* :class:`Plan`: ``plan/<shard>``, the workers a replicated shard is placed on;
* :class:`Refusal`: ``refused/<shard>/<worker>``, why a worker cannot serve a shard.

Tasks and their results are in :mod:`framework.runtime.tasks`.  Every record decodes with
:func:`decode_or_none` for readers that show what they can: a record a newer or older
writer wrote still decodes (unknown keys ignored, missing ones defaulted), one that is not
a record at all is logged and shown as missing.
"""

from __future__ import annotations

import enum
from typing import Any, TypeVar

import attrs

from framework import records
from framework.logs import get_logger
from framework.metrics import Durations, TaskStats

log = get_logger("framework.runtime.records")

T = TypeVar("T")


def decode_or_none(data: bytes | None, cls: type[T], *, path: str = "") -> T | None:
    """``data`` as a ``cls`` record; ``None`` (and a ``record.corrupt`` event) if it is
    not one, or if there is no data."""
    if not data:
        return None
    try:
        return records.decode(data, cls)
    except records.CorruptRecord as exc:
        log.warning("record.corrupt", path=path, error=str(exc))
        return None


@attrs.frozen
class MasterIdentity:
    """Who a master is: published in its election node (and ``rendezvous`` as leader)."""

    name: str = ""
    address: str | None = None
    pid: int = 0
    host: str = ""


@attrs.frozen
class JobDone:
    """The job-done record: which master finished the job, when, in which term, and the
    job's result and dead-letter counts then."""

    master: str = ""
    at: float = 0.0
    token: int = 0
    results: int = 0
    dead_letters: int = 0


@attrs.frozen
class CancelRecord:
    """The cancel record: when, and by whom (free text from ``framework cancel --by``)."""

    at: float = 0.0
    by: str = ""


@attrs.frozen
class PastRun:
    """``history/g-<n>``: a finished generation of the job, kept when ``framework rerun``
    starts the next one: its job-done record, and when and by whom it was rerun."""

    generation: int = 0
    done: JobDone = attrs.Factory(JobDone)
    rerun_at: float = 0.0
    by: str = ""


@attrs.frozen
class RevokeRecord:
    """``revoked/<task id>``: when, and by whom, the task was revoked."""

    at: float = 0.0
    by: str = ""


class Revocation(enum.Enum):
    """What ``Client.revoke`` did."""

    REVOKED = "revoked"    # recorded: the task will not run, or is cancelled if running
    ALREADY = "already"    # it was revoked before
    FINISHED = "finished"  # its result is recorded: there was nothing left to revoke


@attrs.frozen
class RunningRecord:
    """A delivery being handled: its token (``worker/item name/attempt``, the marker's
    identity across deliveries), where and since when, and the progress its handler last
    reported (``done`` of ``total`` units, a message, when)."""

    delivery: str = ""
    worker: str = ""
    started: float = 0.0
    attempt: int = 0
    done: float | None = None
    total: float | None = None
    message: str | None = None
    at: float | None = None


class MemberState(enum.Enum):
    """A service's state in its status record."""

    RUNNING = "running"
    DRAINING = "draining"
    STOPPING = "stopping"
    STOPPED = "stopped"
    UNKNOWN = "?"


@attrs.frozen
class MemberStatus:
    """A service's ``workers/<name>`` record as readers use it: the runtime's fields (the
    service and its parts write an open document: keys added by a subclass ride along and
    are ignored here)."""

    name: str = ""
    address: str | None = None
    host: str = ""
    pid: int = 0
    state: MemberState = MemberState.UNKNOWN
    kind: str = "worker"
    load: float = 0.0
    in_flight: int = 0
    done: int = 0
    failed: int = 0
    retried: int = 0
    dead_lettered: int = 0
    durations: Durations | None = None
    shards: tuple[str, ...] = ()
    stuck_threads: int = 0
    health: dict[str, Any] = attrs.Factory(lambda: {"ok": True})
    counters: dict[str, float] = attrs.Factory(dict)
    at: float | None = None

    def task_stats(self) -> TaskStats:
        """The task counts and durations of the member's consumer since it started (a
        member that takes no tasks, or an older writer: no durations, zero counts)."""
        return TaskStats(self.done, self.failed, self.retried, self.dead_lettered,
                         self.durations.copy() if self.durations else Durations())


def _state(value: Any) -> MemberState:
    try:
        return MemberState(value)
    except ValueError:
        return MemberState.UNKNOWN


records.converter.register_structure_hook(MemberState, lambda value, _cls: _state(value))


@attrs.frozen
class Plan:
    """A replicated shard's placement: its workers, the first one primary."""

    workers: tuple[str, ...] = ()

    def encode(self) -> bytes:
        """A JSON list, as readers of ``plan/`` outside Python expect."""
        return records.encode(list(self.workers))

    @classmethod
    def decode(cls, data: bytes) -> Plan:
        """:class:`~framework.records.CorruptRecord` if ``data`` is not a list of names."""
        return cls(records.structure(records.decode(data, list[str]) if data else [],
                                     tuple[str, ...]))


@attrs.frozen
class Refusal:
    """A worker's refusal of a replicated shard (``serve_shard`` raised
    :class:`~framework.errors.PermanentFailure`): the placement skips it for that shard."""

    worker: str = ""
    error: str = ""
