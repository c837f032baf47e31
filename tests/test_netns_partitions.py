"""Real partitions (issue #10): ZooKeeper and the application on separate hosts.

Every ZooKeeper member and every application process lives in a network namespace of its
own, on one bridge (:mod:`framework.testing.netns`); faults are iptables ``DROP`` rules in
the bridge, silent like a real partition.  The test runner (root namespace) keeps a
connected *recorder* session.  Cases (see ``docs/netns.md``):

* overlap: owner A (a process on host ``a``) holds an election term, a lock, a queue claim
  or the runtime master, with an idle or a busy body; B (a process on host ``b``) waits for
  the same thing; host ``a`` is isolated.  Records in ZooKeeper give the server's order: A's
  body start (written by A), A's body end (written by the recorder the moment A's process
  says so: A cannot reach the server), B's body start (written by B as its first action).
  ``a-end`` must come before ``b-start``.  The bodies and owners are those of
  ``tests/test_partition_ownership.py`` (the loopback-proxy version of these cases).  Also
  one-way partitions (only A's packets to ZooKeeper dropped, or only the replies);
* queue: consumers on three hosts; the one on ``a`` is cut off mid-claim; its item is
  delivered again to another host, nothing is lost or acknowledged twice, and A's ack
  (sent into the partition, and committed again after the heal) is refused by the server;
* ZooKeeper: the leader member is cut off from the two other members; they elect a leader
  in a new epoch, and a client leading an election and writing keeps its term and session.

Needs root, iproute2 and iptables (``make test-netns``); skipped otherwise, saying why.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import TypeVar

import pytest
import trio

from framework import Session, WorkQueue, ZooKeeperEnsemble
from framework.runtime import App
from framework.testing import Child
from framework.testing import spawn as harness_spawn
from framework.testing.netns import (
    Host,
    NetnsError,
    VirtualNetwork,
    cleanup_stale,
    delay_available,
    netns_available,
)
from framework.zk import wait_exists, wait_gone
from framework.zkserver import Placement
from tests.test_partition_ownership import wait_until_b_waits

_UNAVAILABLE = netns_available()
pytestmark = [
    pytest.mark.netns,
    pytest.mark.skipif(_UNAVAILABLE is not None, reason=f"netns: {_UNAVAILABLE}"),
]

ROOT = Path(__file__).parent.parent
HELPERS = Path(__file__).parent / "helpers"
HOSTS = ["zk1", "zk2", "zk3", "a", "b", "c"]
TIMEOUT = 3.0  # the owners' session timeout: the trust deadline is 2 s after the last reply
T = TypeVar("T")


@pytest.fixture(scope="module")
def net() -> Iterator[VirtualNetwork]:
    cleanup_stale()
    with VirtualNetwork.create(HOSTS) as network:
        yield network


@pytest.fixture(scope="module")
def zk(net: VirtualNetwork) -> Iterator[ZooKeeperEnsemble]:
    """Three members, each on its own host."""
    places = [Placement(net[h].address, net[h].netns) for h in ("zk1", "zk2", "zk3")]
    with ZooKeeperEnsemble(3, placement=places) as ensemble:
        yield ensemble


@pytest.fixture
def network(net: VirtualNetwork) -> Iterator[VirtualNetwork]:
    """The module's network, whole again after the test (whatever happened in it)."""
    try:
        yield net
    finally:
        net.heal()


# ------------------------------------------------------------------------------ processes


class Board:
    """Output lines of the helper processes of one test, and one event for any new line."""

    def __init__(self) -> None:
        self.changed = trio.Event()
        self.procs: list[Proc] = []

    def poke(self) -> None:
        self.changed.set()
        self.changed = trio.Event()

    async def until(self, found: Callable[[], T | None]) -> T:
        """Wait until ``found()`` returns something; fail if a helper process exits."""
        while True:
            changed = self.changed
            result = found()
            if result is not None:
                return result
            for proc in self.procs:
                if proc.ended:
                    raise AssertionError(f"helper on {proc.name} exited:\n{proc.stderr_tail()}")
            await changed.wait()


