"""Test helper: a WorkQueue consumer inside a network namespace, driven through stdin.

Usage: ``netns_consumer.py HOSTS CHROOT SESSION_TIMEOUT MODE`` (queue at ``/q``).

``work``: take items one after another.  Each delivery prints ``CLAIM <name> <attempts>``;
a redelivered item (attempts > 1) is held until the line ``go`` arrives on stdin; leaving
the block acknowledges and prints ``ACKED <name> <attempts>``.

``hold``: take one item and print ``CLAIM <name> <attempts>``; keep the body busy (reads)
until the line ``finish`` arrives, then leave the block, which sends the acknowledgement.
Prints ``ACKED <name>`` if the queue confirms it, else ``LOST <name> <error>: <reason>``.
Then, on the line ``replay``, commits the very transaction that acknowledgement is (delete
the claim node and the item *at the claimed version*, built by the queue itself) once more,
through this process's session as it is now, and prints ``REFUSED <failed op> <error>`` or
``APPLIED``: what the server does with a late ack.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
os.environ.setdefault("FRAMEWORK_LOG_LEVEL", "error")

import trio

from framework import ClaimLost, Session, TransactionFailedError, WorkQueue
from framework.primitives.queue.items import Claim


def say(*words: object) -> None:
    print(*words, flush=True)


class Commands:
    """Lines read from stdin, one at a time."""

    def __init__(self) -> None:
        self.stream = trio.lowlevel.FdStream(os.dup(sys.stdin.fileno()))
        self.buffer = b""

    async def expect(self, word: str) -> None:
        while b"\n" not in self.buffer:
            chunk = await self.stream.receive_some()
            if not chunk:
                raise SystemExit(f"stdin closed while waiting for {word!r}")
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        if line.decode().strip() != word:
            raise SystemExit(f"expected {word!r} on stdin, got {line!r}")


class RecordingQueue(WorkQueue):
    """A WorkQueue that keeps its claims (its claimer's, as they are made), so the
    acknowledgement can be sent again."""

    claims: dict[str, Claim]

    def __init__(self, session: Session, path: str) -> None:
        super().__init__(session, path)
        claim = self._claimer.claim

        async def recorded() -> Claim:
            made = await claim()
            self.claims[made.entry.key] = made
            return made

        self._claimer.claim = recorded  # type: ignore[method-assign]


async def work(queue: WorkQueue, commands: Commands) -> None:
    while True:
        async with queue.take() as item:
            say("CLAIM", item.name, item.attempts)
            if item.attempts > 1:
                await commands.expect("go")
        say("ACKED", item.name, item.attempts)


async def hold(session: Session, queue: RecordingQueue, commands: Commands) -> None:
    name = ""

    async def reader() -> None:
        while True:
            await session.exists("/q")
            await trio.sleep(0.1)

    try:
        async with queue.take() as item:
            name = item.name
            say("CLAIM", item.name, item.attempts)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(reader)
                await commands.expect("finish")
                nursery.cancel_scope.cancel()
        say("ACKED", name)
    except ClaimLost as exc:
        say("LOST", name, f"{type(exc).__name__}: {exc}")
    await commands.expect("replay")
    claim = queue.claims[name]
    try:
        await queue._acker.ack_operations(claim, None, queue.session.transaction()).commit()
    except TransactionFailedError as exc:
        say("REFUSED", exc.failed_index, type(exc.cause).__name__)
    else:
        say("APPLIED")
    await trio.sleep_forever()


async def main(hosts: str, chroot: str, timeout: str, mode: str) -> None:
    commands = Commands()
    async with Session(hosts, chroot=chroot, session_timeout=float(timeout)) as session:
        queue = RecordingQueue(session, "/q")
        queue.claims = {}
        if mode == "work":
            await work(queue, commands)
        else:
            await hold(session, queue, commands)


if __name__ == "__main__":
    trio.run(main, *sys.argv[1:5])
