"""Task types: several named handlers per worker, each with its own options.

A worker method becomes a task type with the :func:`task` decorator; ``handle`` (if a worker
overrides it) is the task type named ``"handle"``::

    class Thumbnails(Worker):
        @task(max_attempts=3, time_limit=10, rate_limit="20/s")
        async def resize(self, task): ...

        @task(priority=-5)          # lower values are taken first
        def ocr(self, task): ...    # a plain def runs in the worker's handler pool

A type's options override the worker class's (``max_attempts``, ``backoff_base``,
``backoff_max``, ``time_limit``); ``priority`` is the default priority of its submissions
and ``rate_limit`` bounds how many tasks of the type one worker process starts per second,
minute or hour (``"20/s"``, ``"100/m"``, ``"500/h"``).

Callbacks and limits (Celery's ``link`` / ``link_error``, ``expires``, ``soft_time_limit``;
RQ's and Dramatiq's ``on_success`` / ``on_failure``): ``on_success="report"`` queues a task
of type ``report`` once the task succeeded, ``on_failure="alert"`` one once it failed for
good (:mod:`framework.runtime.workflows.callbacks`); ``expires=60`` records a task not
started within 60 s of its submit as ``expired`` without running it; ``soft_time_limit=5`` raises
:class:`~framework.runtime.SoftTimeLimitExceeded` inside an ``async def`` handler
after 5 s (below ``time_limit``).  A submit's own values override the type's.

Named queues (Celery's ``task_routes``, RQ's queues, Dramatiq's ``queue_name``):
``@task(queue="gpu")`` puts the type's tasks into the queue ``gpu`` (default: ``default``,
the app's ``tasks/``), unless a submit names another (``queue=``); a worker takes only from
the queues it serves (``Worker.queues``, ``framework run -Q``), and within them only tasks
of its types (:mod:`framework.runtime.queues`).

The app's catalog, ``/apps/<app>/types`` (:class:`Catalog`), lists every type its workers
have registered (each worker adds its own when it starts).  Submitting a name the catalog
does not list raises :class:`~framework.errors.ConfigurationError` naming the known types;
until a worker of the app has started once, the catalog is empty and any name is accepted.
A worker takes only tasks of its own types: a task of a type no running worker has waits in
the queue (no delivery counted) until a worker with that type starts, and ``framework
status`` names such types (:func:`~framework.runtime.operations.status.types_without_worker`).
"""

from __future__ import annotations

import hashlib
import inspect
import re
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import attrs
import trio

from framework import errors, records
from framework.logs import get_logger
from framework.retry import Backoff, RetryPolicy
from framework.runtime.app import DEFAULT_QUEUE, App, check_name, check_queue_name
from framework.runtime.tasks import DEFAULT_TASK
from framework.zk import Session

log = get_logger("framework.runtime.task_types")

#: Attribute of a decorated method holding its :class:`TaskOptions`.
_MARK = "__framework_task__"

_PERIODS = {"s": 1.0, "m": 60.0, "h": 3600.0}

F = TypeVar("F", bound=Callable[..., Any])


@attrs.frozen
class RateLimit:
    """At most ``count`` task starts per ``per`` seconds, in one worker process."""

    count: int
    per: float

    @classmethod
    def parse(cls, text: str) -> RateLimit:
        """``"20/s"``, ``"100/m"``, ``"500/h"`` (or a bare number: per second)."""
        match = re.fullmatch(r"\s*(\d+)\s*(?:/\s*([smh]))?\s*", str(text))
        if not match or int(match.group(1)) < 1:
            raise errors.ConfigurationError(
                f"rate_limit must look like '20/s', '100/m' or '500/h' (at least 1), "
                f"got {text!r}"
            )
        return cls(int(match.group(1)), _PERIODS[match.group(2) or "s"])

    def __str__(self) -> str:
        unit = {1.0: "s", 60.0: "m", 3600.0: "h"}[self.per]
        return f"{self.count}/{unit}"

    @property
    def interval(self) -> float:
        """Seconds between two starts at the limit."""
        return self.per / self.count


