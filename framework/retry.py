"""The framework's one retry policy: how often to try, how long to wait, what is final.

:class:`RetryPolicy` holds the three decisions together: ``max_attempts`` (the attempt
that may not be followed by another), its :class:`Backoff` (capped exponential delays with
jitter, so that many processes failing at once do not retry in lockstep) and which errors
are permanent (:class:`~framework.errors.PermanentFailure` and its subclasses, by default:
no retry can help).  A task type's policy is the worker's with the type's options filled in
(:func:`framework.runtime.task_types.rules_of`); the queue buries an item by the same
``gives_up`` rule; a slot in trouble, a shard whose ``serve_shard`` raised and a placement
step take only a :class:`Backoff` (they retry for as long as they run).

Retries themselves stay with the caller: only idempotent steps are retried, never across
a session expiry (see :mod:`framework.zk.session`).
"""

from __future__ import annotations

import random
from typing import Any

import attrs
import trio

from framework.errors import PermanentFailure

#: No exponent above this: the cap is reached long before, and floats stay finite.
_MAX_EXPONENT = 32


@attrs.frozen
class Backoff:
    """Delays of ``base * factor ** (attempt - 1)`` seconds, at most ``cap``, of which the
    fraction ``jitter`` is drawn at random ("equal jitter" at 0.5: the delay lies between
    half and all of the exponential value, so retries spread out and still back off)."""

    base: float = attrs.field(validator=attrs.validators.gt(0))
    cap: float = attrs.field(validator=attrs.validators.ge(0))
    jitter: float = attrs.field(default=0.5, validator=[attrs.validators.ge(0),
                                                        attrs.validators.le(1)])
    factor: float = attrs.field(default=2.0, validator=attrs.validators.ge(1))

    def delay(self, attempt: int) -> float:
        """Seconds to wait before retry number ``attempt`` (1 for the first retry)."""
        exponent = min(max(attempt - 1, 0), _MAX_EXPONENT)
        ceiling = min(self.base * self.factor ** exponent, self.cap)
        return ceiling * (1.0 - self.jitter * random.random())

    async def sleep(self, attempt: int) -> None:
        """Wait :meth:`delay` ``(attempt)`` seconds (a cancellation point)."""
        await trio.sleep(self.delay(attempt))


@attrs.frozen
class RetryPolicy:
    """When a failed attempt is the last one, and how long to wait before the next.

    ``max_attempts``: attempts in all (``None``: no limit by count); ``backoff``: the delay
    before attempt ``n + 1`` is ``backoff.delay(n)``; ``permanent``: error classes no retry
    can help (an attempt failing with one is the last)."""

    max_attempts: int | None = attrs.field(default=5)
    backoff: Backoff = Backoff(0.2, 10.0)
    permanent: tuple[type[BaseException], ...] = (PermanentFailure,)

    @max_attempts.validator
    def _at_least_one(self, _attribute: Any, value: int | None) -> None:
        if value is not None and value < 1:
            raise ValueError(f"max_attempts must be at least 1 (or None), not {value!r}")

    def is_permanent(self, exc: BaseException) -> bool:
        """Whether ``exc`` is an error no retry can help."""
        return isinstance(exc, self.permanent)

    def gives_up(self, attempt: int, exc: BaseException | None = None) -> bool:
        """Whether attempt number ``attempt`` (1 for the first), failed with ``exc``, is
        the last: the attempts are used up, or the error is permanent."""
        return (self.max_attempts is not None and attempt >= self.max_attempts) \
            or (exc is not None and self.is_permanent(exc))

    async def sleep(self, attempt: int) -> None:
        """Wait before the attempt after ``attempt`` (:meth:`Backoff.sleep`)."""
        await self.backoff.sleep(attempt)
