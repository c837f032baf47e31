"""`framework run` and `framework status`: clear errors, readable output, JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from framework import FrameworkError, Session
from framework.cli import one_shot
from framework.runtime import App, Master, MasterContext, Worker
from framework.runtime.launch import load_class
from framework.testing import TcpProxy, spawn
from framework.zk import wait_exists


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k != "FRAMEWORK_ZK_HOSTS"}
    return subprocess.run([sys.executable, "-m", "framework", *args], capture_output=True,
                          text=True, timeout=60, env=base | (env or {}))


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("nocolon", "expected MODULE:CLASS"),
        ("no_such_module_xyz:Thing", "cannot import module"),
        ("framework.runtime:Nope", "has no attribute"),
        ("framework.runtime:App", "not a subclass"),
    ],
)
def test_wrong_class_paths_give_clear_errors(spec: str, message: str) -> None:
    result = cli("run", spec, "--zk", "127.0.0.1:1")
    assert result.returncode == 2
    assert message in result.stderr and "Traceback" not in result.stderr


def test_missing_zookeeper_setting_says_how_to_start_one() -> None:
    result = cli("run", "framework.runtime:Worker")
    assert result.returncode == 2 and "FRAMEWORK_ZK_HOSTS" in result.stderr
    assert "python -m framework zk" in result.stderr


def test_unreachable_ensemble_is_a_clear_error() -> None:
    from framework.zkserver import free_ports

    (port,) = free_ports(1)
    result = cli("status", "myapp", "--zk", f"127.0.0.1:{port}", "--connect-timeout", "1")
    assert result.returncode == 2 and "could not connect" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("command", ["run framework.runtime:Worker --app a", "status myapp"])
def test_bad_hosts_string_is_one_line(command: str) -> None:
    result = cli(*command.split(), "--zk", "127.0.0.1:99999")
    assert result.returncode == 2 and "bad ZooKeeper hosts '127.0.0.1:99999'" in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.splitlines()) == 1


def test_typed_error_raised_in_lead_is_one_line(zk_hosts: str, chroot: str) -> None:
    """A FrameworkError from ``lead`` (here: a task over 1 MB) reaches the user as one line,
    exit status 2, though trio wrapped it in exception groups on its way out."""
    helpers = os.path.join(os.path.dirname(__file__), "helpers")
    result = cli("run", "rt_app:OversizedSubmitMaster", "--zk", zk_hosts, "--chroot", chroot,
                 env={"PYTHONPATH": helpers, "FRAMEWORK_LOG_LEVEL": "error"})
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and "ExceptionGroup" not in result.stderr
    (line,) = result.stderr.splitlines()
    assert line.startswith("framework: error:") and "bytes" in line


async def test_a_finished_job_prints_its_summary_and_fails_on_dead_letters(
    zk_hosts: str, chroot: str, tmp_path: Path
) -> None:
    """``framework run`` of a master whose job dead-lettered a task prints how the job ended
    and exits 1; the job-done record carries the same counts."""
    helpers = os.path.join(os.path.dirname(__file__), "helpers")
    env = {"PYTHONPATH": helpers, "FRAMEWORK_LOG_LEVEL": "error"}
    async with spawn(
            [sys.executable, "-m", "framework", "run", "rt_app:PoisonWorker", "--zk", zk_hosts,
             "--chroot", chroot], name="worker", log_dir=tmp_path, env=env):
        result = await trio.to_thread.run_sync(lambda: cli(
            "run", "rt_app:PoisonMaster", "--zk", zk_hosts, "--chroot", chroot, env=env))
    assert result.returncode == 1, result.stderr
    assert "job done: 3 result records, 1 dead-lettered" in result.stdout
    status = cli("status", "rt-poison", "--zk", zk_hosts, "--chroot", chroot, "--json")
    done = json.loads(status.stdout)["done"]
    assert (done["results"], done["dead_letters"]) == (3, 1)


async def test_running_a_cancelled_app_says_so(zk_hosts: str, chroot: str) -> None:
    """``framework run`` of a worker or a master of a cancelled app stops at once and says
    why, and how to undo it, in one line (it used to exit without a word)."""
    from framework.runtime import Client

    async with Session(zk_hosts, chroot=chroot) as s:
        await s.ensure_path(App("rt-poison").base)
        assert await Client(s, "rt-poison").cancel(by="test")
    helpers = os.path.join(os.path.dirname(__file__), "helpers")
    env = {"PYTHONPATH": helpers, "FRAMEWORK_LOG_LEVEL": "error"}
    for component in ("rt_app:PoisonWorker", "rt_app:PoisonMaster"):
        result = await trio.to_thread.run_sync(lambda c=component: cli(
            "run", c, "--zk", zk_hosts, "--chroot", chroot, env=env))
        assert result.returncode == 0, result.stderr
        (line,) = result.stderr.splitlines()
        assert "'rt-poison' is cancelled" in line and "framework resume rt-poison" in line


async def test_one_shot_command_ends_when_zookeeper_stops_answering(proxy: TcpProxy) -> None:
    """ZooKeeper dies mid-command (its connection frozen): the command's overall deadline
    ends it with one clear error instead of waiting for a reconnect forever."""

    async def work(session: Session) -> None:
        await session.ensure_path("/oneshot")
        proxy.freeze()
        await session.get("/oneshot")

    with trio.fail_after(30):
        with pytest.raises(FrameworkError, match="did not answer within 2s"):
            await trio.to_thread.run_sync(
                lambda: one_shot(proxy.address, work, deadline=2.0))


def test_status_through_a_dead_connection_is_one_line(proxy: TcpProxy) -> None:
    proxy.freeze()
    result = cli("status", "myapp", "--zk", proxy.address, "--timeout", "2")
    assert result.returncode == 2 and "within 2s" in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.splitlines()) == 1


def test_load_class_accepts_masters_and_workers() -> None:
    assert load_class("framework.runtime:Master") is Master
    assert load_class("framework.runtime:Worker") is Worker


async def test_status_table_and_json(zk_hosts: str, chroot: str) -> None:
    class Idle(Master):
        async def lead(self, ctx: MasterContext) -> None:
            await ctx.submit("handle", {"x": 1})
            await trio.sleep_forever()

    async with Session(zk_hosts, chroot=chroot) as s:
        async with trio.open_nursery() as nursery:
            master = Idle(App("shown"), name="boss", address="127.0.0.1:7000")
            nursery.start_soon(master.run, s)
            with trio.fail_after(20):
                await wait_exists(s, "/apps/shown/rendezvous")
            table = await trio.to_thread.run_sync(
                lambda: cli("status", "shown", "--zk", zk_hosts, "--chroot", chroot))
            as_json = await trio.to_thread.run_sync(
                lambda: cli("status", "shown", "--zk", zk_hosts, "--chroot", chroot, "--json"))
            missing = await trio.to_thread.run_sync(
                lambda: cli("status", "absent", "--zk", zk_hosts, "--chroot", chroot))
            nursery.cancel_scope.cancel()
    assert table.returncode == 0 and "boss" in table.stdout and "queue depth" in table.stdout
    doc = json.loads(as_json.stdout)
    assert doc["leader"]["name"] == "boss" and doc["queue_depth"] == 1
    assert missing.returncode == 1 and missing.stdout == ""
    assert missing.stderr == "framework: no application 'absent' in this ZooKeeper (known: shown)\n"
