"""The queue's data records: an item as delivered, a claim, put batches."""

from __future__ import annotations

from typing import Any, Awaitable, Callable

import attrs

from framework.primitives.queue.view import Entry
from framework.zk import Transaction

#: At most this many takes are served by one claim round, and acks by one commit.
BATCH = 16


@attrs.frozen
class QueueItem:
    """One delivery of an item.

    ``name`` identifies the item (``b-0000000000/i+0-<token>-0000000042``); ``attempts``
    counts its deliveries including this one (for a dead letter: the deliveries made before
    it died).
    """

    name: str
    data: bytes
    priority: int
    attempts: int
    #: What was committed with this delivery's claim (``WorkQueue(claim_with=...)``), or
    #: ``None`` if nothing was (none asked for, or the server refused it).
    extras: ClaimExtras | None = attrs.field(default=None, eq=False, repr=False)


@attrs.define(eq=False)
class ClaimExtras:
    """Operations committed atomically with an item's claim (``WorkQueue(claim_with=...)``):
    ``build(txn)`` adds them after the claim's own.  If the server refuses them, the item is
    claimed without them (``applied`` stays False) and the holder does that work itself.
    ``undo(txn)`` adds what reverses them when the claim is undone before its block started
    (a take cancelled, a claim nobody wanted any more).  ``payload``: whatever the caller
    wants back with the item (``QueueItem.extras``)."""

    build: Callable[[Transaction], Any]
    undo: Callable[[Transaction], Any]
    payload: Any = None
    applied: bool = False


@attrs.frozen
class Claim:
    entry: Entry
    data: bytes
    version: int  # the item's version while our claim holds (== deliveries so far)
    claim_path: str
    session_id: int
    token: bytes  # the claim node's data: tells our claim from any other
    extras: ClaimExtras | None = None  # committed with the claim once ``extras.applied``


@attrs.define(eq=False)
class Finisher:
    """Operations to commit atomically with an item's acknowledgement
    (:meth:`WorkQueue.finish_with`): ``build(txn)`` adds them; if the server refuses them
    while the claim is still ours, ``await fallback()`` runs instead, before the item is
    acknowledged alone.  ``applied`` says whether they were committed with the ack."""

    build: Callable[[Transaction], Any]
    fallback: Callable[[], Awaitable[None]]
    applied: bool = False


@attrs.define
class Batch:
    """Items ``start:end`` of a ``put_many`` call, sent as one request."""

    start: int
    end: int
    tokens: list[str]
    outcome: Any = None  # the created paths, or the error the request ended with


@attrs.define
class Chain:
    """An ephemeral node whose version orders the pipelined batches of one ``put_many``.

    Batch ``k`` of a round sets it at version ``version + k``: a batch can be applied only
    after every batch before it, so the applied batches are always a prefix - whatever was
    lost on the way - and the node's version says how long that prefix is.
    """

    guid: str
    path: str
    version: int = 0
    alive: bool = True
