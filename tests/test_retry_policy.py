"""The one retry policy (framework/retry.py): attempts, permanent errors, delays; a task
type's policy is the worker's with the type's options filled in, and the queue buries by
the same rule."""

from __future__ import annotations

import attrs
import pytest

from framework.errors import PermanentFailure
from framework.retry import Backoff, RetryPolicy
from framework.runtime import Worker, task
from framework.runtime.task_types import collect, rules_of


def test_gives_up_after_its_attempts_or_at_a_permanent_error() -> None:
    policy = RetryPolicy(3)
    assert [policy.gives_up(n) for n in (1, 2, 3, 4)] == [False, False, True, True]
    assert policy.gives_up(1, PermanentFailure("no"))
    assert not policy.gives_up(1, ValueError("maybe next time"))
    assert not RetryPolicy(None).gives_up(1_000)
    custom = RetryPolicy(5, permanent=(KeyError,))
    assert custom.gives_up(1, KeyError("k")) and not custom.gives_up(1, PermanentFailure("p"))


def test_attempts_must_be_positive() -> None:
    with pytest.raises(ValueError):
        RetryPolicy(0)


def test_delays_come_from_its_backoff() -> None:
    policy = RetryPolicy(5, Backoff(1.0, 4.0, jitter=0.0))
    assert [policy.backoff.delay(n) for n in (1, 2, 3, 4)] == [1.0, 2.0, 4.0, 4.0]


class _Typed(Worker):
    max_attempts = 4
    backoff_base = 0.5
    backoff_max = 8.0

    @task(max_attempts=2, backoff_max=1.0)
    async def quick(self, payload: object) -> None:
        pass

    @task()
    async def plain(self, payload: object) -> None:
        pass


def test_a_task_types_policy_is_the_workers_with_its_options() -> None:
    kinds = collect(_Typed, default=Worker.handle)
    quick, plain = rules_of(kinds["quick"], _Typed), rules_of(kinds["plain"], _Typed)
    assert quick.retry == RetryPolicy(2, Backoff(0.5, 1.0))
    assert plain.retry == RetryPolicy(4, Backoff(0.5, 8.0))
    assert (quick.max_attempts, quick.backoff) == (2, quick.retry.backoff)
    assert attrs.evolve(plain.retry, max_attempts=1).gives_up(1)
