"""One submit contract (issue 38, item 2): every submit surface takes the options of
:class:`SubmitOptions` (names, kinds, defaults, types) and each option reaches the stored
task; the blocking client mirrors every async operation of ``Client``."""

from __future__ import annotations

import functools
import inspect
import time
import typing
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import attrs
import pytest
import trio

from framework import ConfigurationError, Session, records
from framework.primitives.queue import WorkQueue, parse_item
from framework.runtime import BlockingClient, Client, Master, MasterContext, Task, Worker
from framework.runtime.app import App
from framework.runtime.scheduling.delayed import DelayedRecord
from framework.runtime.submission import SubmitOptions
from framework.testing.stub import StubApp

APP = "contract"
#: every option but the due time, set away from its default
OPTIONS: dict[str, Any] = {"time_limit": 7.5, "priority": 3, "expires": 600.0,
                           "soft_time_limit": 5.0, "on_success": "noted",
                           "on_failure": "mourned", "queue": "slow"}
SURFACES = [Client.submit, BlockingClient.submit, MasterContext.submit, Worker.submit,
            StubApp.submit]


def _described(fn: Callable[..., Any]) -> tuple[list[tuple[str, Any, Any, Any]], Any]:
    """``fn``'s parameters after ``self`` as (name, kind, default, type), and its return
    type (annotations resolved in its module)."""
    hints = typing.get_type_hints(fn)
    params = list(inspect.signature(fn).parameters.values())[1:]
    return ([(p.name, p.kind, p.default, hints.get(p.name)) for p in params],
            hints.get("return"))


def _async_operations(cls: type) -> list[str]:
    return sorted(name for name, fn in vars(cls).items()
                  if not name.startswith("_") and inspect.iscoroutinefunction(fn))


def test_the_blocking_client_mirrors_every_async_operation() -> None:
    """As trio's test_exports: each public async method of Client has a blocking twin
    with the same parameters (names, kinds, defaults, types) and return type."""
    operations = _async_operations(Client)
    assert "submit" in operations and "purge" in operations
    for name in operations:
        twin = getattr(BlockingClient, name, None)
        assert twin is not None, f"BlockingClient has no {name}"
        assert not inspect.iscoroutinefunction(twin), name
        assert _described(twin) == _described(getattr(Client, name)), name


@pytest.mark.parametrize("surface", SURFACES, ids=lambda fn: fn.__qualname__)
def test_every_submit_surface_takes_the_submit_options(surface: Callable[..., Any]) -> None:
    params, returns = _described(surface)
    options = typing.get_type_hints(SubmitOptions)
    assert params[:2] == [
        ("name", inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.empty, str),
        ("payload", inspect.Parameter.POSITIONAL_OR_KEYWORD, None, Any)]
    assert params[2:] == [(f.name, inspect.Parameter.KEYWORD_ONLY, f.default, options[f.name])
                          for f in attrs.fields(SubmitOptions)]
    assert returns is Task


@pytest.mark.parametrize(("option", "value"), [
    ("key", "a/b"), ("time_limit", 0), ("priority", True), ("expires", -1),
    ("soft_time_limit", "5"), ("on_success", "no such/name"), ("queue", "gpu/0"),
    ("countdown", -1),
    ("eta", "tomorrow")])
def test_a_bad_option_is_a_one_line_error_naming_it(option: str, value: Any) -> None:
    with pytest.raises(ConfigurationError) as raised:
        SubmitOptions(**{option: value})
    message = str(raised.value)
    assert "\n" not in message
    assert option.split("_")[0] in message or "task key" in message


class Hold(Master):
    """Leads until stopped, handing its context out."""

    app_name = APP

    def __init__(self) -> None:
        super().__init__(name="m1")
        self.context: MasterContext | None = None
        self.elected = trio.Event()

    async def lead(self, ctx: MasterContext) -> None:
        self.context = ctx
        self.elected.set()
        await trio.sleep_forever()


class Follower(Worker):
    """Takes no tasks (so it leaves them stored) and moves no delayed ones; submits."""

    app_name = APP
    duties = False

    def __init__(self) -> None:
        super().__init__(name="w1")
        self.started = trio.Event()

    def parts(self) -> list[Any]:
        parts = super().parts()
        self.started.set()  # its session is set before its parts are made
        return parts


