"""Owning a partition: the epoch taken in ZooKeeper, the hand-over from the previous owner,
and the fenced publish of checkpoints.

Guarantees:

* **One owner per epoch.**  :meth:`Ownership.take_over` raises the partition's epoch by one
  with a version-checked set of its :class:`~.layout.PartitionRecord`; of two would-be owners
  exactly one gets each epoch.  With ``assignment``, the same multi checks that this
  fetcher's assignment node (the master's decision) exists: a fetcher the partition was
  moved away from cannot take it back, however late it acts.
* **Fenced publish.**  Every later :meth:`Ownership.publish` / :meth:`Ownership.release` is a
  set at the version this owner last wrote: once anybody else has taken the partition over,
  the server refuses it and :class:`PartitionLost` is raised.  The published checkpoint is
  the partition's durable state, so a deposed owner cannot change what the next owner
  resumes from; whatever else it still does (fetching pages, shipping links) is
  at-least-once noise that the receivers' seen-sets drop.
* **Hand-over** (``members`` given): a new owner waits, before it takes over, until the
  record is :attr:`~.layout.PartitionState.RELEASED`, or its owner is no longer a live
  member (its session expired), or ``handoff_timeout`` passed (the previous owner is stuck;
  fencing still keeps the state right).  So between two live fetchers the old owner's
  requests are over before the new owner starts, and the new owner resumes from the old
  owner's last checkpoint.

Connection states: the calls need a connected session and do not watch its state
themselves.  A lost reply (``ConnectionLossError``) is resolved by waiting for the
connection and reading the record back: our write happened if the record holds what we
wrote.  A session expiry raises :class:`~framework.errors.SessionExpiredError` (the caller,
run by the runtime's shard server, is cancelled on SUSPENDED past the trust deadline and
on LOST anyway).  A partition record that is not a record (:class:`~framework.records.
CorruptRecord`) is never overwritten: :meth:`take_over` logs ``partition.record_corrupt``
and waits until the node changes.

ZooKeeper cost: a takeover is one read and one multi (plus one read and two watches per
change seen while waiting for the hand-over); a publish is one set.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import attrs
import trio

from examples.fetch_service.scale.layout import PartitionRecord, PartitionState
from examples.fetch_service.scale.store import Progress
from framework import errors, records
from framework.logs import get_logger
from framework.zk import Session, wait_exists

__all__ = ["HANDOFF_TIMEOUT_S", "Ownership", "PartitionLost"]

log = get_logger("examples.fetch_service.scale.ownership")

#: Longest wait for a live previous owner to release the partition (its last checkpoint is
#: bounded by 3 s; past this it is taken to be stuck).
HANDOFF_TIMEOUT_S = 10.0


class PartitionLost(errors.OwnershipLost):
    """Another fetcher took the partition over (our publish was refused by the server), or
    the partition is not assigned to us (our takeover was refused)."""

    kind = "partition"


class Ownership:
    """One owner's hold on partition record ``path`` (see the module doc).

    ``assignment``: this owner's assignment node, checked by the takeover; ``members``: the
    group directory whose ``<owner>`` child exists while that owner lives (the hand-over
    waits for a live previous owner).  Without them, neither check is made.  ``on_wait`` is
    called with the previous owner's name each time the takeover starts waiting for it.
    """

    def __init__(self, session: Session, path: str, owner: str, *,
                 assignment: str | None = None, members: str | None = None,
                 handoff_timeout: float = HANDOFF_TIMEOUT_S,
                 on_wait: Callable[[str], None] | None = None) -> None:
        self.session = session
        self.path = path
        self.owner = owner
        self.assignment = assignment
        self.members = members
        self.handoff_timeout = handoff_timeout
        self.on_wait = on_wait
        self.record = PartitionRecord()
        self.version = -1
        #: The record as the previous owner left it (set by :meth:`take_over`).
        self.previous = PartitionRecord()

    @property
    def epoch(self) -> int:
        return self.record.epoch

    async def take_over(self) -> PartitionRecord:
        """Become the owner under a new epoch; returns the record (with the checkpoint to
        resume from).  Waits for the record to exist (the master creates it), to be a valid
        record, and for a live previous owner to release it; :class:`PartitionLost` if the
        partition is not assigned to us."""
        deadline = trio.current_time() + self.handoff_timeout
        while True:
            changed = trio.Event()
            try:
                data, stat = await self.session.get(self.path,
                                                    watch=self.session.waker(changed))
            except errors.NoNodeError:
                await wait_exists(self.session, self.path)
                continue
            try:
                current = records.decode(data, PartitionRecord)
            except records.CorruptRecord as exc:
                log.error("partition.record_corrupt", path=self.path, owner=self.owner,
                          error=str(exc), action="waiting for the record to be rewritten")
                await changed.wait()
                continue
            if await self._must_wait(current, changed, deadline):
                with trio.move_on_at(deadline):
                    await changed.wait()
                continue
            wanted = attrs.evolve(current, epoch=current.epoch + 1, owner=self.owner,
                                  state=PartitionState.TAKEN_OVER)
            if await self._set(wanted, stat.version, takeover=True):
                self.previous = current
                log.info("partition.taken_over", partition=self.path.rpartition("/")[2],
                         owner=self.owner, epoch=wanted.epoch, checkpoint=wanted.checkpoint,
                         previous=current.owner, released=current.released)
                return wanted

    async def publish(self, checkpoint: str, progress: Progress, *,
                      released: bool = False) -> None:
        """Point the record at ``checkpoint``, which holds ``progress`` (``released``: and
        hand the partition over); :class:`PartitionLost` if we were deposed."""
        state = PartitionState.RELEASED if released else PartitionState.SERVING
        wanted = attrs.evolve(self.record, checkpoint=checkpoint, progress=progress,
                              state=state, at=time.time())
        if not await self._set(wanted, self.version):
            raise PartitionLost(f"{self.path} was taken over (our epoch {self.epoch})")

    async def release(self) -> None:
        """Hand the partition over without a new checkpoint (nothing changed since the last
        one); :class:`PartitionLost` if we were deposed."""
        if self.version < 0:
            return  # never owned it
        released = attrs.evolve(self.record, state=PartitionState.RELEASED)
        if not await self._set(released, self.version):
            raise PartitionLost(f"{self.path} was taken over (our epoch {self.epoch})")

    async def _must_wait(self, current: PartitionRecord, changed: trio.Event,
                         deadline: float) -> bool:
        """Whether a live previous owner still holds the partition (then ``changed`` is
        also set when that owner's member node changes or goes)."""
        previous = current.owner
        if (self.members is None or previous is None or previous == self.owner
                or current.released):
            return False
        if trio.current_time() >= deadline:
            log.warning("partition.handoff_timeout", partition=self.path.rpartition("/")[2],
                        owner=self.owner, previous=previous, waited=self.handoff_timeout)
            return False
        member = f"{self.members}/{previous}"
        if await self.session.exists(member, watch=self.session.waker(changed)) is None:
            return False
        log.info("partition.waiting_for_release", partition=self.path.rpartition("/")[2],
                 owner=self.owner, previous=previous)
        if self.on_wait is not None:
            self.on_wait(previous)
        return True

    async def _set(self, wanted: PartitionRecord, version: int, *,
                   takeover: bool = False) -> bool:
        while True:
            try:
                if takeover and self.assignment is not None:
                    results = await self.session.transaction().check(
                        self.assignment, -1).set(self.path, records.encode(wanted),
                                                 version=version).commit()
                    stat = results[1]
                else:
                    stat = await self.session.set(self.path, records.encode(wanted),
                                                  version=version)
            except errors.BadVersionError:
                return False
            except errors.TransactionFailedError as exc:
                if exc.failed_index == 0 and isinstance(exc.cause, errors.NoNodeError):
                    raise PartitionLost(f"{self.path} is not assigned to {self.owner}: "
                                        "takeover refused") from None
                if isinstance(exc.cause, errors.BadVersionError):
                    return False
                raise
            except errors.ConnectionLossError:
                await self.session.wait_connected()
                data, stat = await self.session.get(self.path)
                if not _holds(data, wanted):
                    if stat.version == version:
                        continue  # not applied: try again
                    return False
            self.record, self.version = wanted, stat.version
            return True


def _holds(data: bytes, wanted: PartitionRecord) -> bool:
    """Whether ``data`` is ``wanted`` (bytes that are not a record are not)."""
    try:
        return records.decode(data, PartitionRecord) == wanted
    except records.CorruptRecord:
        return False
