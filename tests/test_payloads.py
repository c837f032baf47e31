"""Payloads: from a file or standard input, the 64 KiB limit refused in one line, and large
payloads stored off ZooKeeper by reference (read back by the worker, deleted at the ack):
against a real ZooKeeper."""

from __future__ import annotations

import io
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from framework import DataTooLargeError, Session
from framework.primitives.queue import WorkQueue
from framework.runtime import App, Client, LocalDirectoryStore, PayloadMissing, Task, Worker
from framework.runtime.payloads import STORE_ENV
from tests.test_cli_ops import cli, unchecked, zk
from tests.test_lifecycle import start

APP = "payloads"
BIG = {"blob": "x" * 200_000}  # about 200 KB as JSON: over the 64 KiB of a queue item


class Sizer(Worker):
    """Returns the size of its payload as JSON, and the payload's first key."""

    app_name = APP
    max_attempts = 1

    async def handle(self, task: Task) -> Any:
        return {"bytes": len(json.dumps(task.payload)),
                "first": next(iter(task.payload)) if isinstance(task.payload, dict) else None}


async def run_until(hosts: str, chroot: str, worker: Worker, client: Client,
                    keys: list[str]) -> dict[str, Any]:
    """Run ``worker`` until every key has a record, then drain it; the records."""
    records: dict[str, Any] = {}
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            stopped = trio.Event()
            await start(nursery, hosts, chroot, worker, stopped)
            for key in keys:
                records[key] = await client.result(key, wait=True)
            worker.request_stop()
            await stopped.wait()  # drained: every acknowledged task's payload deleted
            nursery.cancel_scope.cancel()
    return records


async def queued_tasks(session: Session, app: App) -> list[Task]:
    """The tasks in the queue's items, read where they lie (nothing taken)."""
    out = []
    items = f"{app.tasks}/items"
    for bucket in sorted(await session.children(items)):
        for name in sorted(await session.children(f"{items}/{bucket}")):
            out.append(Task.decode((await session.get(f"{items}/{bucket}/{name}"))[0]))
    return out


