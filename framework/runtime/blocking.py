"""``BlockingClient``: the :class:`~framework.runtime.Client` for code outside trio.

A Django or Flask view, a script or a notebook cannot ``await``; they hold one
``BlockingClient`` per app for the process's lifetime::

    from framework import BlockingClient

    client = BlockingClient("zk1:2181,zk2:2181", "thumbnails", chroot="/prod")
    task = client.submit("resize", {"image": 7}, key="img-7")
    record = client.result("img-7", wait=True, timeout=60)
    client.close()                  # or: with BlockingClient(...) as client: ...

It runs one background thread with its own trio loop and one
:class:`~framework.zk.Session`; each call is handed to that loop
(``trio.from_thread.run``) and blocks the calling thread until it is done.  Any number of
threads may call it at once: their calls run concurrently on the one session.  The
operations, arguments, return values and exceptions are those of ``Client`` (the same
classes: :class:`~framework.errors.ConfigurationError`, :class:`trio.TooSlowError` from
``result(wait=True, timeout=...)``...), raised in the calling thread.

Guarantees and limits:

* The constructor returns once the session is connected; it raises what connecting raised
  (a bad hosts string, no server within ``connect_timeout``).
* SUSPENDED: calls wait for the connection to come back, like the async ``Client``'s (give
  ``timeout=`` to bound every call: :class:`trio.TooSlowError` past it).  LOST: the session
  starts a new ZooKeeper session and calls go on in it.
* :meth:`close` (or leaving the ``with`` block) cancels the calls still running (they raise
  :class:`ClientClosedError`), closes the session and ends the thread; a call made after it
  raises :class:`ClientClosedError`.  ``close`` is idempotent.
* A call made from the client's own loop thread, or from inside a trio run, would deadlock
  or block that loop: use the async ``Client`` there (a call from the loop thread raises
  :class:`~framework.errors.ConfigurationError`).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any, Concatenate, ParamSpec, TypeVar

import trio

from framework import errors
from framework.runtime.app import App
from framework.runtime.client import Client, DeadLetter
from framework.runtime.payloads import PayloadStore
from framework.runtime.records import CancelRecord, PastRun, Revocation
from framework.runtime.submission import Existing
from framework.runtime.task_types import TypeInfo
from framework.runtime.tasks import Task, TaskResult
from framework.zk import Session

T = TypeVar("T")
P = ParamSpec("P")


class ClientClosedError(errors.NotConnectedError):
    """The :class:`BlockingClient` was closed (before or during the call)."""


class BlockingClient:
    """``Client`` operations as plain blocking calls (see the module doc).

    ``hosts``, ``chroot``, ``session_timeout`` and ``connect_timeout`` are the
    :class:`~framework.zk.Session`'s; ``app``, ``create`` and ``payload_store`` the
    ``Client``'s; ``timeout`` (seconds, ``None``: no limit) bounds every call."""

    def __init__(self, hosts: str, app: App | str, *, chroot: str | None = None,
                 session_timeout: float = 10.0, connect_timeout: float = 15.0,
                 timeout: float | None = None, create: bool = False,
                 payload_store: PayloadStore | str | None = None) -> None:
        self.app = app if isinstance(app, App) else App(app)
        self.timeout = timeout
        # built here, so a bad argument raises in the caller before any thread starts
        self._session = Session(hosts, chroot=chroot, session_timeout=session_timeout,
                                connect_timeout=connect_timeout)
        self._create, self._payload_store = create, payload_store
        self._client: Client | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._stop: trio.Event | None = None
        self._calls: set[trio.CancelScope] = set()
        self._idle: trio.Event | None = None  # set when the last call ends after a close
        self._closed = False
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._main, daemon=True,
                                        name=f"framework-client-{self.app.name}")
        self._thread.start()
        self._ready.wait()
        if self._failure is not None:
            self._thread.join()
            self._closed = True
            raise self._failure

    # ------------------------------------------------------------ the loop thread

    def _main(self) -> None:
        try:
            trio.run(self._serve)
        except BaseException as exc:  # connecting failed: raised in the constructor
            self._failure = exc
        finally:
            self._ready.set()

    async def _serve(self) -> None:
        async with self._session as session:
            self._client = Client(session, self.app, create=self._create,
                                  payload_store=self._payload_store)
            self._stop = trio.Event()
            self._token = trio.lowlevel.current_trio_token()
            self._ready.set()
            await self._stop.wait()
            self._idle = trio.Event()
            for scope in list(self._calls):
                scope.cancel()
            if self._calls:  # each cancelled call removes itself (then the last sets it)
                await self._idle.wait()

    async def _run(self, fn: Callable[..., Awaitable[T]], args: tuple[Any, ...],
                   kwargs: dict[str, Any]) -> T:
        assert self._stop is not None
        if self._stop.is_set():  # handed over just as the client closed
            raise ClientClosedError(f"the BlockingClient of {self.app.name!r} was closed")
        with trio.CancelScope() as scope:
            self._calls.add(scope)
            try:
                if self.timeout is None:
                    return await fn(*args, **kwargs)
                with trio.move_on_after(self.timeout):
                    return await fn(*args, **kwargs)
                raise trio.TooSlowError(f"{fn.__name__} on {self.app.name!r} took over the "
                                        f"client's timeout of {self.timeout:g}s")
            finally:
                self._calls.discard(scope)
                if self._idle is not None and not self._calls:
                    self._idle.set()
        raise ClientClosedError(f"the BlockingClient of {self.app.name!r} was closed "
                                "during the call")

    def _call(self, operation: Callable[Concatenate[Client, P], Awaitable[T]],
              *args: P.args, **kwargs: P.kwargs) -> T:
        """Run ``Client``'s ``operation`` with these arguments in the loop thread (typed:
        the arguments and the result are checked against the async method's)."""
        if threading.current_thread() is self._thread:
            raise errors.ConfigurationError(
                "BlockingClient called from its own event loop: use the async Client there")
        with self._lock:
            if self._closed:
                raise ClientClosedError(
                    f"the BlockingClient of {self.app.name!r} is closed: make a new one")
            token, client = self._token, self._client
        assert token is not None and client is not None
        try:
            bound = functools.partial(operation, client)
            functools.update_wrapper(bound, operation)  # its name for the timeout's error
            return trio.from_thread.run(self._run, bound, args, kwargs, trio_token=token)
        except (trio.RunFinishedError, trio.Cancelled):
            raise ClientClosedError(
                f"the BlockingClient of {self.app.name!r} was closed during the call"
            ) from None

    # ------------------------------------------------------------ lifetime

    def close(self) -> None:
        """Cancel the calls in flight, close the session and end the loop thread."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if threading.current_thread() is self._thread:
            raise errors.ConfigurationError("BlockingClient.close() from its own event loop")
        stop, token = self._stop, self._token
        if stop is not None and token is not None:
            try:
                trio.from_thread.run_sync(stop.set, trio_token=token)
            except trio.RunFinishedError:
                pass
        self._thread.join()

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> BlockingClient:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    # ------------------------------------------------------------ Client's operations

    def submit(self, name: str, payload: Any = None, *, key: str | None = None,
               time_limit: float | None = None, priority: int | None = None,
               countdown: float | None = None, eta: float | datetime | None = None,
               expires: float | None = None, soft_time_limit: float | None = None,
               on_success: str | None = None, on_failure: str | None = None,
               queue: str | None = None) -> Task:
        """:meth:`Client.submit <framework.runtime.Client.submit>` (its options are
        :class:`~framework.runtime.submission.SubmitOptions`)."""
        return self._call(Client.submit, name, payload, key=key, time_limit=time_limit,
                          priority=priority, countdown=countdown, eta=eta, expires=expires,
                          soft_time_limit=soft_time_limit, on_success=on_success,
                          on_failure=on_failure, queue=queue)

    def task_types(self) -> dict[str, TypeInfo]:
        """:meth:`Client.task_types <framework.runtime.Client.task_types>`."""
        return self._call(Client.task_types)

    def existing(self, key: str) -> Existing | None:
        """:meth:`Client.existing <framework.runtime.Client.existing>`."""
        return self._call(Client.existing, key)

    def result(self, key: str, *, wait: bool = False,
               timeout: float | None = None) -> TaskResult | None:
        """:meth:`Client.result <framework.runtime.Client.result>`
        (:class:`trio.TooSlowError` after ``timeout`` with ``wait``)."""
        return self._call(Client.result, key, wait=wait, timeout=timeout)

    def revoke(self, task_id: str, *, by: str = "") -> Revocation:
        """:meth:`Client.revoke <framework.runtime.Client.revoke>`."""
        return self._call(Client.revoke, task_id, by=by)

    def cancel(self, *, by: str = "") -> bool:
        """:meth:`Client.cancel <framework.runtime.Client.cancel>`."""
        return self._call(Client.cancel, by=by)

    def resume(self) -> CancelRecord | None:
        """:meth:`Client.resume <framework.runtime.Client.resume>`."""
        return self._call(Client.resume)

    def rerun(self, *, by: str = "") -> PastRun:
        """:meth:`Client.rerun <framework.runtime.Client.rerun>`."""
        return self._call(Client.rerun, by=by)

    def processes(self) -> tuple[int, int]:
        """:meth:`Client.processes <framework.runtime.Client.processes>`."""
        return self._call(Client.processes)

    def purge(self, *, force: bool = False, grace: float = 30.0, by: str = "") -> bool:
        """:meth:`Client.purge <framework.runtime.Client.purge>`."""
        return self._call(Client.purge, force=force, grace=grace, by=by)

    def purge_queue(self, queue: str, *, by: str = "") -> int:
        """:meth:`Client.purge_queue <framework.runtime.Client.purge_queue>`."""
        return self._call(Client.purge_queue, queue, by=by)

    def requeue(self, dead_letter: str) -> str:
        """:meth:`Client.requeue <framework.runtime.Client.requeue>`."""
        return self._call(Client.requeue, dead_letter)

    def discard(self, dead_letter: str) -> None:
        """:meth:`Client.discard <framework.runtime.Client.discard>`."""
        self._call(Client.discard, dead_letter)

    def dead_letters(self) -> list[DeadLetter]:
        """:meth:`Client.dead_letters <framework.runtime.Client.dead_letters>`."""
        return self._call(Client.dead_letters)
