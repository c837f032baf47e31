"""The one place where kazoo's threads meet trio.

kazoo completes requests on its own threads.  A completion may touch trio only through
``TrioToken.run_sync_soon`` (never ``trio.from_thread.run_sync``, never anything blocking),
and must tolerate the trio run having finished.  kazoo re-runs *every* linked callback when a
later one is linked to a finished result, so callbacks here are idempotent.

Contract: requests the session makes itself (get, create, set, ...) are queued with kazoo's
``_call`` together with a :class:`_Pending` that the connection thread fills and that wakes
the waiting task; callbacks marked ``direct_safe`` run on the connection thread (they only
call ``run_sync_soon``), every other callback (kazoo's own, watches) on kazoo's completion
thread; :class:`BridgeHandler` waits on the sockets with one ``poll`` call.  Why, and what
each saves per request: docs/architecture.md, "The kazoo bridge".
"""

from __future__ import annotations

import collections
import functools
import math
import select
from typing import Any, Callable

import trio
from kazoo import exceptions as kz
from kazoo.handlers.threading import AsyncResult, SequentialThreadingHandler
from kazoo.handlers.utils import _NONE

from framework import errors
from framework.zk.liveness import Liveness

_KAZOO_TO_FRAMEWORK: dict[type[BaseException], type[errors.ZooKeeperError]] = {
    kz.NoNodeError: errors.NoNodeError,
    kz.NodeExistsError: errors.NodeExistsError,
    kz.BadVersionError: errors.BadVersionError,
    kz.NotEmptyError: errors.NotEmptyError,
    kz.NoChildrenForEphemeralsError: errors.NoChildrenForEphemeralsError,
    kz.ConnectionLoss: errors.ConnectionLossError,
    kz.ConnectionClosedError: errors.NotConnectedError,
    kz.SessionExpiredError: errors.SessionExpiredError,
    kz.RolledBackError: errors.RolledBackError,
}


#: What a refused request was doing, by kazoo record (or transaction operation) name.
_ACTIONS = {
    "GetData": "read", "SetData": "write", "Create": "create", "Create2": "create",
    "Delete": "delete", "GetChildren": "list", "GetChildren2": "list", "Exists": "check",
    "GetACL": "read the ACL of", "SetACL": "change the ACL of", "Sync": "sync",
    "create": "create", "set_data": "write", "delete": "delete", "check": "check",
}

#: Why the server refused, for errors whose kazoo message is empty.
_REASONS: dict[type[BaseException], str] = {
    kz.NoAuthError: "the node's ACL does not give this client that permission (NoAuth)",
    kz.BadArgumentsError: "the server rejected the request's arguments (BadArguments)",
    kz.InvalidACLError: "the ACL is not valid (InvalidACL)",
    kz.AuthFailedError: "authentication failed (AuthFailed)",
}


def describe(action: str, path: str) -> str:
    """``"write '/a'"``: what a request did, for error messages."""
    return f"{_ACTIONS.get(action, action)} {path!r}"


def translate(exc: BaseException, context: str | None = None) -> BaseException:
    """Map a kazoo exception to the framework's typed error (others pass through).

    ``context`` (see :func:`describe`) names the refused operation and its path in the
    message of errors that do not say it themselves (NoAuth, BadArguments, ...).
    """
    for kazoo_type, ours in _KAZOO_TO_FRAMEWORK.items():
        if isinstance(exc, kazoo_type):
            new = ours(str(exc) or kazoo_type.__name__)
            new.__cause__ = exc
            return new
    if isinstance(exc, kz.ZookeeperError):
        reason = f"{type(exc).__name__}: {exc}" if str(exc) else next(
            (text for kind, text in _REASONS.items() if isinstance(exc, kind)),
            type(exc).__name__,
        )
        if context is not None:
            reason = f"{context} refused: {reason}"
            if " '/zookeeper" in context:
                reason += (
                    "; /zookeeper belongs to the ZooKeeper server (its quotas and its "
                    "configuration): only the server's super user may change it"
                )
        kind = errors.NoAuthError if isinstance(exc, kz.NoAuthError) else errors.ZooKeeperError
        new = kind(reason)
        new.__cause__ = exc
        return new
    return exc


