"""A task's ``running/<task id>`` marker: which delivery of it is running, and where.

The marker is an ephemeral node of the running worker's session, created with the task's
claim (or right after it), carrying the delivery's token (``worker/item name/attempt``) and
the task's progress; it is the task id's mutual exclusion across deliveries (see
:mod:`framework.runtime.worker_parts.task_consumer`).
"""

from __future__ import annotations

import attrs

from framework import errors, records
from framework.primitives.queue import Finisher, QueueItem
from framework.runtime.records import RunningRecord, decode_or_none
from framework.zk import Session


@attrs.define
class Marker:
    """This worker's ``running/<task id>`` node: its record (the delivery token
    ``worker/item name/attempt`` and progress) and the version we last wrote."""

    path: str
    record: RunningRecord
    version: int = 0
    finisher: Finisher | None = None  # when set and applied, the ack deleted the marker
    after_ack: str | None = None  # a node to delete once the item is acknowledged alone

    @property
    def delivery(self) -> str:
        return self.record.delivery

    def encode(self) -> bytes:
        return records.encode(self.record)

    def progressed(self, done: float, total: float | None, message: str, at: float) -> bytes:
        """The record with the handler's latest progress, encoded."""
        return records.encode(attrs.evolve(self.record, done=done, total=total,
                                           message=message, at=at))


def earlier_delivery_of(delivery: str, item: QueueItem) -> bool:
    """Whether ``delivery`` (a marker's token) is an earlier delivery of ``item``: that
    delivery's claim has ended, since ours holds the item now."""
    head, _, attempt = delivery.rpartition("/")
    _worker, _, name = head.partition("/")
    return name == item.name and attempt.isdigit() and int(attempt) < item.attempts


async def marker_owner(session: Session, path: str) -> tuple[str, int, int] | None:
    """The delivery token, owning session and version of a ``running/`` marker (``None``:
    there is none)."""
    while True:
        try:
            await session.sync(path)
            data, stat = await session.get(path)
        except errors.NoNodeError:
            return None
        except errors.ConnectionLossError:
            await session.wait_connected()
            continue
        record = decode_or_none(data, RunningRecord, path=path) or RunningRecord()
        return record.delivery, stat.ephemeralOwner, stat.version
