"""The framework's one retry policy: capped exponential backoff with jitter.

Every place that waits before trying again (a worker slot in trouble, a failed task's
retry, a shard whose ``serve_shard`` raised, a placement step) takes its delay from a
:class:`Backoff`, so that many processes failing at once do not retry in lockstep.
Retries themselves stay with the caller: only idempotent steps are retried, never across
a session expiry (see :mod:`framework.zk.session`).
"""

from __future__ import annotations

import random

import attrs
import trio

#: No exponent above this: the cap is reached long before, and floats stay finite.
_MAX_EXPONENT = 32


@attrs.frozen
class Backoff:
    """Delays of ``base * 2 ** (attempt - 1)`` seconds, at most ``cap``, of which the
    fraction ``jitter`` is drawn at random ("equal jitter" at 0.5: the delay lies between
    half and all of the exponential value, so retries spread out and still back off)."""

    base: float = attrs.field(validator=attrs.validators.gt(0))
    cap: float = attrs.field(validator=attrs.validators.ge(0))
    jitter: float = attrs.field(default=0.5, validator=[attrs.validators.ge(0),
                                                        attrs.validators.le(1)])

    def delay(self, attempt: int) -> float:
        """Seconds to wait before retry number ``attempt`` (1 for the first retry)."""
        exponent = min(max(attempt - 1, 0), _MAX_EXPONENT)
        ceiling = min(self.base * 2.0 ** exponent, self.cap)
        return ceiling * (1.0 - self.jitter * random.random())

    async def sleep(self, attempt: int) -> None:
        """Wait :meth:`delay` ``(attempt)`` seconds (a cancellation point)."""
        await trio.sleep(self.delay(attempt))