class Proc:
    """A helper process on one host: its output lines, and a line-oriented stdin."""

    def __init__(self, name: str, process: Child, board: Board, errors: Path) -> None:
        self.name, self.process, self.board, self.errors = name, process, board, errors
        self.lines: list[list[str]] = []
        self.cursor = 0
        self.ended = False

    async def pump(self) -> None:
        assert self.process.stdout is not None
        buffer = b""
        async for chunk in self.process.stdout:
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                self.lines.append(line.decode().split())
                self.board.poke()
        self.ended = True
        self.board.poke()

    def find(self, word: str, *args: str) -> list[str] | None:
        """The first line ``word *args ...`` printed so far (its fields after ``word``)."""
        for line in self.lines:
            if line[:1] == [word] and line[1:1 + len(args)] == list(args):
                return line[1:]
        return None

    async def expect(self, word: str) -> list[str]:
        """The next line (after the last one expected) starting with ``word``."""

        def next_line() -> list[str] | None:
            while self.cursor < len(self.lines):
                line = self.lines[self.cursor]
                self.cursor += 1
                if line[:1] == [word]:
                    return line[1:]
            return None

        return await self.board.until(next_line)

    async def send(self, line: str) -> None:
        assert self.process.stdin is not None
        await self.process.stdin.send_all(line.encode() + b"\n")

    def stderr_tail(self) -> str:
        return "\n".join(self.errors.read_text(errors="replace").splitlines()[-15:])


@asynccontextmanager
async def spawn(board: Board, host: Host, script: str, *args: object) -> AsyncIterator[Proc]:
    """Run ``tests/helpers/<script>`` inside ``host`` (the framework's process harness: it
    dies with the test run); kill it on the way out."""
    logs = Path(tempfile.mkdtemp(prefix=f"netns-{host.name}-"))
    try:
        async with harness_spawn(
            host.command(sys.executable, str(HELPERS / script), *map(str, args)),
            name=script, log_dir=logs, pipe_stdin=True, pipe_stdout=True, cwd=ROOT,
            env={"PYTHONPATH": str(ROOT), "FRAMEWORK_LOG_LEVEL": "error"},
        ) as child:
            proc = Proc(host.name, child, board, logs / f"{script}.log")
            board.procs.append(proc)
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(proc.pump)
                    try:
                        yield proc
                    finally:
                        nursery.cancel_scope.cancel()
            finally:
                board.procs.remove(proc)
    finally:
        shutil.rmtree(logs, ignore_errors=True)


def now_ns() -> int:
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


async def records(session: Session) -> list[str]:
    """The record names under ``/records`` in the server's order (sequence numbers)."""
    kids = sorted(await session.children("/records"), key=lambda n: n.rsplit("-", 1)[1])
    return [n.rsplit("-", 1)[0] for n in kids]


# ------------------------------------------------------------------------------ the network


