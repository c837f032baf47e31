"""What the halves of :class:`~framework.primitives.queue.WorkQueue` share: the attributes
its ``__init__`` sets, declared once for :mod:`.producer`, :mod:`.claims`, :mod:`.acks` and
:mod:`.consumer`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Awaitable, Callable

import trio

from framework.retry import RetryPolicy
from framework.zk import Session

if TYPE_CHECKING:
    from framework.primitives.queue.acks import Ending, _Ack
    from framework.primitives.queue.claims import _Round, _Ticket
    from framework.primitives.queue.items import Claim, ClaimExtras, Finisher, QueueItem
    from framework.primitives.queue.lease import LeaseBreaker, Renewal
    from framework.primitives.queue.line import WaitingLine
    from framework.primitives.queue.view import Entry, QueueView
    from framework.zk import Transaction


class QueueState:
    """The queue's paths, settings and in-process state (see ``WorkQueue.__init__``)."""

    session: Session
    path: str
    items_root: str
    claims_root: str
    puts_root: str
    dead_letter: str
    bucket_size: int
    max_item_bytes: int
    max_attempts: int | None
    _retry: RetryPolicy
    lease: float | None
    fence: tuple[str, int] | None
    claim_with: Callable[[QueueItem], ClaimExtras | None] | None
    accept: Callable[[QueueItem], bool] | None
    _owner: str
    _setup: Callable[[], Awaitable[None]]
    # producer: per priority lane, the bucket it puts into and the highest sequence number
    # known taken in it
    _bucket_of: dict[int, str]
    _hint_of: dict[int, int]
    # consumer: claim rounds, idle line, leases, acks
    _view: QueueView | None
    _claiming: set[str]
    _contended: int
    _foreign: set[str]
    _foreign_bound: int
    _misses: int
    _breaker: LeaseBreaker
    _renewals: dict[str, Renewal]
    _finishers: dict[str, Finisher]
    _tickets: list[_Ticket]
    _round: _Round | None
    _line: WaitingLine
    _turn: tuple[trio.Event, list[bool]] | None
    _acks: list[_Ack]
    _committing: trio.Event | None

    if TYPE_CHECKING:
        # what one half calls of another (for the type checker; each is defined once, in
        # the half named)

        # consumer
        def _get_view(self) -> QueueView: ...
        def _renewing(self) -> dict[str, float]: ...
        def _forget_renewal(self, key: str, renewal: Renewal | None) -> None: ...

        # acks
        async def _finish(self, claim: Claim, build: Callable[[], Transaction], *,
                          sent: bool = False, refused: Any = None) -> Ending: ...

        # claims
        def _restore_transaction(self, claim: Claim) -> Transaction: ...
        def _dead_path(self, entry: Entry, attempts: int) -> str: ...