def _positive(name: str) -> Callable[[Any, Any, Any], None]:
    def check(_instance: Any, _attribute: Any, value: Any) -> None:
        if value is not None and (isinstance(value, bool) or not value > 0):
            raise errors.ConfigurationError(f"{name} must be positive, got {value!r}")
    return check


def _rate(value: Any) -> RateLimit | None:
    if value is None or isinstance(value, RateLimit):
        return value
    return RateLimit.parse(value)


def _max_attempts(_instance: Any, _attribute: Any, value: Any) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                              or value < 1):
        raise errors.ConfigurationError(f"max_attempts must be an int >= 1, got {value!r}")


def _priority(_instance: Any, _attribute: Any, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or abs(value) >= 10**9:
        raise errors.ConfigurationError(f"priority must be an int below 10**9, got {value!r}")


def _callback(option: str) -> Callable[[Any, Any, Any], None]:
    def check(_instance: Any, _attribute: Any, value: Any) -> None:
        if value is not None:
            if not isinstance(value, str):
                raise errors.ConfigurationError(
                    f"{option} names a task type (a str), got {value!r}")
            check_name(f"{option} task name", value)
    return check


@attrs.frozen
class TaskOptions:
    """One task type's options (``None``: the worker class's value)."""

    max_attempts: int | None = attrs.field(default=None, validator=_max_attempts)
    backoff_base: float | None = attrs.field(default=None, validator=_positive("backoff_base"))
    backoff_max: float | None = attrs.field(default=None, validator=_positive("backoff_max"))
    time_limit: float | None = attrs.field(default=None, validator=_positive("time_limit"))
    priority: int = attrs.field(default=0, validator=_priority)
    rate_limit: RateLimit | None = attrs.field(default=None, converter=_rate)
    #: seconds after which SoftTimeLimitExceeded is raised in an async handler
    soft_time_limit: float | None = attrs.field(default=None,
                                                validator=_positive("soft_time_limit"))
    #: seconds after its submit by which a task must have started (else ``expired``)
    expires: float | None = attrs.field(default=None, validator=_positive("expires"))
    #: task types queued with the result (``on_success``) or final error (``on_failure``)
    on_success: str | None = attrs.field(default=None, validator=_callback("on_success"))
    on_failure: str | None = attrs.field(default=None, validator=_callback("on_failure"))
    #: the queue its tasks go to unless a submit names another (``default``: ``tasks/``)
    queue: str = attrs.field(default=DEFAULT_QUEUE, validator=lambda _i, _a, v:
                             check_queue_name(v))

    def __attrs_post_init__(self) -> None:
        if self.soft_time_limit and self.time_limit and self.soft_time_limit >= self.time_limit:
            raise errors.ConfigurationError(
                f"soft_time_limit ({self.soft_time_limit:g}s) must be below time_limit "
                f"({self.time_limit:g}s)")


@attrs.frozen
class TaskType:
    """A worker's task type: its name, the method that runs it, its options, and whether
    the method is a plain ``def`` (run in the handler pool)."""

    name: str
    method: str
    options: TaskOptions
    blocking: bool


def task(fn: F | None = None, *, name: str | None = None, max_attempts: int | None = None,
         backoff_base: float | None = None, backoff_max: float | None = None,
         time_limit: float | None = None, priority: int = 0,
         rate_limit: str | None = None, soft_time_limit: float | None = None,
         expires: float | None = None, on_success: str | None = None,
         on_failure: str | None = None, queue: str = DEFAULT_QUEUE) -> Any:
    """Make a worker method a task type (``@task`` or ``@task(...)``, see the module doc).
    Bad options raise :class:`~framework.errors.ConfigurationError` at class definition."""
    options = TaskOptions(max_attempts, backoff_base, backoff_max, time_limit, priority,
                          rate_limit, soft_time_limit, expires, on_success, on_failure, queue)

    def mark(method: F) -> F:
        if not callable(method):
            raise errors.ConfigurationError(f"@task decorates a method, got {method!r}")
        setattr(method, _MARK, (name or method.__name__, options))
        return method

    return mark(fn) if fn is not None else mark


def collect(cls: type, *, default: Callable[..., Any] | None) -> dict[str, TaskType]:
    """The task types of worker class ``cls``: its ``@task`` methods, and ``handle`` unless
    it is ``default`` (the base class's, not overridden).  Names must be unique and valid,
    and each method 'async def' or a plain 'def' returning its result
    (:class:`~framework.errors.ConfigurationError` otherwise)."""
    found: dict[str, TaskType] = {}
    for attribute in dir(cls):
        method = getattr(cls, attribute, None)
        mark = getattr(method, _MARK, None)
        if mark is None and attribute == DEFAULT_TASK and method is not default:
            mark = (DEFAULT_TASK, TaskOptions())
        if mark is None:
            continue
        name, options = mark
        check_name("task name", name)
        if name in found:
            raise errors.ConfigurationError(
                f"{cls.__name__}: two methods are task {name!r} ({found[name].method} and "
                f"{attribute})"
            )
        blocking = _blocking(cls, attribute, method)
        if blocking and options.soft_time_limit:
            raise errors.ConfigurationError(
                f"{cls.__name__}.{attribute}: soft_time_limit needs an 'async def' handler (a "
                "plain def runs in a thread or process, which cannot be interrupted); use "
                "time_limit")
        found[name] = TaskType(name, attribute, options, blocking)
    return found


def _blocking(cls: type, attribute: str, method: Any) -> bool:
    where = f"{cls.__name__}.{attribute}"
    if not callable(method):
        raise errors.ConfigurationError(
            f"{where} must be a method ('async def' or 'def'), got a {type(method).__name__}"
        )
    if inspect.iscoroutinefunction(method):
        return False
    if inspect.isasyncgenfunction(method) or inspect.isgeneratorfunction(method):
        raise errors.ConfigurationError(f"{where} must return its result, not yield")
    if inspect.iscoroutinefunction(inspect.unwrap(method)):
        raise errors.ConfigurationError(
            f"{where} is a plain function wrapping an 'async def' (a decorator hides the "
            "coroutine): make the wrapper 'async def' too"
        )
    return True


# ---------------------------------------------------------------- the app's catalog


@attrs.frozen
class TypeInfo:
    """What a submitter needs of a task type: its default priority (and, for people, its
    limits)."""

    priority: int = 0
    max_attempts: int | None = None
    time_limit: float | None = None
    rate_limit: str | None = None
    expires: float | None = None  # seconds after the submit (the submitter applies it)
    queue: str = DEFAULT_QUEUE  # the queue its tasks go to (a submit may name another)


@attrs.frozen
class CatalogRecord:
    """``/apps/<app>/types``: every task type the app's workers registered."""

    types: dict[str, TypeInfo] = attrs.Factory(dict)


def type_info(kind: TaskType, *, max_attempts: int, time_limit: float | None) -> TypeInfo:
    """A task type as the catalog lists it (the worker's defaults filled in)."""
    options = kind.options
    return TypeInfo(options.priority, options.max_attempts or max_attempts,
                    options.time_limit or time_limit,
                    str(options.rate_limit) if options.rate_limit else None,
                    options.expires, options.queue)


class Catalog:
    """The task types of one app, as submitters check them (read once, read again only
    when a name is not in the copy: a new type registered since)."""

    def __init__(self, session: Session, app: App) -> None:
        self.session = session
        self.app = app
        self._known: CatalogRecord | None = None

    @property
    def path(self) -> str:
        return self.app.types

    async def read(self) -> CatalogRecord:
        """The catalog now (empty if no worker of the app has registered types yet)."""
        try:
            data, _stat = await self.session.get(self.path)
        except errors.NoNodeError:
            return CatalogRecord()
        return _decode(data, self.path)

    async def check(self, name: str) -> TypeInfo:
        """``name``'s entry; :class:`~framework.errors.ConfigurationError` if the catalog
        lists types and not this one (an empty catalog accepts any valid name)."""
        check_name("task name", name)
        for fresh in (False, True):
            if self._known is None or fresh:
                self._known = await self.read()
            info = self._known.types.get(name)
            if info is not None:
                return info
            if not self._known.types:
                return TypeInfo()
        known = ", ".join(sorted(self._known.types))
        raise errors.ConfigurationError(
            f"application {self.app.name!r} has no task type {name!r}; its task types: {known}"
        )

    async def register(self, types: dict[str, TypeInfo]) -> None:
        """Add (or update) ``types`` in the catalog: a read and a conditional write, again
        on a concurrent change, so registrations of several workers all stay."""
        await self.session.ensure_path(self.app.base)
        while True:
            try:
                data, stat = await self.session.get(self.path)
                current = _decode(data, self.path)
            except errors.NoNodeError:
                try:
                    await self.session.create(self.path, records.encode(CatalogRecord(types)))
                    return
                except errors.NodeExistsError:
                    continue
            merged = CatalogRecord({**current.types, **types})
            if merged == current:
                return
            try:
                await self.session.set(self.path, records.encode(merged), version=stat.version)
                return
            except errors.BadVersionError:
                continue


def _decode(data: bytes, path: str) -> CatalogRecord:
    try:
        return records.decode(data, CatalogRecord) if data else CatalogRecord()
    except records.CorruptRecord as exc:
        log.warning("record.corrupt", path=path, error=str(exc))
        return CatalogRecord()


# ---------------------------------------------------------------- at the worker


def types_line(types: Iterable[str]) -> str:
    """The name of the queue's line where idle workers with exactly these task types wait
    (``WorkQueue(line=...)``): workers that take the same tasks share one line, so a kind
    of worker that cannot take a task never holds the places of one that can."""
    digest = hashlib.sha1(",".join(sorted(types)).encode(), usedforsecurity=False)
    return f"types-{digest.hexdigest()[:16]}"



class RateLimiter:
    """A token bucket: ``count`` starts at once, then one every ``per / count`` seconds.
    Waiting for a token is a timed delay (what a rate limit is), not synchronisation."""

    def __init__(self, limit: RateLimit) -> None:
        self.limit = limit
        self._tokens = float(limit.count)
        self._at: float | None = None

    async def acquire(self) -> None:
        while True:
            now = trio.current_time()
            if self._at is not None:
                self._tokens = min(float(self.limit.count),
                                   self._tokens + (now - self._at) / self.limit.interval)
            self._at = now
            if self._tokens >= 1.0:
                self._tokens -= 1.0
                return
            await trio.sleep((1.0 - self._tokens) * self.limit.interval)


@attrs.define
class TaskRules:
    """How a worker runs one task type: the type, and its options with the worker class's
    filled in (``retry``: its :class:`~framework.retry.RetryPolicy`, attempts, delays and
    permanent errors; ``limiter``: its rate limit, if any)."""

    kind: TaskType
    retry: RetryPolicy
    time_limit: float | None
    limiter: RateLimiter | None

    @property
    def max_attempts(self) -> int:
        """Deliveries in all, the failed last one included (``retry.max_attempts``)."""
        assert self.retry.max_attempts is not None
        return self.retry.max_attempts

    @property
    def backoff(self) -> Backoff:
        """The delays before a retry (``retry.backoff``)."""
        return self.retry.backoff


def rules_of(kind: TaskType, worker: Any) -> TaskRules:
    """``kind``'s rules on ``worker`` (its class attributes fill what the type leaves out)."""
    options = kind.options
    return TaskRules(
        kind,
        RetryPolicy(options.max_attempts or worker.max_attempts,
                    Backoff(options.backoff_base or worker.backoff_base,
                            options.backoff_max or worker.backoff_max)),
        options.time_limit or worker.time_limit,
        RateLimiter(options.rate_limit) if options.rate_limit else None,
    )