async def test_payload_from_a_file_or_standard_input(
        zk_hosts: str, chroot: str, session: Session, capsys: pytest.CaptureFixture[str],
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    where = zk(zk_hosts, chroot)
    payload_file = tmp_path / "payload.json"
    payload_file.write_text('{"from": "file"}')
    code, out, err = await cli(capsys, "submit", APP, "handle", "--payload-file",
                               str(payload_file), "--key", "pf", "--create", *where)
    assert (code, out, err) == (0, "pf\n", unchecked(APP))
    monkeypatch.setattr(sys, "stdin", io.StringIO('{"from": "stdin"}'))
    code, out, err = await cli(capsys, "submit", APP, "handle", "--payload-file", "-",
                               "--key", "ps", *where)
    assert (code, out, err) == (0, "ps\n", unchecked(APP))
    for bad, message in (
        (["{}", "--payload-file", str(payload_file)], "give PAYLOAD_JSON or --payload-file"),
        (["--payload-file", str(tmp_path / "missing.json")],
         f"cannot read --payload-file {tmp_path / 'missing.json'}: No such file"),
    ):
        code, out, err = await cli(capsys, "submit", APP, "handle", *bad, *where)
        assert code == 2 and message in err and len(err.splitlines()) == 1, err
    (tmp_path / "bad.json").write_text("{nope")
    code, out, err = await cli(capsys, "submit", APP, "handle", "--payload-file",
                               str(tmp_path / "bad.json"), *where)
    assert code == 2 and err.startswith(f"framework: error: the payload in {tmp_path}/bad.json "
                                        "is not JSON")
    records = await run_until(zk_hosts, chroot, Sizer(APP, name="w1"), Client(session, APP),
                              ["pf", "ps"])
    assert records["pf"].result["first"] == "from" and records["ps"].ok


async def test_a_payload_over_the_limit_is_refused_in_one_line(
        zk_hosts: str, chroot: str, session: Session, capsys: pytest.CaptureFixture[str],
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(STORE_ENV, raising=False)
    big = tmp_path / "big.json"
    big.write_text(json.dumps(BIG))
    code, out, err = await cli(capsys, "submit", APP, "handle", "--payload-file", str(big),
                               "--create", *zk(zk_hosts, chroot))
    assert code == 2 and out == "" and len(err.splitlines()) == 1, err
    assert "over the 65,536-byte limit of a queue item" in err and STORE_ENV in err
    client = Client(session, APP, create=True)
    for countdown in (None, 30.0):  # queued now, or delayed: the same limit
        with pytest.raises(DataTooLargeError, match="payload_store="):
            await client.submit("handle", BIG, countdown=countdown)
    assert await WorkQueue(session, App(APP).tasks).size() == 0
    assert await session.exists(App(APP).delayed) is None or \
        await session.children(App(APP).delayed) == []


async def test_a_large_payload_goes_by_reference_and_is_deleted_at_the_ack(
        zk_hosts: str, chroot: str, session: Session, capsys: pytest.CaptureFixture[str],
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = tmp_path / "store"
    monkeypatch.setenv(STORE_ENV, str(store))  # the CLI's and the worker's (same machine)
    big = tmp_path / "big.json"
    big.write_text(json.dumps(BIG))
    code, out, err = await cli(capsys, "submit", APP, "handle", "--payload-file", str(big),
                               "--key", "big", "--create", *zk(zk_hosts, chroot))
    assert (code, out, err) == (0, "big\n", unchecked(APP))
    (stored,) = os.listdir(store)
    assert json.loads((store / stored).read_bytes()) == BIG
    (task,) = await queued_tasks(session, App(APP))
    assert task.payload is None and task.payload_ref == stored  # only the reference queued
    small = await Client(session, APP).submit("handle", {"small": 1}, key="small")
    assert small.payload_ref is None and len(os.listdir(store)) == 1

    records = await run_until(zk_hosts, chroot, Sizer(APP, name="w1"), Client(session, APP),
                              ["big", "small"])
    assert records["big"].ok, records["big"].error
    assert records["big"].result == {"bytes": len(json.dumps(BIG)), "first": "blob"}
    assert os.listdir(store) == []  # deleted once the task was acknowledged


async def test_a_payload_store_argument_and_a_worker_without_a_store(
        zk_hosts: str, chroot: str, session: Session, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(STORE_ENV, raising=False)
    client = Client(session, APP, create=True, payload_store=str(tmp_path / "mine"))
    await client.submit("handle", BIG, key="lost")

    records = await run_until(zk_hosts, chroot, Sizer(APP, name="w1"), client, ["lost"])
    assert not records["lost"].ok
    assert "carries a stored payload" in records["lost"].error
    assert "has no payload store: set FRAMEWORK_PAYLOAD_STORE" in records["lost"].error
    assert len(os.listdir(tmp_path / "mine")) == 1  # dead-lettered: kept for a requeue

    class WithStore(Sizer):
        payload_store = LocalDirectoryStore(tmp_path / "mine")

    await client.submit("handle", BIG, key="found")
    records = await run_until(zk_hosts, chroot, WithStore(APP, name="w2"), client, ["found"])
    assert records["found"].ok and records["found"].result["first"] == "blob"
    assert len(os.listdir(tmp_path / "mine")) == 1  # its own deleted, the dead letter's kept


def test_the_local_directory_store(tmp_path: Path) -> None:
    store = LocalDirectoryStore(tmp_path / "s", retention=60.0)
    ref = store.put(b'{"a": 1}')
    assert store.get(ref) == b'{"a": 1}'
    (tmp_path / "outside").write_bytes(b"secret")
    for bad in ("../outside", "/etc/passwd", ".hidden", "a/b", ""):
        with pytest.raises(PayloadMissing):
            store.get(bad)
        with pytest.raises(PayloadMissing):
            store.delete(bad)
    assert (tmp_path / "outside").exists()
    old = store.put(b"old")
    os.utime(tmp_path / "s" / old, (1.0, 1.0))
    assert store.prune(before=1000.0) == 1 and sorted(os.listdir(tmp_path / "s")) == [ref]
    store.delete(ref)
    store.delete(ref)  # already gone: nothing
    with pytest.raises(PayloadMissing, match="is not in"):
        store.get(ref)