def test_partitions_are_silent_and_cleanup_is_complete(network: VirtualNetwork) -> None:
    """A partitioned connection attempt times out (no RST, no ICMP error); an isolated host
    is cut off from the root namespace too; heal restores both; a network whose creator
    died is removed by cleanup_stale, and destroy leaves nothing behind."""
    probe = ("import socket,sys\n"
             "s=socket.socket(); s.settimeout(0.3)\n"
             "try: s.connect((sys.argv[1], 9)); print('connected')\n"
             "except OSError as e: print(type(e).__name__)\n")
    a, b = network["a"], network["b"]

    def attempt(host: Host | None, target: Host) -> str:
        argv = [sys.executable, "-c", probe, target.address]
        done = host.run(*argv) if host else subprocess.run(argv, capture_output=True, text=True)
        return done.stdout.strip()

    assert attempt(a, b) == "ConnectionRefusedError"  # reachable: nothing listens on port 9
    network.partition("a", "b")
    assert attempt(a, b) == "TimeoutError"  # dropped silently
    assert attempt(b, a) == "TimeoutError"
    assert attempt(network["c"], b) == "ConnectionRefusedError"  # only the pair is cut
    network.heal()
    network.isolate("b")
    assert attempt(None, b) == "TimeoutError"  # from the root namespace too
    assert attempt(network["c"], b) == "TimeoutError"
    network.heal()
    assert attempt(a, b) == "ConnectionRefusedError"

    # a network left by a process killed with SIGKILL, then cleaned up as stale
    script = ("import os, sys\n"
              "from framework.testing.netns import VirtualNetwork\n"
              "net = VirtualNetwork.create(['x', 'y'], prefix='fwstale')\n"
              "print(net.bridge_netns, net.root_link, flush=True)\n"
              "os.kill(os.getpid(), 9)\n")
    left = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    bridge, root_link = left.stdout.split()
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert bridge in listed
    removed = cleanup_stale("fwstale")
    assert sorted(removed) == sorted([bridge, f"{bridge}-x", f"{bridge}-y"])
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert bridge not in listed and f"{root_link}@" not in links

    with VirtualNetwork.create(["solo"]) as solo:
        names = [solo.bridge_netns, solo["solo"].netns]
        assert solo.root_link is not None
        link = solo.root_link
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert not any(n in listed for n in names) and f"{link}@" not in links
    with pytest.raises(NetnsError, match="bad host name"):
        VirtualNetwork.create(["Not-OK"])


@pytest.mark.skipif(delay_available() is not None, reason=f"delay: {delay_available()}")
def test_delay_is_a_netem_qdisc_until_heal(network: VirtualNetwork) -> None:
    network.delay("c", 50)
    assert "netem" in network["c"].run("tc", "qdisc", "show", "dev", "eth0").stdout
    network.heal()
    assert "netem" not in network["c"].run("tc", "qdisc", "show", "dev", "eth0").stdout


# ------------------------------------------------------------------------------ overlap

ZK_HOSTS = ("zk1", "zk2", "zk3")


def cut_off(network: VirtualNetwork, fault: str) -> None:
    """Cut host ``a`` off from ZooKeeper: ``isolate`` (everything, both ways), ``outbound``
    (a's packets to the members dropped, theirs still reach it) or ``inbound`` (the members'
    packets to a dropped: a's requests still reach the server, no reply comes back)."""
    if fault == "isolate":
        network.isolate("a")
    for member in ZK_HOSTS if fault != "isolate" else ():
        if fault == "outbound":
            network.partition("a", member, both_ways=False)
        else:
            network.partition(member, "a", both_ways=False)


async def overlap(kind: str, load: str, fault: str, network: VirtualNetwork,
                  zk: ZooKeeperEnsemble, chroot: str) -> None:
    board = Board()
    hosts = zk.connect_string
    async with Session(hosts, chroot=chroot, session_timeout=TIMEOUT) as recorder:
        await recorder.ensure_path("/records")
        if kind == "claim":
            await WorkQueue(recorder, "/queue").put(b"the one item")
        with trio.fail_after(40):
            async with spawn(board, network["a"], "netns_owner.py", hosts, chroot, kind, load,
                             "a", TIMEOUT) as a:
                await a.expect("START")
                async with spawn(board, network["b"], "netns_owner.py", hosts, chroot, kind,
                                 load, "b", TIMEOUT) as b:
                    await wait_until_b_waits(kind, recorder)
                    cut = now_ns()
                    cut_off(network, fault)
                    [a_end] = await a.expect("END")
                    await recorder.create("/records/a-end-", sequence=True)
                    [b_start] = await b.expect("START")
        order = await records(recorder)
    assert int(a_end) > cut, "A's body ended before the partition: nothing was tested"
    assert order[:3] == ["a-start", "a-end", "b-start"], order
    margin = (int(b_start) - int(a_end)) / 1e9
    print(f"\n{kind}/{load}/{fault}: A's body ended {margin:.2f} s before B's started "
          f"(A's end {(int(a_end) - cut) / 1e9:.2f} s after the cut)")


