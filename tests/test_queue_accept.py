"""Consumers that take only some items (``WorkQueue(accept=..., line=...)``): an item a
consumer does not accept is never claimed by it (no delivery counted), passed over after
one read, and waits for a consumer that accepts it; each kind of consumer idles in its own
line (against the real ZooKeeper)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import trio

from framework import ConfigurationError, Session, WorkQueue
from framework.errors import NoNodeError
from framework.primitives.queue import QueueItem


def starting(prefix: bytes) -> Callable[[QueueItem], bool]:
    def accept(item: QueueItem) -> bool:
        return item.data.startswith(prefix)
    return accept


async def _line(session: Session, root: str, length: int) -> None:
    """Until ``length`` consumers wait in the line at ``root`` (a watch, no polling)."""
    while True:
        fired = trio.Event()
        try:
            if len(await session.children(root, watch=session.waker(fired))) == length:
                return
        except NoNodeError:
            if await session.exists(root, watch=session.waker(fired)) is not None:
                continue
        await fired.wait()


async def test_a_consumer_claims_only_the_items_it_accepts(session: Session) -> None:
    producer = WorkQueue(session, "/q")
    bees = WorkQueue(session, "/q", accept=starting(b"b"), line="bees")
    ants = WorkQueue(session, "/q", accept=starting(b"a"), line="ants")
    for data in (b"a1", b"b1", b"a2"):
        await producer.put(data)
    with trio.fail_after(30):
        async with bees.take() as item:
            assert item.data == b"b1" and item.attempts == 1
        async with trio.open_nursery() as nursery:
            async def idle() -> None:
                async with bees.take():
                    raise AssertionError("the bees' consumer took an item it refuses")

            nursery.start_soon(idle)
            await _line(session, "/q/waiting/bees", 1)  # nothing left it takes
            names = await producer.item_names()
            versions = [(await session.exists(f"/q/items/{n}")).version  # type: ignore[union-attr]
                        for n in names]
            taken = []
            for _ in range(2):
                async with ants.take() as item:
                    taken.append((item.data, item.attempts))
            nursery.cancel_scope.cancel()
    assert len(names) == 2 and versions == [0, 0]  # passed over, never claimed
    assert taken == [(b"a1", 1), (b"a2", 1)]
    assert len(bees._claimer._foreign) == 2  # each read once, remembered


@pytest.mark.parametrize("line", ["", "a/b", "w-1"])
async def test_a_bad_line_name_is_refused(session: Session, line: str) -> None:
    with pytest.raises(ConfigurationError, match="line must be a name"):
        WorkQueue(session, "/q", line=line)
