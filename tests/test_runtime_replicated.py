"""Replicated push mode of the runtime (``MasterContext.run_replicated``, ``Worker.ready``)
with in-process masters and workers on a real ZooKeeper."""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio

from framework import PermanentFailure, Session
from framework.runtime import (
    App,
    Master,
    MasterContext,
    Readiness,
    ReplicatedPlacement,
    Worker,
)
from framework.runtime.placement import replicated as replicated_module
from framework.testing import expire_session
from framework.zk import wait_exists, wait_gone, watch_children, watch_data

GRACE = 1.0
SHARDS = {f"s{i}": f"spec-{i}".encode() for i in range(4)}


class Replica(Worker):
    """Serves a shard after a short load; refuses the shards in ``refuse``."""

    def __init__(self, *args: Any, refuse: frozenset[str] = frozenset(), **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.refuse = refuse
        self.specs: dict[str, bytes] = {}

    async def serve_shard(self, shard: str, spec: bytes) -> None:
        if shard in self.refuse:
            raise PermanentFailure(f"{self.name} cannot open {shard}")
        await trio.sleep(0.05)  # copying, opening...
        async with self.ready(shard, {"worker": self.name}) as listed:
            if listed:
                self.specs[shard] = spec
                await trio.sleep_forever()
        self.specs.pop(shard, None)


class Replicated(Master):
    stable_for = 0.3

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.steps: list[dict[str, list[str]]] = []
        self.stepped = trio.Event()

    async def lead(self, ctx: MasterContext) -> None:
        async def step(placement: ReplicatedPlacement) -> None:
            self.steps.append({s: list(w) for s, w in placement.plan.items()})
            self.stepped.set()

        await ctx.run_replicated(SHARDS, 2, node_grace=GRACE, on_step=step)


async def run_with_session(hosts: str, chroot: str, component: Any, scope: trio.CancelScope,
                           sessions: dict[str, Session],
                           task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    with scope:
        async with Session(hosts, chroot=chroot, session_timeout=4.0) as s:
            sessions[component.name] = s
            task_status.started()
            await component.run(s)


async def start_all(nursery: trio.Nursery, hosts: str, chroot: str, names: tuple[str, ...],
                    scopes: dict[str, trio.CancelScope], sessions: dict[str, Session],
                    ) -> tuple[dict[str, Replica], Replicated]:
    """Start the workers ``names`` and master ``m1``, each with its own session."""
    workers = {n: Replica("rep", name=n) for n in names}
    for name, worker in workers.items():
        await nursery.start(run_with_session, hosts, chroot, worker, scopes[name], sessions)
    master = Replicated("rep", name="m1")
    await nursery.start(run_with_session, hosts, chroot, master, scopes["m1"], sessions)
    return workers, master


async def read_plan(session: Session, app: App) -> dict[str, list[str]]:
    return {s: json.loads((await session.get(app.plan_path(s)))[0]) for s in SHARDS}


async def wait_plan(session: Session, app: App, check: Any) -> dict[str, list[str]]:
    """Wait (watches on every deployment directory and plan) until ``check(plan,
    serving)`` holds; returns the plan."""
    while True:
        changed = trio.Event()
        waker = session.waker(changed)
        plan: dict[str, list[str]] = {}
        serving: dict[str, set[str]] = {}
        for shard in SHARDS:
            stat = await session.exists(app.plan_path(shard), watch=waker)
            if stat is None:
                plan[shard], serving[shard] = [], set()
                continue
            plan[shard] = json.loads((await session.get(app.plan_path(shard), watch=waker))[0])
            serving[shard] = set(await session.children(app.deployed_dir(shard), watch=waker))
        if check(plan, serving):
            return plan
        await changed.wait()


def replicated(plan: dict[str, list[str]], serving: dict[str, set[str]],
               workers: set[str]) -> bool:
    return all(len(plan[s]) == 2 and set(plan[s]) == serving[s] and serving[s] <= workers
               for s in SHARDS)


async def test_lost_worker_re_replicated_after_grace_and_new_master_resumes(
        zk_hosts: str, chroot: str, session: Session) -> None:
    app = App("rep")
    sessions: dict[str, Session] = {}
    scopes = {n: trio.CancelScope() for n in ("w1", "w2", "w3", "m1", "m2")}
    least: dict[str, int] = {}  # fewest serving replicas seen per shard, after deployment
    with trio.fail_after(40):
        async with trio.open_nursery() as nursery:
            workers, m1 = await start_all(nursery, zk_hosts, chroot, ("w1", "w2", "w3"),
                                          scopes, sessions)
            plan = await wait_plan(session, app, lambda p, s: replicated(p, s, set(workers)))
            loads = sorted(sum(w in nodes for nodes in plan.values()) for w in workers)
            assert loads == [2, 3, 3], plan
            assert workers["w1"].specs.get("s0", SHARDS["s0"]) == SHARDS["s0"]

            async def observe(shard: str) -> None:
                async for snap in watch_children(session, app.deployed_dir(shard)):
                    least[shard] = min(least.get(shard, 99), len(snap.children))

            async with trio.open_nursery() as observers:
                for shard in SHARDS:
                    observers.start_soon(observe, shard)
                # w3 dies: its session expires (its records go), it never comes back
                victim = "w3"
                held = {s for s, nodes in plan.items() if victim in nodes}
                assert held
                await expire_session(sessions[victim])
                scopes[victim].cancel()
                lost = trio.current_time()
                # during the grace the plan keeps w3 (safe mode)
                async for snap in watch_data(session, app.plan_path(sorted(held)[0])):
                    if snap.data and victim not in json.loads(snap.data):
                        break
                assert trio.current_time() - lost >= GRACE * 0.8
                survivors = {"w1", "w2"}
                plan = await wait_plan(session, app, lambda p, s: replicated(p, s, survivors))
                observers.cancel_scope.cancel()
            assert set(least) == set(SHARDS) and min(least.values()) >= 1, least
            # the master goes; a new master resumes the plan from ZooKeeper: no moves
            m1.request_stop()
            m2 = Replicated("rep", name="m2")
            m2.stable_for = 0.0  # its first step must still wait for the live workers
            await nursery.start(run_with_session, zk_hosts, chroot, m2, scopes["m2"],
                                sessions)
            await m2.stepped.wait()
            assert m2.steps[0] == plan, (m2.steps[0], plan)
            assert await read_plan(session, app) == plan
            nursery.cancel_scope.cancel()


async def test_refused_and_removed_shards(zk_hosts: str, chroot: str, session: Session) -> None:
    """A worker that refuses a shard (PermanentFailure) records it and is never planned for
    it again; shards taken out of the wanted set are unplaced, then their znodes deleted;
    a serving record is never written for a shard that is gone."""
    app = App("rep2")
    wanted = trio.Event()

    class Changing(Master):
        stable_for = 0.2

        async def lead(self, ctx: MasterContext) -> None:
            placement = ctx.replicated(node_grace=0.2)
            placement.set_shards(SHARDS, 2)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(placement.run)
                await wanted.wait()
                placement.set_shards({"s0": SHARDS["s0"]}, 2)

    sessions: dict[str, Session] = {}
    with trio.fail_after(40):
        async with trio.open_nursery() as nursery:
            for name in ("w1", "w2", "w3"):
                worker = Replica("rep2", name=name, refuse=frozenset({"s0"} if name == "w1"
                                                                     else ()))
                await nursery.start(run_with_session, zk_hosts, chroot, worker,
                                    trio.CancelScope(), sessions)
            await nursery.start(run_with_session, zk_hosts, chroot, Changing("rep2", name="m"),
                                trio.CancelScope(), sessions)
            await wait_exists(session, f"{app.refused_dir('s0')}/w1")
            plan = await wait_plan(session, app, lambda p, s: replicated(p, s, {"w1", "w2",
                                                                                "w3"}))
            assert "w1" not in plan["s0"], plan
            wanted.set()
            for shard in ("s1", "s2", "s3"):
                for path in (f"{app.shards}/{shard}", app.plan_path(shard),
                             app.deployed_dir(shard), app.refused_dir(shard)):
                    await wait_gone(session, path)
            assert set(await session.children(app.shards)) == {"s0"}
            for worker in ("w1", "w2", "w3"):
                assert set(await session.children(app.assignment_dir(worker))) <= {"s0"}
            nursery.cancel_scope.cancel()



async def test_a_plan_that_disagrees_with_the_assignments_is_resumed_from_them(
        zk_hosts: str, chroot: str, session: Session) -> None:
    """A shard whose plan says nobody although a worker holds its assignment (placed by
    ``run_shards``, or a plan write lost with its reply): the new leader starts from the
    assignments that exist, instead of re-creating one and failing on it forever."""
    app = App("rep")
    for path in (app.shards, app.plan, app.deployed, app.refused, app.assignment_dir("w1")):
        await session.ensure_path(path)
    for shard, spec in SHARDS.items():
        await session.create(f"{app.shards}/{shard}", spec)
        await session.create(app.plan_path(shard), b"[]")
        await session.create(app.deployed_dir(shard))
        await session.create(app.refused_dir(shard))
        await session.create(f"{app.assignment_dir('w1')}/{shard}")
    sessions: dict[str, Session] = {}
    scopes = {n: trio.CancelScope() for n in ("w1", "w2", "m1")}
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            workers, _master = await start_all(nursery, zk_hosts, chroot, ("w1", "w2"),
                                               scopes, sessions)
            await wait_plan(session, app, lambda p, s: replicated(p, s, set(workers)))
            nursery.cancel_scope.cancel()


async def test_a_late_clean_up_never_deletes_the_current_record(
        zk_hosts: str, chroot: str, session: Session) -> None:
    """One record per ``ready`` block: a record of ours left by an earlier block is
    replaced, never adopted, and that block's withdrawal landing late
    (``Session.delete_later`` with what it wrote) leaves the current record alone."""
    app = App("rep3")
    await session.ensure_path(app.deployed_dir("s0"))
    worker = Replica(app, name="w1")
    worker.session = session
    path = f"{app.deployed_dir('s0')}/w1"
    with trio.fail_after(10):
        async with worker.ready("s0", {"worker": "w1"}) as listed:
            assert listed
            first, _ = await session.get(path)
        # the earlier block's record is still there (its withdrawal not through yet)
        await session.create(path, first, ephemeral=True)
        old = await session.exists(path)
        assert old is not None
        async with worker.ready("s0", {"worker": "w1"}) as listed:
            assert listed
            data, stat = await session.get(path)
            assert stat.czxid != old.czxid and data != first  # a new incarnation
            session.delete_later(path, data=first)  # the earlier block's clean-up, late
            await session.wait_leftovers_done()
            assert (await session.get(path))[0] == data


class Unconfirmed(Replica):
    """A worker whose serving records are never confirmed (as if it froze right after
    announcing them)."""

    confirm_after = None


async def test_a_move_completes_only_once_the_new_replica_is_confirmed(
        zk_hosts: str, chroot: str, session: Session) -> None:
    """R=1, moves w1 -> w2: while w2's records are unconfirmed (version 0) the leader steps
    with w2 serving but never drops w1; once they are confirmed (written again, as
    ``Worker.ready`` does ``confirm_after`` seconds in) the record's watch wakes the
    leader and the moves complete."""
    app = App("rep4")
    seen: list[tuple[dict[str, list[str]], dict[str, set[str]]]] = []
    stepped = [trio.Event()]

    class One(Master):
        stable_for = 0.2

        async def lead(self, ctx: MasterContext) -> None:
            async def step(placement: ReplicatedPlacement) -> None:
                seen.append(({s: list(w) for s, w in placement.plan.items()},
                             {s: set(w) for s, w in placement.serving.items()}))
                stepped[0].set()

            await ctx.run_replicated(SHARDS, 1, node_grace=GRACE, on_step=step)

    sessions: dict[str, Session] = {}
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(run_with_session, zk_hosts, chroot, Replica(app, name="w1"),
                                trio.CancelScope(), sessions)
            await nursery.start(run_with_session, zk_hosts, chroot, One(app, name="m1"),
                                trio.CancelScope(), sessions)
            await wait_plan(session, app, lambda p, s: all(
                p[x] == ["w1"] and s[x] == {"w1"} for x in SHARDS))
            await nursery.start(run_with_session, zk_hosts, chroot,
                                Unconfirmed(app, name="w2"), trio.CancelScope(), sessions)
            # the moves start and w2 serves its new replicas, unconfirmed
            plan = await wait_plan(session, app, lambda p, s: sum(
                p[x] == ["w1", "w2"] and s[x] == {"w1", "w2"} for x in SHARDS) == 2)
            moving = [x for x in SHARDS if plan[x] == ["w1", "w2"]]
            # a step that saw w2 serving them still plans w1 (never dropped unconfirmed)
            while not any(all("w2" in serving.get(x, ()) for x in moving)
                          for _, serving in seen):
                stepped[0] = trio.Event()
                await stepped[0].wait()
            assert all(all("w1" in p[x] for x in moving) for p, _ in seen), seen
            for shard in moving:  # confirm w2's records, as Worker.ready would
                path = f"{app.deployed_dir(shard)}/w2"
                data, stat = await session.get(path)
                assert stat.version == 0
                await session.set(path, data, version=0)
            await wait_plan(session, app, lambda p, s: all(
                p[x] == ["w2"] and s[x] == {"w2"} for x in moving))
            nursery.cancel_scope.cancel()


async def test_an_application_ready_rule_and_new_shard_hook(
        zk_hosts: str, chroot: str, session: Session, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pluggable ready rule (the broker's kind: readiness from the application's own
    znode, ``ok/<shard>``, not from the deployment records): R=1, moves w1 -> w2 start, w2
    serves and confirms, yet w1 is dropped only once the rule's znode names w2 - whose
    watch (``wake_on``) wakes the leader.  ``on_new_shard`` created ``ok/<shard>`` in the
    multi that created the shard; one multi per changed shard here (``STEP_BATCH`` = 1)."""
    app = App("rep5")
    ok = f"{app.base}/ok"
    monkeypatch.setattr(replicated_module, "STEP_BATCH", 1)

    async def ready(placement: ReplicatedPlacement, shard: str, planned: Any,
                    candidates: Any) -> Readiness | None:
        path = f"{ok}/{shard}"
        data, stat = await placement.ctx.session.get(path, watch=placement.wake_on(path))
        return Readiness(frozenset(json.loads(data)), checks=((path, stat.version),))

    class Own(Master):
        stable_for = 0.2

        async def lead(self, ctx: MasterContext) -> None:
            await ctx.session.ensure_path(ok)
            placement = ReplicatedPlacement(
                ctx, node_grace=GRACE, stable_for=self.stable_for, ready=ready,
                on_new_shard=lambda txn, shard, ws: txn.create(f"{ok}/{shard}", b"[]"))
            placement.set_shards(SHARDS, 1)
            await placement.run()

    sessions: dict[str, Session] = {}
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(run_with_session, zk_hosts, chroot, Replica(app, name="w1"),
                                trio.CancelScope(), sessions)
            await nursery.start(run_with_session, zk_hosts, chroot, Own(app, name="m1"),
                                trio.CancelScope(), sessions)
            await wait_plan(session, app, lambda p, s: all(p[x] == ["w1"] for x in SHARDS))
            assert sorted(await session.children(ok)) == sorted(SHARDS)
            await nursery.start(run_with_session, zk_hosts, chroot, Replica(app, name="w2"),
                                trio.CancelScope(), sessions)
            plan = await wait_plan(session, app, lambda p, s: sum(
                p[x] == ["w1", "w2"] and s[x] == {"w1", "w2"} for x in SHARDS) == 2)
            moving = [x for x in SHARDS if plan[x] == ["w1", "w2"]]
            for shard in moving:  # w2's records confirmed: still the rule's word only
                async for snap in watch_data(session, f"{app.deployed_dir(shard)}/w2"):
                    if snap.stat is not None and snap.stat.version >= 1:
                        break
            now = await read_plan(session, app)
            assert all(now[x] == ["w1", "w2"] for x in moving)
            for shard in moving:
                await session.set(f"{ok}/{shard}", json.dumps(["w1", "w2"]).encode())
            await wait_plan(session, app, lambda p, s: all(p[x] == ["w2"] for x in moving))
            nursery.cancel_scope.cancel()
