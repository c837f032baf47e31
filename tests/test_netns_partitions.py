"""Real partitions (issue #10): the old owner lives in its own network namespace.

ZooKeeper runs in the root namespace; owner A is a separate process inside a namespace whose
link is then cut like a pulled cable (its veth goes down: silent, connections stay
open).  A's body is busy (it keeps sending reads into the partition).  B, in the root
namespace, takes over once the server expires A's session.  A prints the monotonic time at
which its body ended, B records when its body started (one clock for every namespace of the
machine): A's body must end first.  Cases: election, the runtime master, a queue claim.

Needs root and iproute2 (``make test-netns`` installs it); skipped otherwise, saying why.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from framework import Election, Session, WorkQueue, ZooKeeperEnsemble
from framework.runtime import Master, MasterContext
from framework.testing.netns import Host, cleanup_stale, netns_available

_UNAVAILABLE = netns_available()
pytestmark = [
    pytest.mark.netns,
    pytest.mark.skipif(_UNAVAILABLE is not None, reason=str(_UNAVAILABLE)),
]

HELPER = Path(__file__).parent / "helpers" / "netns_owner.py"
ROOT = Path(__file__).parent.parent
TIMEOUT = 3.0


@pytest.fixture(scope="module")
def server() -> Iterator[ZooKeeperEnsemble]:
    with ZooKeeperEnsemble(1, client_address="0.0.0.0") as zk:
        yield zk


@pytest.fixture
def host() -> Iterator[Host]:
    cleanup_stale()
    h = Host(7).create()
    try:
        yield h
    finally:
        h.destroy()


async def _lines(stream: trio.abc.ReceiveStream) -> dict[str, int]:
    """Read ``WORD value`` lines until the stream ends (the process was killed)."""
    seen: dict[str, int] = {}
    buffer = b""
    async for chunk in stream:
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            word, _, value = line.decode().partition(" ")
            seen[word] = int(value) if value.isdigit() else 0
    return seen


async def _take_over(kind: str, session: Session, started: trio.Event) -> int:
    """B's turn: return the monotonic time its body started."""
    box: list[int] = []

    async def body() -> None:
        box.append(time.clock_gettime_ns(time.CLOCK_MONOTONIC))
        started.set()
        await trio.sleep_forever()

    async def own() -> None:
        if kind == "election":
            async with Election(session, "/election").leadership():
                await body()
        elif kind == "claim":
            async with WorkQueue(session, "/queue").take():
                await body()
        else:
            class Leader(Master):
                async def lead(self, ctx: MasterContext) -> None:
                    await body()

            await Leader("netns", name="outside").run(session)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(own)
        await started.wait()
        nursery.cancel_scope.cancel()
    return box[0]


@pytest.mark.parametrize("kind", ["election", "master", "claim"])
async def test_a_partitioned_busy_owner_ends_before_the_next_one_starts(
    kind: str, server: ZooKeeperEnsemble, host: Host
) -> None:
    port = server.members[0].client_port
    chroot = f"/netns-{kind}-{os.getpid()}"
    async with Session(server.connect_string, chroot=chroot,
                       session_timeout=TIMEOUT) as b:
        if kind == "claim":
            await WorkQueue(b, "/queue").put(b"the one item")
        process = await trio.lowlevel.open_process(
            host.command(sys.executable, str(HELPER), f"{host.gateway}:{port}", chroot, kind,
                         str(TIMEOUT)),
            stdout=subprocess.PIPE, cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT), "FRAMEWORK_LOG_LEVEL": "error"},
        )
        assert process.stdout is not None
        try:
            with trio.fail_after(60):
                first = await process.stdout.receive_some()
                assert first.startswith(b"START"), first
                host.partition()
                b_started = await _take_over(kind, b, trio.Event())
                host.heal()
                process.kill()
                rest = await _lines(process.stdout)
        finally:
            host.heal()
            if process.returncode is None:
                process.kill()
            await process.wait()
    assert "END" in rest, f"A's body never ended: {rest}"
    margin = (b_started - rest["END"]) / 1e9
    print(f"{kind}: A's body ended {margin:.2f} s before B's started")
    assert rest["END"] < b_started