@pytest.mark.parametrize("load", ["idle", "busy"])
@pytest.mark.parametrize("kind", ["election", "master", "lock", "claim"])
async def test_partitioned_owner_process_ends_before_the_next_one_starts(
    kind: str, load: str, network: VirtualNetwork, zk: ZooKeeperEnsemble, chroot: str
) -> None:
    await overlap(kind, load, "isolate", network, zk, chroot)


@pytest.mark.parametrize("fault", ["outbound", "inbound"])
async def test_one_way_partition_ends_the_owner_before_the_next_one_starts(
    fault: str, network: VirtualNetwork, zk: ZooKeeperEnsemble, chroot: str
) -> None:
    """Half of the link cut (a busy election term): with only the replies lost, the
    server still hears A until A drops its connection at its trust deadline."""
    await overlap("election", "busy", fault, network, zk, chroot)


# ------------------------------------------------------------------------------ queue


async def test_consumer_cut_off_mid_claim(
    network: VirtualNetwork, zk: ZooKeeperEnsemble, chroot: str
) -> None:
    """Consumers on hosts a, b and c.  The one on ``a`` holds an item when ``a`` is isolated,
    finishes its block, and its ack goes into the partition.  Its session expires, the item
    is delivered again on ``b`` or ``c`` (attempt 2) and acknowledged there once; every item
    is acknowledged exactly once, none lost.  A's ack is never applied: A is told so
    (ClaimLost), and the same ack transaction committed again after the heal, while the
    other host holds the item, is refused by the server (the item is past A's version)."""
    board = Board()
    hosts = zk.connect_string
    count = 30
    async with Session(hosts, chroot=chroot, session_timeout=TIMEOUT) as recorder:
        queue = WorkQueue(recorder, "/q")
        names = await queue.put_many([b"%d" % i for i in range(count)])
        with trio.fail_after(45):
            async with spawn(board, network["a"], "netns_consumer.py", hosts, chroot, TIMEOUT,
                             "hold") as c1:
                held, attempts = await c1.expect("CLAIM")
                assert attempts == "1"
                async with (
                    spawn(board, network["b"], "netns_consumer.py", hosts, chroot, TIMEOUT,
                          "work") as c2,
                    spawn(board, network["c"], "netns_consumer.py", hosts, chroot, TIMEOUT,
                          "work") as c3,
                ):
                    cut = now_ns()
                    network.isolate("a")
                    await c1.send("finish")  # A's block ends: its ack is sent, cut off
                    holder = await board.until(
                        lambda: next((c for c in (c2, c3) if c.find("CLAIM", held, "2")), None)
                    )
                    redelivered = (now_ns() - cut) / 1e9
                    network.heal()
                    outcome = await c1.expect("LOST")
                    await c1.send("replay")
                    refused = await c1.expect("REFUSED")
                    assert await recorder.exists(f"/q/items/{held}") is not None
                    await holder.send("go")

                    def acked() -> list[list[str]] | None:
                        lines = [ln for c in (c2, c3) for ln in c.lines if ln[0] == "ACKED"]
                        return lines if {ln[1] for ln in lines} >= set(names) else None

                    done = await board.until(acked)
                    assert c1.find("ACKED") is None
        assert await queue.size() == 0
        assert await recorder.children("/q/claims") == []
        assert await queue.dead_letters() == []
    assert outcome[0] == held and outcome[1] == "ClaimLost:", outcome
    assert refused == ["1", "BadVersionError"], refused  # op 1: delete the item at A's version
    times = Counter(name for _, name, _ in done)
    assert set(times) == set(names) and set(times.values()) == {1}, times
    attempts_of = {name: int(n) for _, name, n in done}
    assert attempts_of[held] == 2
    assert all(n == 1 for name, n in attempts_of.items() if name != held)
    print(f"\nqueue: {held} redelivered to {holder.name} {redelivered:.2f} s after the cut; "
          f"A's ack: {' '.join(outcome[1:])}; replayed: refused at op {refused[0]} "
          f"({refused[1]})")


