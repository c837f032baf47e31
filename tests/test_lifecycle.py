"""An app's lifecycle from the command line, against a real ZooKeeper: unknown apps are
refused (naming the known ones), purge --force drains live processes first, resume undoes a
cancel, rerun starts a new job generation (and a finished job's master says so), a keyed
submit says what exists, result exits 1 for a failure, run --concurrency."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from framework import PermanentFailure, Session, records
from framework.runtime import App, Client, Master, MasterContext, Task, Worker
from framework.runtime.operations.actions import history_path, rerun
from framework.runtime.operations.status import generations
from framework.runtime.records import JobDone, PastRun
from framework.testing import spawn
from framework.zk import wait_exists
from tests.test_cli_ops import Idle, cli, unchecked, wait_children, zk

HELPERS = os.path.join(os.path.dirname(__file__), "helpers")


class Echo(Worker):
    """Returns the payload, or fails for good on ``"fail"``."""

    max_attempts = 1

    async def handle(self, task: Task) -> Any:
        if task.payload == "fail":
            raise PermanentFailure("told to fail")
        return task.payload


class Job(Master):
    """Submits keys ``a`` and ``b`` and waits until they are done."""

    async def lead(self, ctx: MasterContext) -> None:
        await ctx.submit_many("handle", [1, 2], keys=["a", "b"])
        await ctx.wait_idle()


async def start(nursery: trio.Nursery, hosts: str, chroot: str, component: Any,
                stopped: trio.Event | None = None) -> None:
    """Run ``component`` on a session of its own; ``stopped`` is set when its ``run``
    returned (the session stays open: a write after that would still be seen)."""

    async def hold(task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        async with Session(hosts, chroot=chroot, session_timeout=4.0) as s:
            task_status.started()
            await component.run(s)
            if stopped is not None:
                stopped.set()
            await trio.sleep_forever()

    await nursery.start(hold)


def run_cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "FRAMEWORK_ZK_HOSTS"}
    env |= {"PYTHONPATH": HELPERS, "FRAMEWORK_LOG_LEVEL": "error"}
    return subprocess.run([sys.executable, "-m", "framework", *args], capture_output=True,
                          text=True, timeout=120, env=env, input=stdin)


# ------------------------------------------------------------------ unknown apps


async def test_commands_on_an_unknown_app_refuse_naming_the_known_ones(
        zk_hosts: str, chroot: str, session: Session,
        capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = await cli(capsys, "submit", "thumbnails", "handle", "{}", "--create",
                               *zk(zk_hosts, chroot))
    assert code == 0 and err == unchecked("thumbnails"), err
    known = "(known: thumbnails)"
    for command in (["submit", "thumbnial", "handle", "{}"], ["dead", "thumbnial", "list"],
                    ["result", "thumbnial", "k"], ["cancel", "thumbnial"],
                    ["resume", "thumbnial"], ["rerun", "thumbnial"],
                    ["revoke", "thumbnial", "t1"]):
        code, out, err = await cli(capsys, *command, *zk(zk_hosts, chroot))
        assert code == 2 and out == "", command
        assert err.startswith("framework: error: no application 'thumbnial' in this "
                              f"ZooKeeper {known}"), err
        assert len(err.splitlines()) == 1, err
    code, out, err = await cli(capsys, "submit", "thumbnial", "handle", "{}",
                               *zk(zk_hosts, chroot))
    assert err.rstrip().endswith("--create to create it")
    for command in (["status", "thumbnial"], ["purge", "thumbnial"]):
        code, out, err = await cli(capsys, *command, *zk(zk_hosts, chroot))
        assert (code, out) == (1, "") and err == (
            f"framework: no application 'thumbnial' in this ZooKeeper {known}\n"), command
    assert await session.exists(App("thumbnial").base) is None  # nothing created


# ------------------------------------------------------------------ purge, resume


async def test_purge_force_tells_live_processes_to_leave_then_deletes(
        zk_hosts: str, chroot: str, session: Session,
        capsys: pytest.CaptureFixture[str]) -> None:
    app = App("lc-purge")
    worker_gone, master_gone = trio.Event(), trio.Event()
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await start(nursery, zk_hosts, chroot, Idle(app, name="m1"), master_gone)
            await start(nursery, zk_hosts, chroot, Echo(app, name="w1"), worker_gone)
            await wait_exists(session, app.rendezvous)
            await wait_children(session, app.workers, 1)
            client = Client(session, app)
            await client.submit("handle", 5, key="p1")
            assert (await client.result("p1", wait=True)).result == 5
            code, out, err = await cli(capsys, "purge", app.name, "--force",
                                       *zk(zk_hosts, chroot))
            assert (code, out) == (0, "deleted /apps/lc-purge\n"), err
            logged = [err]  # the processes' own logs (this process's stderr)
            # they drained and left before the delete; nothing of them comes back
            await worker_gone.wait()
            await master_gone.wait()
            assert await session.exists(app.base) is None
            nursery.cancel_scope.cancel()
    assert await session.exists(app.base) is None
    logged.append(capsys.readouterr().err)
    assert "master.cancelled" in logged[0] and "worker.cancelled" in logged[0]
    for noise in ("NoNode", "task.released", "worker.slot_error", "Traceback"):
        assert noise not in "".join(logged), noise


async def test_resume_undoes_a_cancel(zk_hosts: str, chroot: str, session: Session,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    client = Client(session, "lc-resume", create=True)
    await client.submit("handle", 1)
    code, out, _ = await cli(capsys, "resume", "lc-resume", *zk(zk_hosts, chroot))
    assert (code, out) == (0, "'lc-resume' was not cancelled: nothing to resume\n")
    code, out, _ = await cli(capsys, "cancel", "lc-resume", *zk(zk_hosts, chroot))
    assert code == 0
    with pytest.raises(Exception, match="is cancelled"):
        await client.submit("handle", 2)
    code, out, err = await cli(capsys, "resume", "lc-resume", *zk(zk_hosts, chroot))
    assert code == 0 and err == ""
    assert out.startswith("resumed 'lc-resume': deleted its cancel node (cancelled at ")
    assert "by " in out and out.rstrip().endswith("start its masters and workers")
    assert await session.exists(App("lc-resume").cancel) is None
    await client.submit("handle", 2)  # taken again


# ------------------------------------------------------------------ generations


async def test_a_finished_job_is_not_led_again_until_rerun(
        zk_hosts: str, chroot: str, session: Session,
        capsys: pytest.CaptureFixture[str]) -> None:
    app = App("lc-gen")
    client = Client(session, app)
    with trio.fail_after(90):
        async with trio.open_nursery() as nursery:
            worker = Echo(app, name="w1")
            await start(nursery, zk_hosts, chroot, worker)
            first = Job(app, name="m1")
            async with Session(zk_hosts, chroot=chroot) as s:
                await first.run(s)
            assert first.summary == {"results": 2, "dead_letters": 0}
            assert worker.tasks_done == 2

            again = Job(app, name="m2")
            async with Session(zk_hosts, chroot=chroot) as s:
                await again.run(s)
            assert again.terms_led == 0 and again.already_done is not None
            assert (again.already_done.master, again.already_done.results) == ("m1", 2)

            code, out, err = await cli(capsys, "rerun", app.name, *zk(zk_hosts, chroot))
            assert code == 0 and err == "", err
            assert out.startswith("'lc-gen': generation 1 kept in /apps/lc-gen/history (2 "
                                  "result records, 0 dead-lettered)")
            assert "the next master started runs generation 2" in out
            assert await session.exists(app.done) is None
            assert await client.result("a") is None  # so the job's keys run again
            (past,) = await generations(session, app)
            assert (past.generation, past.done.master, past.done.results) == (1, "m1", 2)
            code, out, err = await cli(capsys, "status", app.name, "--json",
                                       *zk(zk_hosts, chroot))
            shown = json.loads(out)
            assert shown["generation"] == 2 and shown["past_runs"][0]["done"]["master"] == "m1"
            code, out, err = await cli(capsys, "status", app.name, *zk(zk_hosts, chroot))
            assert "generation" in out and "rerun 1 time(s)" in out and "by m1" in out
            code, out, err = await cli(capsys, "apps", *zk(zk_hosts, chroot))
            assert "generation" in out and any(
                line.split()[:3] == ["│", "lc-gen", "│"] and "2" in line.split()
                for line in out.splitlines()), out

            third = Job(app, name="m3")
            async with Session(zk_hosts, chroot=chroot) as s:
                await third.run(s)
            assert third.terms_led == 1 and third.summary == {"results": 2, "dead_letters": 0}
            assert worker.tasks_done == 4  # both tasks ran again
            worker.request_stop()
            nursery.cancel_scope.cancel()

    code, out, err = await cli(capsys, "cancel", app.name, *zk(zk_hosts, chroot))
    code, out, err = await cli(capsys, "rerun", app.name, *zk(zk_hosts, chroot))
    assert code == 2 and "is cancelled: `framework resume lc-gen` first" in err
    await cli(capsys, "resume", app.name, *zk(zk_hosts, chroot))
    await session.delete(app.done)
    code, out, err = await cli(capsys, "rerun", app.name, *zk(zk_hosts, chroot))
    assert code == 2 and err == ("framework: error: the job of 'lc-gen' is not finished (no "
                                 "done record): nothing to rerun\n")
    assert len(await generations(session, app)) == 1


async def test_a_rerun_cut_short_is_finished_by_running_it_again(session: Session) -> None:
    app = App("lc-cut")
    done = JobDone("m1", 1.0, 1, 3, 0)
    await session.create(app.done, records.encode(done), makepath=True)
    # a first rerun kept the history record, then stopped before deleting anything
    await session.create(f"{history_path(app)}/g-000001",
                         records.encode(PastRun(1, done, 2.0, "first")), makepath=True)
    await session.create(f"{app.dead}/letter", b"{}", makepath=True)
    past = await rerun(session, app, by="second")
    assert (past.generation, past.by, past.done) == (1, "first", done)  # not kept twice
    assert len(await generations(session, app)) == 1
    assert await session.exists(app.done) is None and await session.children(app.dead) == []


def test_a_finished_jobs_master_says_so_in_one_line(zk_hosts: str, chroot: str) -> None:
    where = ["--zk", zk_hosts, "--chroot", chroot]
    first = run_cli("run", "lifecycle_app:Quick", *where)
    assert first.returncode == 0 and first.stderr == "", first.stderr
    assert first.stdout == "job done: 0 result records, 0 dead-lettered\n"
    second = run_cli("run", "lifecycle_app:Quick", *where)
    assert second.returncode == 0 and second.stdout == ""
    (line,) = second.stderr.splitlines()
    assert line.startswith("framework: the job of 'lc-quick' is already done (by ")
    assert line.endswith("0 result records, 0 dead-lettered); `framework rerun lc-quick` "
                         "starts a new generation")
    rerun = run_cli("rerun", "lc-quick", *where)
    assert rerun.returncode == 0, rerun.stderr
    third = run_cli("run", "lifecycle_app:Quick", *where)
    assert third.returncode == 0 and third.stdout.startswith("job done:"), third.stderr


# ------------------------------------------------------------------ keys and results


async def test_a_keyed_submit_says_what_exists_and_result_exits_1_on_failure(
        zk_hosts: str, chroot: str, session: Session,
        capsys: pytest.CaptureFixture[str]) -> None:
    app = App("lc-keys")
    where = zk(zk_hosts, chroot)
    code, out, err = await cli(capsys, "submit", app.name, "handle", '"ok"', "--key", "k1",
                               "--create", *where)
    assert (code, out, err) == (0, "k1\n", unchecked(app.name))
    code, out, err = await cli(capsys, "submit", app.name, "handle", '"ok"', "--key", "k1",
                               *where)
    assert code == 2 and out == "" and err == (
        "framework: error: task 'k1' of 'lc-keys' is queued: not queued again "
        "(framework status lc-keys)\n")
    code, out, err = await cli(capsys, "submit", app.name, "handle", '"fail"', "--key", "f1",
                               *where)
    assert code == 0
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            worker, stopped = Echo(app, name="w1"), trio.Event()
            await start(nursery, zk_hosts, chroot, worker, stopped)
            client = Client(session, app)
            await client.result("k1", wait=True)
            await client.result("f1", wait=True)
            worker.request_stop()
            await stopped.wait()  # drained: f1's item is dead-lettered, not queued
            nursery.cancel_scope.cancel()
    code, out, err = await cli(capsys, "submit", app.name, "handle", '"ok"', "--key", "k1",
                               *where)
    assert code == 2 and len(err.splitlines()) == 1
    assert "task 'k1' of 'lc-keys' succeeded at " in err and "(worker w1)" in err
    assert err.rstrip().endswith("not queued again (framework result lc-keys k1)")

    code, out, err = await cli(capsys, "result", app.name, "k1", *where)
    assert code == 0 and json.loads(out)["result"] == "ok" and err == ""
    code, out, err = await cli(capsys, "result", app.name, "f1", *where)
    assert code == 1 and json.loads(out)["error"] == "told to fail"  # printed, and status 1
    assert err == "framework: task 'f1' of 'lc-keys' failed: told to fail\n"

    # a key that failed for good runs again when submitted again, and says so
    code, out, err = await cli(capsys, "submit", app.name, "handle", '"ok"', "--key", "f1",
                               *where)
    assert (code, out) == (0, "f1\n")
    assert err.startswith("framework: task 'f1' of 'lc-keys' failed at ")
    assert err.rstrip().endswith("(told to fail): queued again")


# ------------------------------------------------------------------ --concurrency


async def test_run_concurrency_overrides_the_worker_class(
        zk_hosts: str, chroot: str, session: Session, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """``Together`` (concurrency 1) finishes its tasks only if 3 run at once: with
    ``--concurrency 3`` they do."""
    client = Client(session, "lc-together", create=True)
    for n in range(3):
        await client.submit("handle", n, key=f"t{n}")
    env = {"FRAMEWORK_ZK_HOSTS": None, "PYTHONPATH": HELPERS,
           "FRAMEWORK_LOG_LEVEL": "error"}
    async with spawn([sys.executable, "-m", "framework", "run", "lifecycle_app:Together",
                      "--concurrency", "3", "--zk", zk_hosts, "--chroot", chroot],
                     name="together", env=env, log_dir=tmp_path):
        with trio.fail_after(60):
            for n in range(3):
                record = await client.result(f"t{n}", wait=True)
                assert record is not None and record.result == {"running_at_once": 3}
    master = run_cli("run", "lifecycle_app:Quick", "--concurrency", "2", "--zk", zk_hosts,
                     "--chroot", chroot)
    assert master.returncode == 2 and master.stderr == (
        "framework: error: --concurrency is for workers; lifecycle_app:Quick is a Master\n")
    zero = run_cli("run", "lifecycle_app:Together", "--concurrency", "0")
    assert zero.returncode == 2 and "must be 1 or more: '0'" in zero.stderr
