"""Moving one unclaimed item into another queue (:meth:`WorkQueue.move
<framework.primitives.queue.WorkQueue.move>`).

The move is the target queue's put, with three operations of the source queue in the same
multi: create the item's claim node, delete it again, delete the item at the version read.
Creating the claim node proves that nobody holds the item when the multi applies (a held
item's claim node exists: the create is refused); deleting the item at the version read
proves that nobody claimed it between the read and the multi (a claim sets the item, so its
version moves).  So the item leaves the source queue and enters the target once, atomically,
or nothing happens; it is never in both, never in neither, and never moved while a consumer
runs it.  No delivery is counted (nothing is claimed for good) and the claim node leaves no
trace.  The target's put recovers a lost reply by its GUID, as any put does.

Costs: one read of the item, then the target's put (one multi, with the bucket's create if
it opens one).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from framework import errors
from framework.primitives.queue.core import QueueCore
from framework.primitives.queue.view import claim_name_of, parse_item
from framework.zk import Transaction

if TYPE_CHECKING:
    from framework.primitives.queue import WorkQueue

#: Where the source's operations sit among those the move adds to the target's put.
_CLAIM_CREATE, _ITEM_DELETE, _OWN = 0, 2, 3


async def move_item(core: QueueCore, name: str, target: WorkQueue,
                    also: Callable[[Transaction], None] | None,
                    rewrite: Callable[[bytes], bytes] | None = None) -> str | None:
    """Move item ``name`` of the queue ``core`` into ``target`` (see the module doc); its new
    name there, or ``None`` if it is gone or claimed now (nothing applied).  ``rewrite``
    makes its data in ``target`` from its data here (default: the same).  ``also``'s
    operations commit in the same multi; refused, :class:`~framework.errors.TransactionFailedError`
    is raised with ``failed_index`` counted from the first of them."""
    bucket, _, node = name.partition("/")
    entry = parse_item(bucket, node)
    if entry is None or entry.key != name:
        raise errors.ConfigurationError(f"not a queue item's name: {name!r}")
    if target.path == core.path:
        raise errors.ConfigurationError(f"an item cannot move into its own queue: {core.path}")
    item_path = f"{core.items_root}/{name}"
    claim_path = f"{core.claims_root}/{claim_name_of(name)}"
    await core.ensure_layout()
    while True:
        try:
            data, stat = await core.session.get(item_path)
        except errors.NoNodeError:
            return None

        def operations(txn: Transaction, version: int = stat.version) -> None:
            txn.create(claim_path, b"", ephemeral=True)
            txn.delete(claim_path)
            txn.delete(item_path, version=version)
            if also is not None:
                also(txn)

        try:
            moved = data if rewrite is None else rewrite(data)
            return await target.put(moved, priority=entry.priority, also=operations)
        except errors.TransactionFailedError as exc:
            if exc.failed_index == _CLAIM_CREATE:
                return None  # held by a consumer now
            if exc.failed_index == _ITEM_DELETE:
                continue  # claimed (or released) since the read, or gone: read again
            if exc.failed_index >= _OWN:
                raise errors.TransactionFailedError(exc.results[_OWN:]) from None
            raise