# ------------------------------------------------------------------------------ ZooKeeper


async def test_zookeeper_leader_cut_off_from_its_peers(
    network: VirtualNetwork, zk: ZooKeeperEnsemble, chroot: str
) -> None:
    """The leader member is partitioned from the two others (clients can still reach every
    member): the two elect a new leader (a new epoch in the zxids), and a client on host
    ``a`` that leads an election and keeps writing under its term carries on in the same
    session, its term never interrupted.  After the heal the old leader rejoins: a session
    connected to it alone reads the last record written in the new epoch."""
    board = Board()
    old = zk.leader()
    assert old is not None
    peers = [m.sid for m in zk.members if m.sid != old]
    async with spawn(board, network["a"], "netns_writer.py", zk.connect_string, chroot,
                     10.0) as writer:
        with trio.fail_after(40):
            zxid, session_id = await writer.expect("WROTE")
            epoch = int(zxid) >> 32
            cut = now_ns()
            for peer in peers:
                network.partition(f"zk{old}", f"zk{peer}")
            await board.until(
                lambda: next((ln for ln in writer.lines
                              if ln[0] == "WROTE" and int(ln[1]) >> 32 > epoch), None)
            )
            first_new = (now_ns() - cut) / 1e9

            def new_epoch_writes() -> list[list[str]] | None:
                lines = [ln for ln in writer.lines if ln[0] == "WROTE" and int(ln[1]) >> 32 > epoch]
                return lines if len(lines) >= 5 else None

            later = await board.until(new_epoch_writes)
            modes = zk.modes()
            network.heal()
            async with Session(zk.member(old).address, chroot=chroot) as rejoined:
                await rejoined.sync("/w")
                assert len(await rejoined.children("/w")) >= len(later) + 1
    assert any(modes[p] == "leader" for p in peers), modes
    assert {ln[0] for ln in writer.lines} <= {"WROTE", "RETRY"}, writer.lines  # no END/LOST
    assert {ln[2] for ln in writer.lines if ln[0] == "WROTE"} == {session_id}
    print(f"\nzookeeper: member {old} cut off; new leader "
          f"{next(p for p in peers if modes[p] == 'leader')}; first write of the new epoch "
          f"{first_new:.2f} s after the cut; "
          f"{sum(ln[0] == 'WROTE' for ln in writer.lines)} writes in one session and one term "
          f"({sum(ln[0] == 'RETRY' for ln in writer.lines)} replies lost)")


async def test_sync_makes_a_lagging_follower_catch_up_before_the_read(
    network: VirtualNetwork, zk: ZooKeeperEnsemble, chroot: str
) -> None:
    """``Session.sync`` is a barrier through the leader.  The leader's packets to one
    follower are dropped (the follower's own packets still reach the leader, and the cut is
    shorter than syncLimit x tickTime = 2 s, so it stays a follower): a write commits on the
    leader and the other follower, and a session connected to the lagging follower alone
    still reads the old value - deterministically, the follower never saw the proposal.
    ``sync`` from that session does not return until the heal lets the follower catch up;
    the read after it sees the write."""
    leader = zk.leader()
    assert leader is not None
    lagging = next(m.sid for m in zk.members if m.sid != leader)
    async with Session(zk.member(leader).address, chroot=chroot) as writer, \
            Session(zk.member(lagging).address, chroot=chroot) as reader:
        await writer.create("/synced", b"old")
        await reader.sync("/synced")
        assert (await reader.get("/synced"))[0] == b"old"
        network.partition(f"zk{leader}", f"zk{lagging}", both_ways=False)
        await writer.set("/synced", b"new")
        assert (await reader.get("/synced"))[0] == b"old", "the follower was not lagging"
        synced = trio.Event()
        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:

                async def sync_then_mark() -> None:
                    await reader.sync("/synced")
                    synced.set()

                nursery.start_soon(sync_then_mark)
                with trio.move_on_after(0.8):
                    await synced.wait()
                assert not synced.is_set(), "sync returned while the follower was cut off"
                network.heal()
                await synced.wait()
        assert (await reader.get("/synced"))[0] == b"new"
        assert zk.modes()[lagging] == "follower"