class _DirectResult(AsyncResult):
    """An ``AsyncResult`` that runs ``direct_safe`` callbacks on the thread that sets it.

    It also offers a lock-free link and read for the trio side: kazoo's ``rawlink`` and
    ``get_nowait`` take the result's lock, which the connection thread holds while it
    completes requests, so under load every request paid two contended lock handoffs.
    """

    def link_direct(self, callback: Callable[[Any], None]) -> None:
        """Run the idempotent ``callback(self)`` once the result is set (maybe twice).

        Lock-free and race-free under the GIL: ``set`` stores the outcome *before* it walks
        the callbacks, and we append *before* we look at the outcome, so at least one of the
        two sides sees the other.
        """
        self._callbacks.append(callback)
        if self._exception is not _NONE:
            callback(self)

    def outcome(self) -> Any:
        """The value of a result known to be set, or raise its exception (lock-free)."""
        exc = self._exception
        if exc is None:
            return self.value
        if exc is _NONE:
            raise RuntimeError("result read before it was set")
        raise exc

    def _do_callbacks(self) -> None:
        for callback in self._callbacks:
            if getattr(callback, "direct_safe", False):
                callback(self)
            elif self._handler.running:
                self._handler.completion_queue.put(functools.partial(callback, self))
            else:
                callback(self)


_READABLE = select.POLLIN | select.POLLPRI | select.POLLHUP | select.POLLERR | select.POLLNVAL
_WRITABLE = select.POLLOUT | select.POLLHUP | select.POLLERR | select.POLLNVAL


def _fileno(obj: Any) -> int:
    fd = obj if isinstance(obj, int) else obj.fileno()
    if fd < 0:
        raise ValueError(f"invalid file descriptor for {obj!r}")
    return fd


def poll_select(
    rlist: list[Any], wlist: list[Any], xlist: list[Any], timeout: float | None = None
) -> tuple[list[Any], list[Any], list[Any]]:
    """``select.select``'s contract (the objects given back, errors reported as ready) with one
    ``poll`` system call; ``xlist`` is accepted and never reported, as kazoo never uses it."""
    poller = select.poll()
    by_fd: dict[int, tuple[list[Any], list[Any]]] = {}
    for obj in rlist:
        fd = _fileno(obj)
        by_fd.setdefault(fd, ([], []))[0].append(obj)
        poller.register(fd, select.POLLIN | select.POLLPRI | _mask(by_fd[fd], select.POLLOUT, 1))
    for obj in wlist:
        fd = _fileno(obj)
        by_fd.setdefault(fd, ([], []))[1].append(obj)
        poller.register(fd, select.POLLOUT | _mask(by_fd[fd], select.POLLIN | select.POLLPRI, 0))
    if timeout is None:
        ready = poller.poll()
    else:
        if timeout < 0:
            raise ValueError("timeout must be non-negative")
        ready = poller.poll(math.ceil(timeout * 1000))
    readable: list[Any] = []
    writable: list[Any] = []
    for fd, events in ready:
        wanted_read, wanted_write = by_fd[fd]
        if events & _READABLE:
            readable.extend(wanted_read)
        if events & _WRITABLE:
            writable.extend(wanted_write)
    return readable, writable, []


def _mask(wanted: tuple[list[Any], list[Any]], bits: int, side: int) -> int:
    """``bits`` if the descriptor is also wanted on the other ``side``, else 0."""
    return bits if wanted[side] else 0


class BridgeHandler(SequentialThreadingHandler):
    """kazoo's threading handler, with results that wake trio without an extra thread hop and
    a one-system-call ``select`` for the connection thread.

    With a :class:`~framework.zk.liveness.Liveness` attached, every wait of the connection
    thread is capped at the read deadline and a connection with no reply past it is dropped.
    """

    liveness: Liveness | None = None

    def async_result(self) -> AsyncResult:
        return _DirectResult(self)

    def select(
        self, rlist: list[Any], wlist: list[Any], xlist: list[Any], timeout: float | None = None
    ) -> tuple[list[Any], ...]:
        if self.liveness is None:
            return poll_select(rlist, wlist, xlist, timeout)
        return self.liveness.check_select(poll_select, rlist, wlist, xlist, timeout)


class Completions:
    """Hands callables from kazoo's threads to one trio run, coalescing wakeups.

    ``run_sync_soon`` costs a socket write per call.  Under load many completions arrive
    together, so they are queued here and drained by a single ``run_sync_soon`` per burst.
    Ordering argument: a producer appends *before* it looks at ``_scheduled``; the drain
    clears ``_scheduled`` *before* it empties the queue; so an item is either seen by a drain
    already running or schedules a new one (at worst one drain too many, never one too few).
    """

    def __init__(self, token: trio.lowlevel.TrioToken) -> None:
        self._token = token
        self._queue: collections.deque[Callable[[], None]] = collections.deque()
        self._scheduled = False

    def call_soon(self, fn: Callable[[], None]) -> None:
        """Thread-safe and non-blocking: run ``fn()`` in the trio run soon."""
        self._queue.append(fn)
        if not self._scheduled:
            self._scheduled = True
            try:
                self._token.run_sync_soon(self._drain)
            except trio.RunFinishedError:
                pass

    def _drain(self) -> None:
        self._scheduled = False
        queue = self._queue
        while queue:
            queue.popleft()()


