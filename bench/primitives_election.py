"""Election hand-over and membership propagation: ours vs kazoo's recipes, in the same run.

Run: ``.venv/bin/python bench/primitives_election.py`` (starts its own standalone ZooKeeper
unless FRAMEWORK_ZK_HOSTS is set).

* Hand-over after a clean resign: the leader leaves its block (ours) / returns from its
  ``run`` function (kazoo); time until the next contender's leader code starts.
* Hand-over after kill -9: the leader is a subprocess (``tests/helpers/p1_election_holder.py``)
  killed with SIGKILL; time from the kill until an in-process contender leads.  Dominated by
  the session timeout (printed), which is the same for both.
* Membership propagation: 49 members joined and a watcher up to date; time from issuing the
  50th join until the watcher sees all 50 (ours: ``Group.watch`` with every member's data;
  kazoo: a ``ChildrenWatch`` plus ``Party`` (data read per member) / ``ShallowParty`` (names)).

kazoo's recipes block, so they run in threads (never on the trio thread).
"""

from __future__ import annotations

import os
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import trio
from kazoo.client import KazooClient
from kazoo.recipe.election import Election as KazooElection
from kazoo.recipe.party import Party, ShallowParty

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("FRAMEWORK_LOG_LEVEL", "error")
sys.path.insert(0, str(ROOT))

from bench.common import Result, median, print_results, sized, zookeeper  # noqa: E402
from framework import Session, configure_logging  # noqa: E402
from framework.primitives.election import Election  # noqa: E402
from framework.primitives.membership import Group  # noqa: E402
from framework.testing import Child, python_argv, spawn  # noqa: E402

HELPER = ROOT / "tests" / "helpers" / "p1_election_holder.py"
SESSION_TIMEOUT = sized(4.0, 1.0)
RESIGN_ROUNDS = sized(20, 2)  # --quick: the smaller sizes (see bench.common.quick)
KILL_ROUNDS = sized(3, 1)
MEMBERS = sized(50, 5)
MEMBERSHIP_ROUNDS = sized(5, 1)


# ------------------------------------------------------------------ hand-over: clean resign


async def ours_resign(hosts: str, chroot: str, rounds: int) -> list[float]:
    samples = []
    async with (
        Session(hosts, chroot=chroot, session_timeout=SESSION_TIMEOUT) as a,
        Session(hosts, chroot=chroot, session_timeout=SESSION_TIMEOUT) as b,
    ):
        for i in range(rounds):
            path = f"/resign-{i}"
            first, second = Election(a, path, b"A"), Election(b, path, b"B")
            started: list[float] = []

            async def follow(election: Election = second, stamps: list[float] = started) -> None:
                async with election.leadership():
                    stamps.append(time.perf_counter())

            async with trio.open_nursery() as nursery, first.leadership():
                nursery.start_soon(follow)
                await second.wait_in_line()
                resigned = time.perf_counter()
            samples.append(started[0] - resigned)
    return samples


def _wait_children(client: KazooClient, path: str, count: int) -> None:
    """Block until ``path`` has ``count`` children (a kazoo watch, no polling)."""
    enough = threading.Event()

    def check(children: list[str]) -> bool:
        if len(children) >= count:
            enough.set()
            return False
        return True

    client.ChildrenWatch(path, check)
    enough.wait()


def kazoo_resign(hosts: str, chroot: str, rounds: int) -> list[float]:
    a, b = KazooClient(hosts=hosts, timeout=SESSION_TIMEOUT), KazooClient(
        hosts=hosts, timeout=SESSION_TIMEOUT)
    a.start()
    b.start()
    samples = []
    try:
        for i in range(rounds):
            path = f"{chroot}/kazoo-resign-{i}"
            first, second = KazooElection(a, path, "A"), KazooElection(b, path, "B")
            leading, release, followed = threading.Event(), threading.Event(), threading.Event()
            started: list[float] = []

            def lead(leading: threading.Event = leading, release: threading.Event = release
                     ) -> None:
                leading.set()
                release.wait()

            def follow(started: list[float] = started, followed: threading.Event = followed
                       ) -> None:
                started.append(time.perf_counter())
                followed.set()

            t1 = threading.Thread(target=first.run, args=(lead,))
            t1.start()
            leading.wait()
            t2 = threading.Thread(target=second.run, args=(follow,))
            t2.start()
            _wait_children(a, path, 2)
            resigned = time.perf_counter()
            release.set()
            followed.wait()
            samples.append(started[0] - resigned)
            t1.join()
            t2.join()
    finally:
        for client in (a, b):
            client.stop()
            client.close()
    return samples


