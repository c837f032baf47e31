"""A bound on requests in flight that costs nothing on the fast path."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import trio


class InFlightLimit:
    """At most ``limit`` requests outstanding; extra callers park until a slot frees.

    Unlike ``trio.CapacityLimiter`` it does not yield when a slot is free, so a request costs
    one scheduling round-trip (its completion) rather than three.
    """

    def __init__(self, limit: int):
        if limit < 1:
            raise ValueError("max_in_flight must be at least 1")
        self.limit = limit
        self.in_use = 0
        self._lot = trio.lowlevel.ParkingLot()

    async def acquire(self) -> None:
        await trio.lowlevel.checkpoint_if_cancelled()
        while self.in_use >= self.limit:
            await self._lot.park()
        self.in_use += 1

    def release(self) -> None:
        self.in_use -= 1
        self._lot.unpark()

    @contextmanager
    def held(self) -> Iterator[None]:
        try:
            yield
        finally:
            self.release()
