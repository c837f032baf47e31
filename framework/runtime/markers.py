"""A task's ``running/<task id>`` marker: which delivery of it is running, and where.

The marker is an ephemeral node of the running worker's session, created with the task's
claim (or right after it), carrying the delivery's token (``worker/item name/attempt``) and
the task's progress; it is the task id's mutual exclusion across deliveries (see
:mod:`framework.runtime.task_consumer`).
"""

from __future__ import annotations

import json
from typing import Any

import attrs

from framework import errors
from framework.primitives.queue import Finisher, QueueItem
from framework.zk import Session


@attrs.define
class Marker:
    """This worker's ``running/<task id>`` node: its delivery token
    (``worker/item name/attempt``) and the version we last wrote."""

    path: str
    delivery: str
    doc: dict[str, Any]
    version: int = 0
    finisher: Finisher | None = None  # when set and applied, the ack deleted the marker

    def encode(self, progress: dict[str, Any] | None = None) -> bytes:
        return json.dumps({**self.doc, **(progress or {}), "delivery": self.delivery}).encode()


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
        try:
            delivery = str(json.loads(data).get("delivery", ""))
        except (ValueError, AttributeError):
            delivery = ""
        return delivery, stat.ephemeralOwner, stat.version
