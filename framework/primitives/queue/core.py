"""What every part of a :class:`~framework.primitives.queue.WorkQueue` shares: its session,
its paths and its settings, fixed when the queue object is made (validated there), and the
one-time creation of its parents.

The parts - :class:`~.producer.Producer`, :class:`~.claims.Claimer`, :class:`~.acks.Acker`,
:class:`~.lease.Renewals`, :class:`~.consumer.Consumer` - each keep their own state and get
this core, and from each other only what they call (see :class:`WorkQueue`'s module doc).
"""

from __future__ import annotations

from typing import Callable

import attrs

from framework.primitives.queue.items import ClaimExtras, QueueItem
from framework.retry import RetryPolicy
from framework.zk import Session, gather


@attrs.define(eq=False)
class _Layout:
    """Whether this queue object made its parents already (once per object)."""

    made: bool = False


@attrs.frozen(eq=False)
class QueueCore:
    """A queue's session, paths and settings (see ``WorkQueue``'s arguments).

    ``items_root``, ``claims_root``, ``puts_root``: ``<path>/items``, ``/claims``,
    ``/puts``; ``waiting``: the root of this object's line of idle consumers; ``owner``:
    ``host:pid``, written in claims; ``retry``: the give-up rule (attempts used up, or a
    permanent error), the same as a task's."""

    session: Session
    path: str
    items_root: str
    claims_root: str
    puts_root: str
    waiting: str
    dead_letter: str
    bucket_size: int
    max_item_bytes: int
    max_attempts: int | None
    retry: RetryPolicy
    lease: float | None
    fence: tuple[str, int] | None
    claim_with: Callable[[QueueItem], ClaimExtras | None] | None
    accept: Callable[[QueueItem], bool] | None
    owner: str
    _layout: _Layout = attrs.field(factory=_Layout)

    async def ensure_layout(self) -> None:
        """Make ``items/``, ``claims/`` and the line's root if this object has not yet
        (pipelined; raises the session's errors)."""
        if not self._layout.made:
            await gather(
                lambda: self.session.ensure_path(self.items_root),
                lambda: self.session.ensure_path(self.claims_root),
                lambda: self.session.ensure_path(self.waiting),
            )
            self._layout.made = True
