"""The in-memory view of a partition's frontier that fetch slots take from.

Per host a FIFO of pending URLs; a host is handed to at most one slot at a time (so requests
to a host never overlap, and the fetcher's politeness delay spaces them), and hosts take
turns.  It is rebuilt from the store at every takeover: the store is the truth.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

import trio

from examples.fetch_service.scale.store import Link

__all__ = ["HostQueues"]


class HostQueues:
    """Pending ``(url, host, depth)`` links by host (see the module doc).  Not thread-safe:
    use it from the trio thread."""

    def __init__(self, links: Iterable[Link] = ()) -> None:
        self._urls: dict[str, deque[tuple[str, int]]] = {}
        self._ready: deque[str] = deque()
        self._busy: set[str] = set()
        self._changed = trio.Event()
        self.queued = 0
        self.add(links)

    def add(self, links: Iterable[Link]) -> None:
        """Queue ``links`` behind their hosts' earlier ones (no de-duplication: the store
        hands over only new links)."""
        for url, host, depth in links:
            queue = self._urls.get(host)
            if queue is None:
                queue = self._urls[host] = deque()
            if not queue and host not in self._busy:
                self._ready.append(host)
            queue.append((url, depth))
            self.queued += 1
        self._wake()

    async def take(self) -> tuple[str, str, int]:
        """The next ``(url, host, depth)``; its host is busy until :meth:`release`."""
        while not self._ready:
            changed = self._changed
            await changed.wait()
        host = self._ready.popleft()
        url, depth = self._urls[host].popleft()
        self.queued -= 1
        self._busy.add(host)
        return url, host, depth

    def release(self, host: str) -> None:
        """The fetch of ``host``'s URL taken last is over: the host may be taken again."""
        self._busy.discard(host)
        if self._urls.get(host):
            self._ready.append(host)
        self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = trio.Event()