class _Pending:
    """The completion slot of one request sent by :func:`send_request`.

    kazoo's connection thread (or ``_call`` itself, for a client that is closed) calls
    ``set`` or ``set_exception``, normally once; the waiting trio task is then rescheduled
    through :class:`Completions`.  Safe against a second call and against the waiter having
    been cancelled: ``_resume`` reschedules only a task that is still parked here.
    """

    __slots__ = ("_completions", "_task", "_waiting", "done", "exception", "value")

    def __init__(self, completions: Completions) -> None:
        self._completions = completions
        self._task: trio.lowlevel.Task | None = None
        self._waiting = False
        self.done = False
        self.value: Any = None
        self.exception: BaseException | None = None

    def set(self, value: Any = None) -> None:  # kazoo's thread
        self.value = value
        self.done = True
        self._completions.call_soon(self._resume)

    def set_exception(self, exception: BaseException) -> None:  # kazoo's thread
        self.exception = exception
        self.done = True
        self._completions.call_soon(self._resume)

    def _resume(self) -> None:  # trio
        if self._waiting:
            self._waiting = False
            assert self._task is not None
            trio.lowlevel.reschedule(self._task)

    def _abort(self, _raise_cancel: Any) -> trio.lowlevel.Abort:
        self._waiting = False
        return trio.lowlevel.Abort.SUCCEEDED

    async def wait(self) -> Any:
        if self.done:
            await trio.lowlevel.checkpoint()
        else:
            # Parking here before set() runs is guaranteed: _resume can only run in this
            # trio thread, after this task has yielded.
            self._task = trio.lowlevel.current_task()
            self._waiting = True
            await trio.lowlevel.wait_task_rescheduled(self._abort)
        if self.exception is not None:
            raise self.exception
        return self.value


async def send_request(client: Any, request: Any, completions: Completions) -> Any:
    """Queue one kazoo protocol record (``GetData``, ``Create``, ...) and await its reply.

    Returns the record's deserialized reply and raises kazoo's exception for a failed
    request, like the matching ``*_async`` call.  Watchers carried by the record are
    registered by kazoo's connection thread exactly as for ``*_async``.  Cancelling this
    wait does not withdraw the request.
    """
    pending = _Pending(completions)
    client._call(request, pending)
    return await pending.wait()


def waker(token: trio.lowlevel.TrioToken, event: trio.Event) -> Callable[..., None]:
    """A thread-safe, idempotent callback that sets ``event`` in the trio run of ``token``."""

    def wake(*_args: Any) -> None:
        try:
            token.run_sync_soon(event.set)
        except trio.RunFinishedError:
            pass

    return wake


async def wait_result(async_result: Any, completions: Completions) -> Any:
    """Wait for a kazoo ``IAsyncResult`` without blocking trio; return its value.

    Raises kazoo's exception for a failed request (callers translate it).  Cancelling this
    wait does not withdraw the request: a write's outcome is unknown after cancellation.
    """
    if async_result.ready():
        await trio.lowlevel.checkpoint()
        return async_result.get_nowait()
    task = trio.lowlevel.current_task()
    finished = False

    def resume() -> None:  # runs in trio; at most once, and never after an abort
        nonlocal finished
        if not finished:
            finished = True
            trio.lowlevel.reschedule(task)

    def on_done(_result: Any) -> None:  # runs on a kazoo thread, maybe twice
        completions.call_soon(resume)

    on_done.direct_safe = True  # type: ignore[attr-defined]

    def abort(_raise_cancel: Any) -> trio.lowlevel.Abort:
        nonlocal finished
        finished = True
        return trio.lowlevel.Abort.SUCCEEDED

    if isinstance(async_result, _DirectResult):
        async_result.link_direct(on_done)
        await trio.lowlevel.wait_task_rescheduled(abort)
        return async_result.outcome()
    async_result.rawlink(on_done)
    await trio.lowlevel.wait_task_rescheduled(abort)
    return async_result.get_nowait()
