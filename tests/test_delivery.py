"""A worker's task consumer through its narrow contract (runtime/worker_parts/delivery.py):
frozen settings read from the worker, one Delivery per claimed item, its failure records
and give-up decision - without running a whole Worker."""

from __future__ import annotations

import attrs
import pytest

from framework import Session
from framework.errors import PermanentFailure
from framework.primitives.queue import ClaimExtras, QueueItem, WorkQueue
from framework.retry import Backoff, RetryPolicy
from framework.runtime import App, Task, Worker
from framework.runtime.records import RunningRecord
from framework.runtime.results.result_index import SlotKeeper
from framework.runtime.tasks import TaskResult
from framework.runtime.worker_parts.delivery import (
    ClaimedTask,
    ConsumerSettings,
    Delivery,
    DeliveryContext,
    error_text,
)
from framework.runtime.worker_parts.markers import Marker


class _Echo(Worker):
    app_name = "delivery"
    concurrency = 3
    max_attempts = 2
    backoff_base = 0.01
    backoff_max = 0.02

    async def handle(self, task: Task) -> object:
        return task.payload


def _context(session: Session, app: App) -> DeliveryContext:
    return DeliveryContext(session, WorkQueue(session, app.tasks), app,
                           SlotKeeper(session, app), "w1")


def test_settings_are_the_workers_frozen() -> None:
    settings = ConsumerSettings.of(_Echo(name="w1"))
    assert (settings.name, settings.concurrency, settings.most_attempts) == ("w1", 3, 2)
    assert settings.retry == RetryPolicy(2, Backoff(0.01, 0.02))
    assert set(settings.task_types) == {"handle"}
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        settings.concurrency = 4  # type: ignore[misc]


async def test_a_delivery_holds_its_task_and_marker(session: Session) -> None:
    app, worker = App("delivery"), _Echo(name="w1")
    context = _context(session, app)
    task = Task("t1", {"n": 1}, idempotency_key="k1")
    item = QueueItem("b-0000000000/i+0-0000000001", task.encode(), 0, 1)
    slow = Delivery.claimed(context, item, worker.rules_for)
    assert (slow.task.id, slow.fast, slow.marker, slow.markers) == ("t1", False, None, [])
    assert slow.running == f"{app.running}/t1" and slow.rules is not None
    marker = Marker(slow.running, RunningRecord("w1/x/1", "w1"))
    fast_item = attrs.evolve(item, extras=ClaimExtras(lambda txn: None, lambda txn: None,
                                                      ClaimedTask(task, marker)))
    fast = Delivery.claimed(context, fast_item, worker.rules_for)
    assert fast.fast and fast.marker is marker and fast.markers == [marker]
    with pytest.raises(ValueError):  # not a task: raised in the take's block, counted there
        Delivery.claimed(context, attrs.evolve(item, data=b"{not json"), worker.rules_for)


async def test_a_failed_attempt_is_recorded_and_the_policy_says_if_final(
        session: Session) -> None:
    app, worker = App("delivery"), _Echo(name="w1")
    await session.ensure_path(app.failures)
    context = _context(session, app)
    task = Task("t1", None, idempotency_key="k1")
    item = QueueItem("b-0000000000/i+0-0000000001", task.encode(), 0, 1)
    delivery = Delivery.claimed(context, item, worker.rules_for)
    told: list[bool] = []
    retry = delivery.retry(RetryPolicy(9))
    assert retry.max_attempts == 2  # the type's (the worker class's), not the default
    assert await delivery.fail(ValueError("boom"), 0.0, retry, told.append) is False
    assert await delivery.fail(PermanentFailure("never"), 0.0, retry, told.append) is True
    assert told == [False, True]
    [first, _second] = sorted(await session.children(app.failures))
    record = TaskResult.decode((await session.get(f"{app.failures}/{first}"))[0])
    assert (record.task_id, record.ok, record.error, record.worker) == ("t1", False,
                                                                   "ValueError: boom", "w1")
    assert "ValueError: boom" in (record.traceback or "")
    assert error_text(PermanentFailure("never")) == "never"