# ------------------------------------------------------------------ hand-over: kill -9


@asynccontextmanager
async def _holder(hosts: str, chroot: str, path: str, impl: str) -> AsyncIterator[Child]:
    """A process leading the election at ``path`` (yielded once it leads), killed with
    kill -9 and reaped at the end of the block."""
    async with spawn(python_argv(HELPER, hosts, chroot, path, "holder", "--impl", impl,
                                 "--timeout", SESSION_TIMEOUT), name=f"holder-{impl}",
                     pipe_stdout=True, env={"FRAMEWORK_LOG_LEVEL": "error"}) as proc:
        assert proc.lines is not None
        try:
            await proc.lines.next()
        except EOFError:
            raise RuntimeError("election holder exited before leading") from None
        yield proc


async def ours_kill(hosts: str, chroot: str, rounds: int) -> list[float]:
    samples = []
    async with Session(hosts, chroot=chroot, session_timeout=SESSION_TIMEOUT) as session:
        for i in range(rounds):
            path = f"/kill-{i}"
            async with _holder(hosts, chroot, path, "ours") as proc:
                follower = Election(session, path, b"B")
                started: list[float] = []

                async def follow(election: Election = follower, stamps: list[float] = started
                                 ) -> None:
                    async with election.leadership():
                        stamps.append(time.perf_counter())

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(follow)
                    await follower.wait_in_line()
                    killed = time.perf_counter()
                    proc.kill()
            samples.append(started[0] - killed)
    return samples


def kazoo_follow_after_kill(hosts: str, path: str, proc: Child) -> float:
    client = KazooClient(hosts=hosts, timeout=SESSION_TIMEOUT)
    client.start()
    try:
        election = KazooElection(client, path, "B")
        started: list[float] = []
        thread = threading.Thread(target=election.run, args=(
            lambda: started.append(time.perf_counter()),))
        thread.start()
        _wait_children(client, path, 2)
        killed = time.perf_counter()
        proc.kill()
        thread.join()
        return started[0] - killed
    finally:
        client.stop()
        client.close()


async def kazoo_kill(hosts: str, chroot: str, rounds: int) -> list[float]:
    samples = []
    for i in range(rounds):
        path = f"{chroot}/kazoo-kill-{i}"
        async with _holder(hosts, "", path, "kazoo") as proc:
            samples.append(await trio.to_thread.run_sync(
                kazoo_follow_after_kill, hosts, path, proc))
    return samples


# ------------------------------------------------------------------ membership propagation


async def ours_membership(hosts: str, chroot: str, rounds: int) -> list[float]:
    samples = []
    async with (
        Session(hosts, chroot=chroot, session_timeout=SESSION_TIMEOUT) as members,
        Session(hosts, chroot=chroot, session_timeout=SESSION_TIMEOUT) as watcher,
    ):
        for i in range(rounds):
            group, observer = Group(members, f"/group-{i}"), Group(watcher, f"/group-{i}")
            synced, complete = trio.Event(), trio.Event()
            seen_all: list[float] = []

            async def watch(observer: Group = observer, synced: trio.Event = synced,
                            complete: trio.Event = complete,
                            seen_all: list[float] = seen_all) -> None:
                async for snapshot in observer.watch():
                    if len(snapshot) == MEMBERS - 1:
                        synced.set()
                    if len(snapshot) == MEMBERS:
                        seen_all.append(time.perf_counter())
                        complete.set()
                        return

            async with trio.open_nursery() as nursery, AsyncExitStack() as stack:
                for m in range(MEMBERS - 1):
                    await stack.enter_async_context(group.join(f"m{m:03d}", b"host:port"))
                nursery.start_soon(watch)
                await synced.wait()
                joined = time.perf_counter()
                await stack.enter_async_context(group.join(f"m{MEMBERS:03d}", b"host:port"))
                await complete.wait()
            samples.append(seen_all[0] - joined)
    return samples


