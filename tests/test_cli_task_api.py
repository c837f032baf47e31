"""The task API's surface as a new user meets it (issue 35, items 5-10): the outcome spelt
as in the docs, revoke of an id that is not there, the default of ``Client(create=)``, a
task type that cannot be checked yet, a module that does not compile, a wait that times
out saying what it waited for.  Against the real ZooKeeper of the test session."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import trio

from framework import Session
from framework.dashboard.asgi import dashboard_app
from framework.dashboard.model import Model
from framework.runtime import App, Client, Revocation
from framework.runtime.client import UnknownTask
from framework.runtime.operations.actions import UnknownApp
from tests.test_cli_ops import APP, Echo, cli, serve, wait_children, zk


async def finished(zk_hosts: str, chroot: str, session: Session, keys: list[str]) -> None:
    """Run a worker until the tasks of ``keys`` have their result records."""
    client = Client(session, APP)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            worker = Echo(APP, name="w1")
            await serve(nursery, zk_hosts, chroot, worker)
            for key in keys:
                await client.result(key, wait=True)
            worker.request_stop()
            nursery.cancel_scope.cancel()


async def test_the_outcome_is_spelt_as_documented(zk_hosts: str, chroot: str,
                                                  session: Session,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    client = Client(session, APP, create=True)
    await client.submit("handle", {"n": 1}, key="good")
    await client.submit("handle", {"fail": "it"}, key="bad")
    await finished(zk_hosts, chroot, session, ["good", "bad"])

    code, out, err = await cli(capsys, "result", APP, "good", *zk(zk_hosts, chroot))
    assert code == 0, err
    assert json.loads(out)["outcome"] == "succeeded"
    code, out, err = await cli(capsys, "result", APP, "bad", *zk(zk_hosts, chroot))
    assert code == 1 and json.loads(out)["outcome"] == "failed"

    web = dashboard_app(Model(), session)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=web),
                                 base_url="http://dashboard") as http:
        reply = await http.get("/api/result", params={"app": APP, "key": "good"})
    assert reply.status_code == 200
    assert reply.json()["result"]["outcome"] == "succeeded"


async def test_revoke_refuses_an_id_that_is_not_there(zk_hosts: str, chroot: str,
                                                      session: Session,
                                                      capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    app = App(APP)
    client = Client(session, APP, create=True)
    await client.submit("handle", {"n": 0}, key="other")  # the app exists, with a task
    code, out, err = await cli(capsys, "revoke", APP, "unknown-id", *zk(zk_hosts, chroot))
    assert (code, out) == (1, "")
    assert err == ("framework: no task 'unknown-id' of 'ops' is queued, delayed or running, "
                   "and it has no result: nothing revoked (framework status ops)\n")
    assert await session.exists(f"{app.revoked}/unknown-id") is None
    with pytest.raises(UnknownTask):
        await client.revoke("unknown-id")

    # the key was not poisoned: submitted now, it runs
    await client.submit("handle", {"n": 1}, key="unknown-id")
    # a task without a key (found among the queued items) and a delayed one are revoked
    plain = await client.submit("handle", {"n": 2})
    later = await client.submit("handle", {"n": 3}, countdown=3600)
    assert await client.revoke(plain.id) is Revocation.REVOKED
    assert await client.revoke(later.id) is Revocation.REVOKED
    assert await client.revoke(later.id) is Revocation.ALREADY
    await finished(zk_hosts, chroot, session, ["unknown-id", plain.id])
    assert (await client.result("unknown-id")).outcome.value == "succeeded"
    assert (await client.result(plain.id)).outcome.value == "revoked"
    assert await client.revoke("unknown-id") is Revocation.FINISHED


async def test_a_client_does_not_create_an_app_unless_asked(session: Session) -> None:
    with pytest.raises(UnknownApp, match=r"no application 'shpo' in this ZooKeeper .*"
                                         r"Client\(\.\.\., create=True\) creates it"):
        await Client(session, "shpo").submit("handle", 1)
    assert await session.exists(App("shpo").base) is None
    await Client(session, "shop", create=True).submit("handle", 1)
    assert await session.exists(App("shop").base) is not None


async def test_a_task_type_that_cannot_be_checked_yet_is_said(
        session: Session, capsys: pytest.CaptureFixture[str]) -> None:
    said: list[tuple[str, str]] = []
    client = Client(session, "early", create=True)
    client.unchecked = lambda app, name: said.append((app, name))  # type: ignore[method-assign]
    assert await client.task_types() == {}
    await client.submit("resze", {})
    assert said == [("early", "resze")]


async def test_a_wait_that_times_out_says_for_what(session: Session) -> None:
    client = Client(session, APP, create=True)
    with pytest.raises(trio.TooSlowError) as slow:
        await client.result("k9", wait=True, timeout=0.2)
    assert str(slow.value) == "no result for task 'k9' of 'ops' within 0.2s"


def test_a_module_that_does_not_compile_is_one_line(tmp_path: Path) -> None:
    package = tmp_path / "brokenpkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "jobs.py").write_text("from framework import Worker\n\nclass W(Worker:\n"
                                     "    pass\n")
    env = {k: v for k, v in os.environ.items() if k != "FRAMEWORK_ZK_HOSTS"}
    env["PYTHONPATH"] = os.pathsep.join([str(Path.cwd()), env.get("PYTHONPATH", "")])
    result = subprocess.run([sys.executable, "-m", "framework", "run", "brokenpkg.jobs:W",
                             "--zk", "127.0.0.1:1"], capture_output=True, text=True,
                            timeout=60, cwd=tmp_path, env=env)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith("framework: error: cannot import module 'brokenpkg.jobs': "
                                    f"SyntaxError at {package / 'jobs.py'}:3: "), result.stderr
    assert len(result.stderr.splitlines()) == 1, result.stderr


async def test_a_key_given_up_twice_is_one_dead_letter(
        zk_hosts: str, chroot: str, session: Session, capsys: pytest.CaptureFixture[str],
        captured_logs: list[dict[str, object]]) -> None:
    app = App(APP)
    client = Client(session, APP, create=True)
    await client.submit("handle", {"fail": "first"}, key="k")
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            worker = Echo(APP, name="w1")
            await serve(nursery, zk_hosts, chroot, worker)
            await wait_children(session, app.dead, 1)
            await client.submit("handle", {"fail": "again"}, key="k")  # failed: queued again
            await wait_children(session, app.dead, 2)
            worker.request_stop()
            nursery.cancel_scope.cancel()
    # in the order made: the queue's sequence number ends the item's name
    first, second = sorted(await session.children(app.dead),
                           key=lambda name: name.rpartition(".")[0][-10:])
    buried = [e for e in captured_logs if e["event"] == "queue.dead_lettered"]
    assert [e["error"] for e in buried] == ["PermanentFailure: cannot do first",
                                            "PermanentFailure: cannot do again"]

    code, out, err = await cli(capsys, "dead", APP, "list", "--json", *zk(zk_hosts, chroot))
    assert code == 0, err
    (listed,) = json.loads(out)
    assert (listed["key"], listed["name"], listed["older"]) == ("k", second, [first])
    assert listed["payload"] == {"fail": "again"} and listed["error"] == "cannot do again"
    code, out, err = await cli(capsys, "dead", APP, "list", *zk(zk_hosts, chroot))
    assert out.count("cannot do again") == 1 and "1 older, superseded" in out
    code, out, err = await cli(capsys, "dead", APP, "requeue", "k", *zk(zk_hosts, chroot))
    assert code == 0, err
    assert await session.children(app.dead) == []  # the newest requeued, the older deleted