async def _stored(session: Session) -> tuple[dict[str, tuple[Task, int]],
                                              dict[str, DelayedRecord]]:
    """The app's queued tasks (with their priority) and delayed records, by task key."""
    app, queued, delayed = App(APP), {}, {}
    queue = WorkQueue(session, app.queue_path(OPTIONS["queue"]))
    for name in await queue.item_names():
        data = await queue.item_data(name)
        entry = parse_item(*name.split("/"))
        assert data is not None and entry is not None
        task = Task.decode(data)
        queued[task.key] = (task, entry.priority)
    for bucket in await session.children(app.delayed):
        for node in await session.children(f"{app.delayed}/{bucket}"):
            record = records.decode((await session.get(f"{app.delayed}/{bucket}/{node}"))[0],
                                    DelayedRecord)
            delayed[record.task.key] = record
    return queued, delayed


async def test_each_submit_surface_stores_each_option(zk_hosts: str, chroot: str) -> None:
    master, worker = Hold(), Follower()
    eta = datetime.now(UTC) + timedelta(hours=2)
    with trio.fail_after(60):
        async with Session(zk_hosts, chroot=chroot) as session, \
                trio.open_nursery() as nursery:
            nursery.start_soon(master.run, session)
            nursery.start_soon(worker.run, session)
            await master.elected.wait()
            await worker.started.wait()
            assert master.context is not None
            blocking = await trio.to_thread.run_sync(functools.partial(
                BlockingClient, zk_hosts, APP, chroot=chroot, create=True))

            async def in_thread(name: str, payload: Any = None, **options: Any) -> Task:
                return await trio.to_thread.run_sync(
                    functools.partial(blocking.submit, name, payload, **options))

            surfaces: dict[str, Callable[..., Awaitable[Task]]] = {
                "client": Client(session, APP).submit, "blocking": in_thread,
                "master": master.context.submit, "worker": worker.submit}
            before = time.time()
            for surface, submit in surfaces.items():
                await submit("step", {"by": surface}, key=f"{surface}-now", **OPTIONS)
                await submit("step", {"by": surface}, key=f"{surface}-later",
                             countdown=3600, **OPTIONS)
                await submit("step", {"by": surface}, key=f"{surface}-at", eta=eta,
                             **OPTIONS)
                with pytest.raises(ConfigurationError, match="expires"):
                    await submit("step", key=f"{surface}-bad", expires=0)
            after = time.time()
            await trio.to_thread.run_sync(blocking.close)
            queued, delayed = await _stored(session)
            master.request_stop()
            worker.request_stop()
            nursery.cancel_scope.cancel()
    assert sorted(queued) == sorted(f"{s}-now" for s in surfaces)
    assert sorted(delayed) == sorted(f"{s}-{w}" for s in surfaces for w in ("later", "at"))
    for surface in surfaces:
        task, priority = queued[f"{surface}-now"]
        later, at = delayed[f"{surface}-later"], delayed[f"{surface}-at"]
        for stored in (task, later.task, at.task):
            assert stored.id == stored.key and stored.payload == {"by": surface}
            assert (stored.name, stored.time_limit, stored.soft_time_limit,
                    stored.on_success, stored.on_failure, stored.queue) == (
                "step", 7.5, 5.0, "noted", "mourned", "slow"), surface
        assert priority == later.priority == at.priority == 3
        assert task.expires is not None and before + 600 <= task.expires <= after + 600
        assert before + 3600 <= later.due <= after + 3600
        assert later.task.expires == later.due + 600
        assert at.due == eta.timestamp() and at.task.expires == at.due + 600
        assert later.explicit and at.explicit


class Steps(Worker):
    app_name = APP

    async def handle(self, task: Task) -> Any:
        return task.payload


async def test_the_stub_takes_the_same_options() -> None:
    app = StubApp(Steps)
    eta = datetime.now(UTC) + timedelta(hours=2)
    now = await app.submit("handle", 1, key="now", **OPTIONS)
    at = await app.submit("handle", 2, key="at", eta=eta, **OPTIONS)
    for task in (now, at):
        assert task.id == task.key and (task.time_limit, task.soft_time_limit,
                                        task.on_success, task.on_failure, task.queue) == (
            7.5, 5.0, "noted", "mourned", "slow")
    assert at.expires == eta.timestamp() + 600
    with pytest.raises(ConfigurationError, match="priority"):
        await app.submit("handle", key="bad", priority=True)