# ------------------------------------------------------------------------------ follower

FOLLOWER_MODES = ("leader", "lock", "claim", "shard")


async def test_owners_on_a_follower_cut_off_from_the_leader_end_before_the_majority_expires(
    network: VirtualNetwork, zk: ZooKeeperEnsemble, chroot: str
) -> None:
    """Owners connected to one follower only (an election term, a lock, a queue claim, a
    served shard; each its own process on host ``a``).  The follower is cut off from the
    leader and the other follower, but still reaches the owners and answers their pings and
    reads until its sync limit (syncLimit x tickTime = 2 s) runs out.  The majority expires
    the owners' sessions after their 3 s timeout and deletes their nodes.  A reply from a
    follower proves nothing about the leader: every owner's body must stop before the
    majority deletes its node (the recorder, on the majority's side, sees it go)."""
    board = Board()
    leader = zk.leader()
    assert leader is not None
    follower, other = (m.sid for m in zk.members if m.sid != leader)
    majority = ",".join(zk.member(sid).address for sid in (leader, other))
    on_follower = zk.member(follower).address
    stopped: dict[str, float] = {}
    deleted: dict[str, float] = {}
    async with Session(majority, chroot=chroot, session_timeout=TIMEOUT) as recorder:
        await WorkQueue(recorder, "/q").put(b"the one item")
        with trio.fail_after(60):
            async with AsyncExitStack() as stack:
                owners = {}
                for mode in FOLLOWER_MODES:
                    owners[mode] = await stack.enter_async_context(spawn(
                        board, network["a"], "pause_owner.py", on_follower, chroot, mode,
                        "--timeout", TIMEOUT, "--marker", f"/alive/{mode}"))
                assignments = App("pause").assignment_dir("w")
                await wait_exists(recorder, assignments)
                await recorder.create(f"{assignments}/s0", b"")
                for owner in owners.values():
                    await owner.expect("EFFECT")
                await recorder.sync("/")
                for mode in FOLLOWER_MODES:
                    assert await recorder.exists(f"/alive/{mode}") is not None
                cut = time.monotonic()
                network.partition(f"zk{follower}", f"zk{leader}")
                network.partition(f"zk{follower}", f"zk{other}")

                async def watch(mode: str) -> None:
                    [at] = await owners[mode].expect("STOPPED")
                    stopped[mode] = float(at)

                async def gone(mode: str) -> None:
                    await wait_gone(recorder, f"/alive/{mode}")
                    deleted[mode] = time.monotonic()

                async with trio.open_nursery() as nursery:
                    for mode in FOLLOWER_MODES:
                        nursery.start_soon(watch, mode)
                        nursery.start_soon(gone, mode)
    report = ", ".join(f"{mode} stopped {stopped[mode] - cut:.2f} s, node deleted "
                       f"{deleted[mode] - cut:.2f} s after the cut" for mode in FOLLOWER_MODES)
    print(f"\nfollower {follower} cut off from leader {leader}: {report}")
    for mode in FOLLOWER_MODES:
        assert stopped[mode] < deleted[mode], (mode, report)
