"""The operations CLI (apps, result, dead, purge, cancel, submit, status --watch), the
``Client`` behind it, and connection strings: against a real ZooKeeper."""

from __future__ import annotations

import json
import signal
import sys
import time
from typing import Any

import pytest
import trio

from framework import Client, ConfigurationError, FrameworkError, PermanentFailure, Session
from framework.cli import main, split_chroot
from framework.runtime import App, Master, MasterContext, Task, TaskExists, Worker
from framework.testing import spawn
from framework.zk import wait_exists, watch_children

APP = "ops"


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """``framework ARGS`` in this process (its own trio run, in the calling thread)."""
    capsys.readouterr()
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


async def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    return await trio.to_thread.run_sync(lambda: run_cli(capsys, *args))


def unchecked(app: str, task: str = "handle") -> str:
    """The note ``framework submit`` prints while no worker of ``app`` registered types."""
    return (f"framework: note: no worker of {app!r} has registered its task types yet, so "
            f"task type {task!r} was queued without a check against them (without --queue, "
            "in 'default' until a worker registers the type, then in the type's queue)\n")


def zk(zk_hosts: str, chroot: str) -> list[str]:
    return ["--zk", zk_hosts, "--chroot", chroot]


class Echo(Worker):
    """Returns the payload; ``fail``: permanently fails (dead-lettered at once);
    ``progress``: reports 3/10 and waits until released."""

    app_name = APP
    max_attempts = 1

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.release = trio.Event()

    async def handle(self, task: Task) -> Any:
        if task.payload.get("fail"):
            raise PermanentFailure(f"cannot do {task.payload['fail']}")
        if task.payload.get("progress"):
            await self.report_progress(task, 3, 10, "a third")
            await self.release.wait()
        return task.payload


class Idle(Master):
    app_name = APP

    async def lead(self, ctx: MasterContext) -> None:
        await trio.sleep_forever()


