"""``framework inspect APP active|scheduled|delayed|types|queues``, ``framework submit --eta``
and the duties in ``framework status`` (issue 39, item 6), against the real ZooKeeper of the
test session."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import trio

from framework import Session, records
from framework.cli import parse_eta
from framework.errors import FrameworkError
from framework.runtime import App, Client, Master, MasterContext, every
from framework.runtime.scheduling.delayed import DelayedRecord
from framework.runtime.scheduling.schedules import NS, ScheduleRecord
from framework.zk import watch_data
from tests.test_cli_ops import APP, Echo, cli, serve, wait_children, zk


class Boss(Master):
    """A class whose schedules ``inspect scheduled --schedules`` reads (never run)."""

    app_name = APP
    schedules = [every(60, "handle", name="minutely")]

    async def lead(self, ctx: MasterContext) -> None:
        await trio.sleep_forever()


async def _duties(session: Session, app: App, worker: str, state: str) -> None:
    async for snap in watch_data(session, f"{app.workers}/{worker}"):
        if snap.exists and json.loads(snap.data).get("duties") == state:
            return


async def test_inspect_shows_what_runs_waits_and_is_delayed(
        zk_hosts: str, chroot: str, session: Session,
        capsys: pytest.CaptureFixture[str]) -> None:
    app = App(APP)
    client = Client(session, APP, create=True)
    client.unchecked = lambda *_: None  # type: ignore[method-assign]
    # before any worker registered its types: tasks of a type the worker lacks wait
    await client.submit("resize", {"n": 1}, priority=5)
    await client.submit("resize", {"n": 2}, priority=5)
    await client.submit("ocr", {"n": 3})
    later = await client.submit("handle", {"n": 4}, countdown=3600)
    await client.submit("handle", {"progress": True}, key="slow")
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            worker = Echo(APP, name="w1")
            await serve(nursery, zk_hosts, chroot, worker)
            await wait_children(session, app.running, 1)
            await _duties(session, app, "w1", "held")  # no master: the worker holds them

            code, out, err = await cli(capsys, "inspect", APP, "active", "--json",
                                       *zk(zk_hosts, chroot))
            assert code == 0, err
            [running] = json.loads(out)
            assert (running["task_id"], running["type"], running["worker"]) == (
                "slow", "handle", "w1")
            code, out, err = await cli(capsys, "inspect", APP, "active", *zk(zk_hosts, chroot))
            assert code == 0 and "slow" in out and "3/10 a third" in out

            code, out, err = await cli(capsys, "inspect", APP, "queues", "--json",
                                       *zk(zk_hosts, chroot))
            assert code == 0, err
            [queue] = json.loads(out)
            assert (queue["name"], queue["queued"], queue["claimed"]) == ("default", 4, 1)
            assert queue["lanes"] == {"0": 2, "5": 2}
            assert queue["types"] == {"handle": 1, "ocr": 1, "resize": 2}
            code, out, err = await cli(capsys, "inspect", APP, "queues", "--sample", "0",
                                       "--json", *zk(zk_hosts, chroot))
            assert json.loads(out)[0]["types"] is None

            code, out, err = await cli(capsys, "inspect", APP, "delayed", "--json",
                                       *zk(zk_hosts, chroot))
            assert code == 0, err
            delayed = json.loads(out)
            assert delayed["total"] == 1
            assert [(t["task_id"], t["type"]) for t in delayed["tasks"]] == [
                (later.id, "handle")]

            code, out, err = await cli(capsys, "inspect", APP, "types", "--json",
                                       *zk(zk_hosts, chroot))
            assert code == 0, err
            rows = {r["name"]: r["workers"] for r in json.loads(out)}
            assert rows["handle"] == ["w1"]
            code, out, err = await cli(capsys, "inspect", APP, "types", *zk(zk_hosts, chroot))
            assert "handle" in out and "w1" in out

            code, out, err = await cli(capsys, "status", APP, "--json", *zk(zk_hosts, chroot))
            assert json.loads(out)["duties"] == {"w1": "held"}
            code, out, err = await cli(capsys, "status", APP, *zk(zk_hosts, chroot))
            assert "w1 (moves delayed tasks" in out

            worker.release.set()
            worker.request_stop()
            nursery.cancel_scope.cancel()


async def test_inspect_scheduled_shows_delayed_tasks_and_next_fires(
        zk_hosts: str, chroot: str, session: Session,
        capsys: pytest.CaptureFixture[str]) -> None:
    app = App(APP)
    client = Client(session, APP, create=True)
    client.unchecked = lambda *_: None  # type: ignore[method-assign]
    task = await client.submit("handle", None, countdown=600)
    last = (time.time_ns() // (60 * NS)) * 60 * NS
    await session.create(f"{app.schedules}/minutely",
                         records.encode(ScheduleRecord.at(last, fires=7)), makepath=True)

    code, out, err = await cli(capsys, "inspect", APP, "scheduled", "--json",
                               "--schedules", "tests.test_inspect:Boss", *zk(zk_hosts, chroot))
    assert code == 0, err
    found = json.loads(out)
    assert [t["task_id"] for t in found["delayed"]["tasks"]] == [task.id]
    [schedule] = found["schedules"]
    assert (schedule["name"], schedule["fires"], schedule["every"]) == ("minutely", 7, "60s")
    assert schedule["next_fire"] == last / NS + 60  # the slot after the last one (and now)

    # without the class: the record only, and the table says how to get the next fire
    code, out, err = await cli(capsys, "inspect", APP, "scheduled", *zk(zk_hosts, chroot))
    assert code == 0, err
    assert "minutely" in out and "give --schedules" in out and task.id in out


async def test_inspect_of_a_missing_app_is_one_line(zk_hosts: str, chroot: str,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = await cli(capsys, "inspect", "nope", "active", *zk(zk_hosts, chroot))
    assert code == 2 and out == ""
    assert err.startswith("framework: error: no application 'nope' in this ZooKeeper")
    assert len(err.splitlines()) == 1


def test_eta_is_iso_8601_utc_unless_an_offset_says_otherwise() -> None:
    now = datetime(2026, 11, 28, 17, 0, tzinfo=UTC).timestamp()
    assert parse_eta("2026-11-28T18:00:00", now) == datetime(2026, 11, 28, 18, tzinfo=UTC)
    assert parse_eta("2026-11-28T18:00:00Z", now) == datetime(2026, 11, 28, 18, tzinfo=UTC)
    assert parse_eta("2026-11-28T19:30:00+01:00", now).timestamp() == now + 1.5 * 3600
    with pytest.raises(FrameworkError, match=r"is in the past .*now is 2026-11-28T17:00:00Z"):
        parse_eta("2026-11-28T16:59:59Z", now)
    with pytest.raises(FrameworkError, match="is not an ISO 8601 time"):
        parse_eta("tomorrow", now)


async def test_submit_eta_delays_the_task_to_that_time(zk_hosts: str, chroot: str,
                                                       session: Session,
                                                       capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    app = App(APP)
    await Client(session, APP, create=True).submit("handle", None, countdown=3600)
    when = (datetime.now(UTC) + timedelta(hours=2)).replace(microsecond=0)
    local = when.astimezone(datetime.now().astimezone().tzinfo)
    code, out, err = await cli(capsys, "submit", APP, "handle", "{}", "--eta",
                               local.isoformat(), *zk(zk_hosts, chroot))
    assert code == 0, err
    task_id = out.strip()
    due: dict[str, Any] = {}
    for bucket in await session.children(app.delayed):
        for name in await session.children(f"{app.delayed}/{bucket}"):
            data, _ = await session.get(f"{app.delayed}/{bucket}/{name}")
            record = records.decode(data, DelayedRecord)
            due[record.task.id] = record.due
    assert due[task_id] == when.timestamp()

    for args, message in (
            (["--eta", "soon"], "framework: error: --eta 'soon' is not an ISO 8601 time"),
            (["--eta", "2001-01-01T00:00:00"], "framework: error: --eta '2001-01-01T00:00:00' is "
                                               "in the past"),
            (["--eta", when.isoformat(), "--countdown", "5"],
             "framework: error: give --countdown or --eta, not both")):
        code, out, err = await cli(capsys, "submit", APP, "handle", *args,
                                   *zk(zk_hosts, chroot))
        assert (code, out) == (2, "")
        assert err.startswith(message) and len(err.splitlines()) == 1


async def test_the_dashboards_revoke_is_framework_revoke_behind_the_switch(
        session: Session) -> None:
    import httpx

    from framework.dashboard.asgi import dashboard_app
    from framework.dashboard.model import Model

    client = Client(session, APP, create=True)
    client.unchecked = lambda *_: None  # type: ignore[method-assign]
    later = await client.submit("handle", None, countdown=600)
    headers = {"X-Dashboard-Action": "1"}
    for allowed, body, status, answer in (
            (False, {"app": APP, "name": later.id}, 403, "--allow-actions"),
            (True, {"app": APP, "name": "nothing-here"}, 400, "nothing revoked"),
            (True, {"app": "nope", "name": later.id}, 400, "no application 'nope'"),
            (True, {"app": APP, "name": later.id}, 200, "revoked"),
            (True, {"app": APP, "name": later.id}, 200, "already")):
        web = dashboard_app(Model(allow_actions=allowed), session)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=web),
                                     base_url="http://dashboard") as http:
            reply = await http.post("/api/revoke", json=body, headers=headers)
        assert reply.status_code == status, reply.text
        doc = reply.json()
        assert answer in (doc.get("error") or doc.get("revocation")), doc
    assert await session.exists(f"{App(APP).revoked}/{later.id}") is not None


class Nameless(Master):
    """A class that names no app: the dashboard cannot tell whose schedules they are."""

    schedules = [every(60, "handle")]


def test_dashboard_schedules_of_a_class_without_an_app_is_one_line(
        zk_hosts: str, capsys: pytest.CaptureFixture[str]) -> None:
    from framework.cli import main

    code = main(["dashboard", "--zk", zk_hosts, "--port", "0",
                 "--schedules", "tests.test_inspect:Nameless"])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err == ("framework: error: --schedules tests.test_inspect:Nameless: the class "
                   "names no app_name\n")
