"""The dashboard's applications: their states (a running app first, a stale one marked),
members of every kind, monotonic task totals, and access with a token.

Real ZooKeeper; the master and worker run in this process (``Master.run`` /
``Worker.run`` in their own session), the feed fills a model the test waits on
(:meth:`Model.wait_newer`), and the web application is served on a free port."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from framework import Session, records, web
from framework.dashboard import Model, listen, prom
from framework.dashboard.asgi import dashboard_app
from framework.dashboard.feed import Feed
from framework.dashboard.model import AppModel
from framework.metrics import TaskStats
from framework.runtime import App, Master, MasterContext, Task, Worker

LIVE, GONE, FINISHED, STOPPED = App("live"), App("gone"), App("finished"), App("stopped")
BROKER = {"kind": "broker server", "state": "running", "host": "h", "pid": 7,
          "shards": ["orders"], "health": {"ok": True}}


class Idle(Master):
    app_name = LIVE.name

    async def lead(self, ctx: MasterContext) -> None:
        await trio.sleep_forever()


class Quiet(Worker):
    app_name = LIVE.name

    async def handle(self, task: Task) -> None:
        return None


async def _until(model: Model, done: Callable[[], bool]) -> None:
    version = -1
    while not done():
        version = await model.wait_newer(version)


def _states(model: Model) -> list[tuple[str, str]]:
    return [(app.name, app.state) for app in model.ordered()]


def _http(url: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


async def test_states_running_first_stale_marked_members_of_every_kind(
        zk_hosts: str, chroot: str) -> None:
    model = Model()
    with trio.fail_after(60):
        async with Session(zk_hosts, chroot=chroot) as session, \
                trio.open_nursery() as nursery:
            for app in (GONE, FINISHED, STOPPED):
                await session.ensure_path(app.workers)
            await session.create(FINISHED.done, records.encode({"master": "m1"}))
            await session.create(STOPPED.cancel, b'{"by": "test"}')
            processes = trio.CancelScope()

            async def live_app() -> None:
                with processes:
                    async with Session(zk_hosts, chroot=chroot) as own, \
                            trio.open_nursery() as inner:
                        inner.start_soon(Idle(name="m1").run, own)
                        inner.start_soon(Quiet(name="w1").run, own)
                        await own.ensure_path(LIVE.workers)
                        await own.create(f"{LIVE.workers}/broker-1",
                                         json.dumps(BROKER).encode(), ephemeral=True)

            nursery.start_soon(live_app)
            nursery.start_soon(Feed(session, model).run)
            url = await nursery.start(lambda task_status: web.serve(
                dashboard_app(model, session), listen(port=0), task_status=task_status))
            live = model.app(LIVE.name)
            await _until(model, lambda: len(live.workers) == 2 and bool(live.contenders)
                         and len(model.apps) == 4 and model.app(FINISHED.name).done
                         is not None and model.app(STOPPED.name).cancelled is not None)
            assert _states(model) == [("live", "active"), ("stopped", "cancelled"),
                                      ("finished", "done"), ("gone", "stale")]
            status, _, body = await trio.to_thread.run_sync(_http, f"{url}/api/state")
            state = json.loads(body)
            assert status == 200 and [a["name"] for a in state["apps"]] == [
                "live", "stopped", "finished", "gone"]
            members = {w["name"]: w for w in state["apps"][0]["workers"]}
            assert members["broker-1"]["kind"] == "broker server"
            assert members["broker-1"]["shards"] == ["orders"]
            assert members["w1"]["kind"] == "worker"
            _, _, metrics = await trio.to_thread.run_sync(_http, f"{url}/metrics")
            assert b'framework_app_state{app="gone",state="stale"} 1.0' in metrics
            assert b'framework_app_members{app="live"} 2.0' in metrics

            # the live app's processes go away: it is stale, not "running" forever
            processes.cancel()
            await _until(model, lambda: live.state == "stale")
            assert _states(model)[-2:] == [("gone", "stale"), ("live", "stale")]
            nursery.cancel_scope.cancel()


async def test_broker_servers_are_listed_as_broker_servers(zk_hosts: str, chroot: str,
                                                          tmp_path: Path) -> None:
    """The message broker's servers (real ones, in this process) are members of the
    broker's ``workers/`` group: listed with their kind and their topics, not as missing
    workers."""
    from examples.message_broker.cluster import LocalCluster
    from examples.message_broker.layout import APP_NAME

    model = Model()
    with trio.fail_after(60):
        async with Session(zk_hosts, chroot=chroot) as session, \
                trio.open_nursery() as nursery:
            nursery.start_soon(Feed(session, model).run)
            cluster = LocalCluster(zk_hosts, chroot, tmp_path, nursery)
            await cluster.start_with_topics(session, ["orders"])
            broker = model.app(APP_NAME)

            def listed() -> bool:
                kinds = {n: m.get("kind") for n, m in broker.workers.items()}
                shards = {s for m in broker.workers.values() for s in m.get("shards", [])}
                return kinds == {"s1": "broker server", "s2": "broker server"} and \
                    {"orders", "orders (backup)"} <= shards

            await _until(model, listed)
            assert broker.state == "active"  # the controller leads
            state = json.loads(model.snapshot_bytes())
            members = next(a for a in state["apps"] if a["name"] == APP_NAME)["workers"]
            assert [(m["name"], m["kind"]) for m in members] == [
                ("s1", "broker server"), ("s2", "broker server")]
            # their replica counts are their counters: one primary, one backup in all
            assert sum(m["counters"]["primaries"] for m in members) == 1
            assert sum(m["counters"]["backups"] for m in members) == 1
            nursery.cancel_scope.cancel()


def _member(pid: int, done: int, seconds: list[float]) -> dict[str, Any]:
    stats = TaskStats()
    for s in seconds:
        stats.record(True, s)
    return {"host": "h", "pid": pid, "done": done, **stats.published()}


def test_totals_only_grow_across_restarts_and_rejoins() -> None:
    app = AppModel("a")
    app.set_workers({"w1": _member(1, 2, [0.01, 0.02])})
    app.set_workers({"w1": _member(1, 3, [0.01, 0.02, 0.3])})
    assert (app.totals.done, app.totals.durations.count) == (3, 3)
    app.set_workers({})  # its session expired: the same process joins again
    app.set_workers({"w1": _member(1, 4, [0.01, 0.02, 0.3, 0.4])})
    assert (app.totals.done, app.totals.durations.count) == (4, 4)
    app.set_workers({"w1": _member(2, 5, [0.01] * 5)})  # restarted: more than before, new pid
    assert (app.totals.done, app.totals.durations.count) == (9, 9)
    app.set_workers({"w1": _member(2, 1, [0.01])})  # restarted in the same process: fewer
    assert (app.totals.done, app.totals.durations.count) == (10, 10)
    app.set_workers({"w1": {"kind": "broker server"}, "w2": {"done": "many"}})
    assert app.totals.done == 10  # a member without task counts, or a corrupt one, adds none
    assert app.totals.durations.counts[0] == 0 and app.totals.durations.counts[1] == 7


async def test_token_guards_every_request(zk_hosts: str, chroot: str) -> None:
    token = "s3cret-token"
    model = Model()
    with trio.fail_after(30):
        async with Session(zk_hosts, chroot=chroot) as session, \
                trio.open_nursery() as nursery:
            url = await nursery.start(lambda task_status: web.serve(
                dashboard_app(model, session, token=token), listen(port=0),
                task_status=task_status))

            def get(path: str, authorization: str | None = None) -> tuple[int, dict, bytes]:
                headers = {"Authorization": authorization} if authorization else {}
                return _http(f"{url}{path}", headers)

            basic = base64.b64encode(f"anyone:{token}".encode()).decode()
            wrong = base64.b64encode(b"anyone:guess").decode()
            for path in ("/", "/api/state", "/metrics", "/static/dashboard.js"):
                status, headers, _ = await trio.to_thread.run_sync(get, path)
                assert status == 401 and headers["www-authenticate"].startswith("Basic"), path
                status, _, _ = await trio.to_thread.run_sync(get, path, f"Bearer {token}")
                assert status == 200, path
                status, _, _ = await trio.to_thread.run_sync(get, path, f"Basic {basic}")
                assert status == 200, path
                for bad in (f"Basic {wrong}", "Bearer guess", f"Token {token}", "Basic !!"):
                    status, _, _ = await trio.to_thread.run_sync(get, path, bad)
                    assert status == 401, (path, bad)
            nursery.cancel_scope.cancel()


@pytest.mark.parametrize("host", ["0.0.0.0", "192.0.2.1"])
def test_no_token_off_loopback_is_one_line(zk_hosts: str, host: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "framework", "dashboard", "--zk", zk_hosts, "--host", host,
         "--port", "0"], capture_output=True, text=True, timeout=60,
        env={"PATH": "/usr/bin:/bin", "FRAMEWORK_DASHBOARD_TOKEN": ""})
    assert result.returncode == 2, result.stderr
    assert len(result.stderr.splitlines()) == 1 and "Traceback" not in result.stderr
    assert f"serve {host} without authentication" in result.stderr
    assert "FRAMEWORK_DASHBOARD_TOKEN" in result.stderr


async def test_an_app_s_results_are_counted_whoever_wrote_them(zk_hosts: str,
                                                               chroot: str) -> None:
    """Results written by processes the dashboard never saw (gone before it started) are
    the app's count all the same; a later change its members report counts them again."""
    model = Model()
    done = App("finished-earlier")
    with trio.fail_after(60):
        async with Session(zk_hosts, chroot=chroot) as session, \
                trio.open_nursery() as nursery:
            for n in range(5):
                await session.create(f"{done.results}/{n:02x}/k{n}", b"{}", makepath=True)
            await session.ensure_path(done.workers)
            nursery.start_soon(Feed(session, model).run)
            view = model.app(done.name)
            await _until(model, lambda: view.results == 5)
            assert view.totals.done == 0  # no process seen: the old count said 0
            await session.create(f"{done.results}/00/k5", b"{}")
            await session.create(f"{done.workers}/w9", b'{"done": 1}', ephemeral=True)
            await _until(model, lambda: view.results == 6)
            assert view.to_json()["results"] == 6
            exported = prom.render(prom.registry_for(model))
            assert b'framework_app_results{app="finished-earlier"} 6.0' in exported
            nursery.cancel_scope.cancel()