def kazoo_membership(hosts: str, chroot: str, rounds: int, shallow: bool) -> list[float]:
    members, watcher = KazooClient(hosts=hosts), KazooClient(hosts=hosts)
    members.start()
    watcher.start()
    samples = []
    kind = ShallowParty if shallow else Party
    try:
        for i in range(rounds):
            path = f"{chroot}/kazoo-{'shallow' if shallow else 'party'}-{i}"
            parties = [kind(members, path, f"m{m:03d}") for m in range(MEMBERS)]
            for party in parties[:-1]:
                party.join()
            view = kind(watcher, path)
            synced, complete = threading.Event(), threading.Event()
            seen_all: list[float] = []

            def changed(children: list[str], view: Party | ShallowParty = view,
                        synced: threading.Event = synced, complete: threading.Event = complete,
                        seen_all: list[float] = seen_all) -> bool:
                if len(children) == MEMBERS - 1:
                    synced.set()
                if len(children) == MEMBERS:
                    members_now = list(view)  # Party: reads every member's data
                    if len(members_now) == MEMBERS:
                        seen_all.append(time.perf_counter())
                        complete.set()
                        return False
                return True

            watcher.ChildrenWatch(path, changed)
            synced.wait()
            joined = time.perf_counter()
            parties[-1].join()
            complete.wait()
            samples.append(seen_all[0] - joined)
            for party in parties:
                party.leave()
    finally:
        for client in (members, watcher):
            client.stop()
            client.close()
    return samples


# ------------------------------------------------------------------ driver


async def run(hosts: str) -> list[Result]:
    """Measure everything against ``hosts``; return the rows (latencies in ms)."""
    chroot = f"/bench-election-{uuid.uuid4().hex[:8]}"
    ms = 1000.0
    results = []
    k = await trio.to_thread.run_sync(kazoo_resign, hosts, chroot, RESIGN_ROUNDS)
    o = await ours_resign(hosts, chroot, RESIGN_ROUNDS)
    results.append(Result("election hand-over, clean resign", "ms", median(k) * ms,
                          median(o) * ms, higher_is_better=False,
                          note=f"median of {RESIGN_ROUNDS}"))
    k = await kazoo_kill(hosts, chroot, KILL_ROUNDS)
    o = await ours_kill(hosts, chroot, KILL_ROUNDS)
    results.append(Result("election hand-over, leader kill -9", "ms", median(k) * ms,
                          median(o) * ms, higher_is_better=False,
                          note=f"session timeout {SESSION_TIMEOUT:g} s, median of {KILL_ROUNDS}"))
    o = await ours_membership(hosts, chroot, MEMBERSHIP_ROUNDS)
    for shallow in (False, True):
        k = await trio.to_thread.run_sync(kazoo_membership, hosts, chroot, MEMBERSHIP_ROUNDS,
                                          shallow)
        name = "ShallowParty (names only)" if shallow else "Party (with data)"
        results.append(Result(f"membership: 50th join seen by a watcher vs {name}", "ms",
                              median(k) * ms, median(o) * ms, higher_is_better=False,
                              note=f"{MEMBERS} members, median of {MEMBERSHIP_ROUNDS}"))
    async with Session(hosts) as session:
        await session.delete_tree(chroot)
    return results


def main() -> None:
    configure_logging(level="error")
    with zookeeper() as hosts:
        results = trio.run(run, hosts)
    print_results(
        f"election and membership: ours vs kazoo recipes (session timeout "
        f"{SESSION_TIMEOUT:g} s)", results)


if __name__ == "__main__":
    main()
