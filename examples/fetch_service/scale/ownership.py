"""Owning a partition: the epoch taken in ZooKeeper and the fenced publish of checkpoints.

:meth:`Ownership.take_over` raises the partition's epoch by one with a version-checked set
of its record; it wins only against the version it read, so of two would-be owners exactly
one gets each epoch.  Every later :meth:`Ownership.publish` is a set at the version this
owner last wrote: once anybody else has taken the partition over, the server refuses it
(``BadVersionError``) and :class:`PartitionLost` is raised.  The published checkpoint is the
partition's durable state, so a deposed owner cannot change what the next owner resumes
from; whatever else it still does (fetching pages, shipping links) is at-least-once noise:
duplicate WARC records and duplicate links, which the receivers' seen-sets drop.

A lost reply (``ConnectionLossError``) is resolved by reading the record back: our write
happened if the record now holds what we wrote.
"""

from __future__ import annotations

from typing import Any

import attrs

from examples.fetch_service.scale.layout import PartitionRecord
from framework import errors
from framework.logs import get_logger
from framework.zk import Session, wait_exists

__all__ = ["Ownership", "PartitionLost"]

log = get_logger("examples.fetch_service.scale.ownership")


class PartitionLost(errors.OwnershipLost):
    """Another fetcher took the partition over: our publish was refused by the server."""

    kind = "partition"


class Ownership:
    """One owner's hold on partition record ``path`` (see the module doc)."""

    def __init__(self, session: Session, path: str, owner: str) -> None:
        self.session = session
        self.path = path
        self.owner = owner
        self.record = PartitionRecord()
        self.version = -1

    @property
    def epoch(self) -> int:
        return self.record.epoch

    async def take_over(self) -> PartitionRecord:
        """Become the owner under a new epoch; returns the record (with the checkpoint to
        resume from).  Waits for the record to exist (the master creates it)."""
        while True:
            try:
                data, stat = await self.session.get(self.path)
            except errors.NoNodeError:
                await wait_exists(self.session, self.path)
                continue
            current = PartitionRecord.from_json(data)
            wanted = attrs.evolve(current, epoch=current.epoch + 1, owner=self.owner,
                                  status={"idle": False, "taken_over": True})
            if await self._set(wanted, stat.version):
                log.info("partition.taken_over", partition=self.path.rpartition("/")[2],
                         owner=self.owner, epoch=wanted.epoch, checkpoint=wanted.checkpoint)
                return wanted

    async def publish(self, checkpoint: str, status: dict[str, Any]) -> None:
        """Point the record at ``checkpoint``; :class:`PartitionLost` if we were deposed."""
        wanted = attrs.evolve(self.record, checkpoint=checkpoint, status=status)
        if not await self._set(wanted, self.version):
            raise PartitionLost(f"{self.path} was taken over (our epoch {self.epoch})")

    async def _set(self, wanted: PartitionRecord, version: int) -> bool:
        while True:
            try:
                stat = await self.session.set(self.path, wanted.to_json(), version=version)
            except errors.BadVersionError:
                return False
            except errors.ConnectionLossError:
                await self.session.wait_connected()
                data, stat = await self.session.get(self.path)
                if PartitionRecord.from_json(data) != wanted:
                    if stat.version == version:
                        continue  # not applied: try again
                    return False
            self.record, self.version = wanted, stat.version
            return True