async def serve(nursery: trio.Nursery, hosts: str, chroot: str, component: Any) -> Session:
    """Run ``component`` on a session of its own (ended with the nursery)."""

    async def hold(task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        async with Session(hosts, chroot=chroot, session_timeout=4.0) as s:
            task_status.started(s)
            await component.run(s)
            await trio.sleep_forever()

    return await nursery.start(hold)


async def wait_children(session: Session, path: str, count: int) -> list[str]:
    async for snap in watch_children(session, path):
        if len(snap.children) >= count:
            return sorted(snap.children)
    raise AssertionError("unreachable")


# ------------------------------------------------------------------ Client


async def test_client_submits_and_waits_for_results(zk_hosts: str, chroot: str,
                                                    session: Session) -> None:
    client = Client(session, APP, create=True)
    with trio.fail_after(30):
        assert await client.result("k1") is None
        with pytest.raises(trio.TooSlowError):
            await client.result("k1", wait=True, timeout=0.2)
        async with trio.open_nursery() as nursery:
            waited: list[Any] = []
            got = trio.Event()

            async def waiter() -> None:
                waited.append(await client.result("k1", wait=True))
                got.set()

            nursery.start_soon(waiter)
            task = await client.submit("handle", {"n": 1}, key="k1")
            assert task.id == "k1"
            with pytest.raises(TaskExists, match="task 'k1' of 'ops' is queued: not queued"):
                await client.submit("handle", {"n": 1}, key="k1")  # says what exists
            worker = Echo(APP, name="w1")
            await serve(nursery, zk_hosts, chroot, worker)
            await got.wait()  # woken by its watch on the result's path
            record = waited[0]
            assert record.ok and record.result == {"n": 1} and record.key == "k1"
            assert await client.result("k1") == record
            with pytest.raises(TaskExists, match=r"'k1' of 'ops' succeeded at .* \(worker "
                                                 r"w1\): not queued again \(framework result"):
                await client.submit("handle", {"n": 1}, key="k1")
            assert (await client.existing("k1")).state == "succeeded"
            worker.request_stop()
            nursery.cancel_scope.cancel()
    with pytest.raises(ConfigurationError):
        await client.submit("handle", {"x": object()})
    with pytest.raises(ConfigurationError):
        await client.result("bad/key")


# ------------------------------------------------------------------ submit / result


async def test_submit_and_result_commands(zk_hosts: str, chroot: str, session: Session,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    with trio.fail_after(60):
        code, out, err = await cli(capsys, "submit", APP, "handle", '{"n": 7}', "--key", "img-7",
                                   "--priority", "-1", "--create", *zk(zk_hosts, chroot))
        assert (code, out) == (0, "img-7\n")
        assert err == unchecked("ops")
        code, out, err = await cli(capsys, "result", APP, "img-7", *zk(zk_hosts, chroot))
        assert code == 1 and out == "" and "no result for task 'img-7'" in err
        async with trio.open_nursery() as nursery:
            worker = Echo(APP, name="w1")
            await serve(nursery, zk_hosts, chroot, worker)
            code, out, err = await cli(capsys, "result", APP, "img-7", "--wait",
                                       "--timeout", "30", *zk(zk_hosts, chroot))
            worker.request_stop()
            nursery.cancel_scope.cancel()
    assert code == 0, err
    record = json.loads(out)
    assert record["ok"] and record["result"] == {"n": 7} and record["worker"] == "w1"
    code, out, err = await cli(capsys, "result", APP, "never", "--wait", "--timeout", "0.3",
                               *zk(zk_hosts, chroot))
    assert code == 1 and "no result for task 'never' of 'ops' within 0.3s" in err
    code, _out, err = await cli(capsys, "submit", APP, "handle", "{not json", *zk(zk_hosts, chroot))
    assert code == 2 and err.startswith("framework: error: the payload in PAYLOAD_JSON is not JSON")
    code, _out, err = await cli(capsys, "submit", "bad/app", "handle", "{}", *zk(zk_hosts, chroot))
    assert code == 2 and len(err.splitlines()) == 1


# ------------------------------------------------------------------ dead letters


async def test_dead_letters_list_requeue_purge(zk_hosts: str, chroot: str, session: Session,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    app = App(APP)
    client = Client(session, APP, create=True)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            worker = Echo(APP, name="w1")
            await serve(nursery, zk_hosts, chroot, worker)
            for key in ("d1", "d2", "d3"):
                await client.submit("handle", {"fail": key}, key=key)
            await wait_children(session, app.dead, 3)
            worker.request_stop()
            nursery.cancel_scope.cancel()
        await wait_children(session, app.workers, 0)
        code, out, err = await cli(capsys, "dead", APP, "list", "--json", *zk(zk_hosts, chroot))
        assert code == 0, err
        listed = json.loads(out)
        assert [d["key"] for d in listed] == ["d1", "d2", "d3"]
        assert all(d["attempts"] == 1 for d in listed)
        assert listed[0]["error"] == "cannot do d1" and listed[0]["payload"] == {"fail": "d1"}
        code, out, _ = await cli(capsys, "dead", APP, "list", *zk(zk_hosts, chroot))
        assert code == 0 and "cannot do d2" in out and listed[1]["name"] in out

        code, out, err = await cli(capsys, "dead", APP, "requeue", "d2", *zk(zk_hosts, chroot))
        assert code == 0 and out.startswith("requeued d2 (dead letter"), err
        assert [d.key for d in await client.dead_letters()] == ["d1", "d3"]
        items = await wait_children(session, f"{app.tasks}/items", 1)
        assert len(await session.children(f"{app.tasks}/items/{items[0]}")) == 1

        for bad in (["requeue", "nope"], ["requeue"], ["requeue", "d1", "--all"],
                    ["purge", "d1"]):
            code, out, err = await cli(capsys, "dead", APP, *bad, *zk(zk_hosts, chroot))
            assert code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, bad
        assert len(await client.dead_letters()) == 2  # nothing done by a refused command

        code, out, _ = await cli(capsys, "dead", APP, "requeue", "--all", *zk(zk_hosts, chroot))
        assert code == 0 and out.splitlines()[-1] == "requeued 2 dead letter(s) of 'ops'"
        assert await client.dead_letters() == []
        await client.submit("handle", {"fail": "d4"}, key="d4")
        async with trio.open_nursery() as nursery:
            worker = Echo(APP, name="w2")
            await serve(nursery, zk_hosts, chroot, worker)
            await wait_children(session, app.dead, 4)
            worker.request_stop()
            nursery.cancel_scope.cancel()
        code, out, _ = await cli(capsys, "dead", APP, "purge", *zk(zk_hosts, chroot))
        assert code == 0 and out == "deleted 4 dead letter(s) of 'ops'\n"
        assert await session.children(app.dead) == []


# ------------------------------------------------------------------ purge and cancel


async def test_purge_refuses_while_processes_are_alive(
        zk_hosts: str, chroot: str, session: Session,
        capsys: pytest.CaptureFixture[str]) -> None:
    app = App(APP)
    await Client(session, APP, create=True).submit("handle", {"n": 1})
    await session.ensure_path(app.workers)
    await session.create(f"{app.workers}/w1", b"{}", ephemeral=True)
    code, out, err = await cli(capsys, "purge", APP, *zk(zk_hosts, chroot))
    assert code == 2 and out == ""
    assert err == ("framework: error: application 'ops' has 0 master(s) and 1 worker(s) "
                   "alive: stop them first, or pass --force (they are told to leave first)\n")
    assert await session.exists(app.base) is not None
    # a member that never leaves (no process behind it to drain): nothing is deleted
    code, out, err = await cli(capsys, "purge", APP, "--force", "--grace", "0.5",
                               *zk(zk_hosts, chroot))
    assert code == 2 and out == "" and len(err.splitlines()) == 1
    assert "still has 0 master(s) and 1 worker(s) alive 0.5s after it was cancelled" in err
    assert await session.exists(app.cancel) is not None  # it was told to leave
    await session.delete(f"{app.workers}/w1")
    code, out, err = await cli(capsys, "purge", APP, "--force", *zk(zk_hosts, chroot))
    assert (code, out, err) == (0, "deleted /apps/ops\n", "")
    assert await session.exists(app.base) is None
    code, out, err = await cli(capsys, "purge", APP, *zk(zk_hosts, chroot))
    assert code == 1 and out == ""
    assert err == "framework: no application 'ops' in this ZooKeeper (there are none)\n"


async def test_cancel_is_shown_by_apps_and_status(zk_hosts: str, chroot: str,
                                                  session: Session,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    client = Client(session, APP, create=True)
    await client.submit("handle", {"n": 1}, key="a")
    await client.submit("handle", {"n": 2}, key="b")
    code, out, err = await cli(capsys, "cancel", "absent", *zk(zk_hosts, chroot))
    assert code == 2 and err == ("framework: error: no application 'absent' in this ZooKeeper "
                                 "(known: ops)\n")
    assert await session.exists("/apps/absent") is None
    code, out, _ = await cli(capsys, "cancel", APP, *zk(zk_hosts, chroot))
    assert code == 0 and out.startswith("cancelled 'ops'")
    assert await session.exists(App(APP).cancel) is not None
    code, out, _ = await cli(capsys, "cancel", APP, *zk(zk_hosts, chroot))
    assert code == 0 and out.startswith("'ops' was already cancelled")
    code, out, _ = await cli(capsys, "apps", "--json", *zk(zk_hosts, chroot))
    (row,) = json.loads(out)
    assert row == {"name": APP, "leader": None, "masters": 0, "workers": 0,
                   "queue_depth": 2, "done": False, "cancelled": True, "generation": 1,
                   "state": "cancelled"}
    code, out, _ = await cli(capsys, "status", APP, "--json", *zk(zk_hosts, chroot))
    assert code == 0 and json.loads(out)["state"] == "cancelled"
    code, out, _ = await cli(capsys, "status", APP, *zk(zk_hosts, chroot))
    assert "cancelled" in out
    code, _out, err = await cli(capsys, "submit", APP, "handle", "{}", *zk(zk_hosts, chroot))
    assert code == 2 and "is cancelled: it takes no new tasks" in err
    with pytest.raises(FrameworkError):
        await Client(session, "absent").cancel()


# ------------------------------------------------------------------ apps and status


async def test_apps_and_status_show_leader_standbys_workers_and_progress(
        zk_hosts: str, chroot: str, session: Session,
        capsys: pytest.CaptureFixture[str]) -> None:
    long_name = "worker-with-a-rather-long-name-that-must-not-be-cut-" + "x" * 30
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await serve(nursery, zk_hosts, chroot, Idle(APP, name="boss-a"))
            await wait_exists(session, App(APP).rendezvous)
            await serve(nursery, zk_hosts, chroot, Idle(APP, name="boss-b"))
            await wait_children(session, App(APP).masters, 2)
            worker = Echo(APP, name=long_name)
            await serve(nursery, zk_hosts, chroot, worker)
            await Client(session, APP, create=True).submit("handle", {"progress": True},
                                                           key="long-task")
            await Client(session, "other", create=True).submit("handle", {"n": 1})
            await wait_exists(session, f"{App(APP).running}/long-task")
            await wait_progress(session, f"{App(APP).running}/long-task")
            apps = await cli(capsys, "apps", "--json", *zk(zk_hosts, chroot))
            apps_table = await cli(capsys, "apps", *zk(zk_hosts, chroot))
            table = await cli(capsys, "status", APP, *zk(zk_hosts, chroot))
            as_json = await cli(capsys, "status", APP, "--json", *zk(zk_hosts, chroot))
            worker.release.set()
            worker.request_stop()
            nursery.cancel_scope.cancel()
    rows = {r["name"]: r for r in json.loads(apps[1])}
    assert rows[APP]["leader"] == "boss-a" and rows[APP]["masters"] == 2
    assert rows[APP]["workers"] == 1 and rows[APP]["state"] == "active"
    assert rows["other"]["leader"] is None and rows["other"]["queue_depth"] == 1
    assert "boss-a" in apps_table[1] and "no leader" in apps_table[1]
    code, out, _ = table
    assert code == 0 and long_name in out  # whole: no column is cut
    assert "standby" in out and "boss-b" in out and "3/10 (30%) a third" in out
    doc = json.loads(as_json[1])
    assert doc["leader"]["name"] == "boss-a" and [s["name"] for s in doc["standbys"]] == [
        "boss-b"]
    assert doc["running"]["long-task"]["done"] == 3 and doc["state"] == "active"


async def wait_progress(session: Session, path: str) -> None:
    while True:
        fired = trio.Event()
        data, _ = await session.get(path, watch=session.waker(fired))
        if b"a third" in data:
            return
        await fired.wait()


async def test_status_watch_renders_again_on_changes(zk_hosts: str, chroot: str,
                                                     session: Session) -> None:
    app = App(APP)
    await Client(session, APP, create=True).submit("handle", {"n": 1})
    argv = [sys.executable, "-m", "framework", "status", APP, "--watch", "--json",
            "--interval", "0.1", "--zk", f"{zk_hosts}{chroot}"]
    async with spawn(argv, pipe_stdout=True, env={"FRAMEWORK_ZK_HOSTS": None}) as watch:
        assert watch.lines is not None
        with trio.fail_after(30):
            first = json.loads(await watch.lines.next())
            assert first["queue_depth"] == 1 and first["workers"] == {}
            await session.ensure_path(app.workers)
            await session.create(f"{app.workers}/w9", b'{"name": "w9"}', ephemeral=True)
            while "w9" not in json.loads(await watch.lines.next())["workers"]:
                pass
            await Client(session, APP, create=True).submit("handle", {"n": 2})
            while json.loads(await watch.lines.next())["queue_depth"] != 2:
                pass  # rendered again on the change (a watch fired; nothing polls)
            watch.process.send_signal(signal.SIGINT)
            assert await watch.wait() == 130


# ------------------------------------------------------------------ connection strings


def test_split_chroot() -> None:
    assert split_chroot("h:1,h:2") == ("h:1,h:2", None)
    assert split_chroot("h:1,h:2/a/b") == ("h:1,h:2", "/a/b")
    assert split_chroot("h:1/a", "/b") == ("h:1", "/a/b")
    assert split_chroot("h:1/", None) == ("h:1", None)
    assert split_chroot("h:1", "/c") == ("h:1", "/c")
    with pytest.raises(FrameworkError, match="empty component"):
        split_chroot("h:1/a//b")


async def test_chroot_in_the_connect_string(zk_hosts: str, chroot: str, session: Session,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = await cli(capsys, "submit", APP, "handle", "[1, 2]", "--key", "in-chroot",
                               "--create", "--zk", f"{zk_hosts}{chroot}")
    assert (code, out) == (0, "in-chroot\n"), err
    assert await session.exists(App(APP).tasks) is not None  # in the fixture's chroot
    code, out, _ = await cli(capsys, "apps", "--json", "--zk", f"{zk_hosts}{chroot}")
    assert [a["name"] for a in json.loads(out)] == [APP]


@pytest.mark.parametrize(("hosts", "message"), [
    ("127.0.0.1:99999", "bad ZooKeeper hosts '127.0.0.1:99999'"),
    ("no-such-host.invalid:2181", "cannot resolve host no-such-host.invalid"),
    ("REFUSED", "connection refused by 127.0.0.1:"),
])
@pytest.mark.parametrize("command", [["apps"], ["status", "a"], ["result", "a", "k"],
                                     ["submit", "a", "handle", "{}"], ["dead", "a", "list"]])
def test_connection_mistakes_are_one_line_at_once(
        hosts: str, message: str, command: list[str],
        capsys: pytest.CaptureFixture[str]) -> None:
    if hosts == "REFUSED":
        from framework.zkserver import free_ports

        (port,) = free_ports(1)
        hosts = f"127.0.0.1:{port}"
    started = time.monotonic()
    code, out, err = run_cli(capsys, *command, "--zk", hosts, "--connect-timeout", "20")
    assert code == 2 and out == "" and message in err, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert time.monotonic() - started < 10  # not the 20 s connect timeout


def test_version_and_environment_in_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out.startswith("framework ")
    for command in ("apps", "status", "result", "dead", "purge", "cancel", "resume", "rerun",
                    "submit", "run",
                    "dashboard"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        out = " ".join(capsys.readouterr().out.split())
        assert "FRAMEWORK_ZK_HOSTS" in out and "FRAMEWORK_LOG_LEVEL" in out, command
    with pytest.raises(SystemExit):
        main(["status", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "results = tasks finished, successfully or failed for good" in out
    assert "done = tasks that process finished successfully" in out
