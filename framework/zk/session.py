"""``Session``: one ZooKeeper session, used from trio.

A ``Session`` owns one :class:`~framework.zk.connection.Connection`, which speaks ZooKeeper's
client protocol from trio itself with kazoo's protocol records: a request is written and its
reply awaited by the calling task, with no thread in between.  Reads are retried here only
within the same session; writes are never retried, because after a ``ConnectionLossError``
their outcome is unknown.

What a caller sees when the connection wavers:

* SUSPENDED: new requests wait for the connection to come back (nothing was sent, so waiting
  is safe); requests already in flight fail with :class:`ConnectionLossError`.  The connection
  is declared dead when no reply has come for 2/3 of the session timeout, however many
  requests this process is sending (:mod:`framework.zk.liveness`).  :meth:`Session.guard` (and
  every lock, claim and leadership) keeps its body running through a short suspension, such as
  a ZooKeeper leader change, and cancels it at :meth:`Session.trusted_until` at the latest:
  a third of the session timeout before the server could expire the session.
* LOST: requests in flight fail with :class:`SessionExpiredError`; guarded work is cancelled;
  the connection goes on with a *new* session, reported as CONNECTED with another
  ``session_id``.

The session lives in the trio loop that entered it: its heartbeat and its reader are trio
tasks.  A loop blocked (a CPU-bound step, not an ``await``) longer than the read timeout is
treated like a paused process: its ownership scopes end at their trust deadline.
"""

from __future__ import annotations

import math
import time
from contextlib import AsyncExitStack, asynccontextmanager, contextmanager
from typing import Any, AsyncIterator, Callable, Iterator, Sequence, cast

import outcome
import trio
from kazoo import exceptions as kz
from kazoo.hosts import collect_hosts
from kazoo.protocol.serialization import (
    CheckVersion,
    Create,
    Delete,
    Exists,
    GetChildren,
    GetChildren2,
    GetData,
    SetData,
    Sync,
)
from kazoo.protocol.serialization import Transaction as MultiRequest
from kazoo.protocol.states import ZnodeStat
from kazoo.security import OPEN_ACL_UNSAFE

from framework import errors
from framework.logs import get_logger
from framework.zk.acl import FROM_ENV, TlsConfig, resolve_security
from framework.zk.connection import Connection
from framework.zk.inflight import InFlightLimit
from framework.zk.leftovers import Leftover, Leftovers
from framework.zk.liveness import Liveness
from framework.zk.paths import MAX_REQUEST_BYTES, validate_data, validate_path
from framework.zk.scopes import single_body_error
from framework.zk.states import SessionState, StateChange
from framework.zk.translate import describe, translate
from framework.zk.trust import Trust, TrustKeeper
from framework.zk.wire import (
    ADD_WATCH_PERSISTENT,
    ADD_WATCH_RECURSIVE,
    REMOVE_PERSISTENT,
    REMOVE_RECURSIVE,
    AddWatch,
    CreateTTL,
    RemoveWatches,
)

Stat = ZnodeStat
WatchCallback = Callable[..., None]

log = get_logger("framework.zk")

#: Upper bounds of a multi request's framing and of one operation's encoding besides its
#: path and data (op header, lengths, version, flags, an open ACL).
_MULTI_HEADER = 64
_OP_OVERHEAD = 64

#: Seconds a closing session waits for the server to answer its close request.
CLOSE_GRACE = 1.0


class Session:
    """An async context manager holding one ZooKeeper session.

    ``hosts`` is a kazoo connect string (``"127.0.0.1:2181,127.0.0.1:2182"``).  ``chroot``, if
    given, is created when missing and every path is then relative to it.  ``session_timeout``
    is asked of the server (which clamps it to its min/max).  At most ``max_in_flight``
    requests are outstanding at once; more callers wait their turn.

    ``suspended_grace`` is how long locks, claims and leadership survive a SUSPENDED
    connection before their bodies are cancelled.  The default (``None``) keeps them until
    :meth:`trusted_until`, which rides through a ZooKeeper leader change (a stall of about a
    second) and still ends every body a third of the session timeout before the server could
    hand what it owned to someone else.  A number (under a third of ``session_timeout``)
    cancels sooner: ``0`` at the first sign of trouble.

    Security (:mod:`framework.zk.acl`; each left out is read from the environment,
    ``FRAMEWORK_ZK_AUTH``, ``FRAMEWORK_ZK_ACL``, ``FRAMEWORK_ZK_TLS*``): ``auth`` is
    ``"user:password"`` sent as digest authentication on every connection; ``acl`` is the
    policy of every znode this session creates (``"open"``, ``"creator"``: only those
    credentials, ``"creator-read"``: and anyone may read); ``tls`` a :class:`TlsConfig`
    (or ``True``) to connect to the servers' secure client port.
    """

    def __init__(
        self,
        hosts: str,
        *,
        chroot: str | None = None,
        session_timeout: float = 10.0,
        connect_timeout: float = 15.0,
        suspended_grace: float | None = None,
        max_in_flight: int = 1024,
        auth: str | tuple[str, str] | None = FROM_ENV,
        acl: str | None = FROM_ENV,
        tls: TlsConfig | bool | None = FROM_ENV,
    ) -> None:
        if not hosts or not isinstance(hosts, str):
            raise errors.ConfigurationError("ZooKeeper hosts must be a non-empty string")
        if "/" in hosts:
            raise errors.ConfigurationError(
                "give the chroot as Session(chroot=...), not inside the hosts string"
            )
        _check_hosts(hosts)
        if chroot is not None:
            validate_path(chroot, allow_root=False)
        for name, value in (("session_timeout", session_timeout),
                            ("connect_timeout", connect_timeout),
                            ("suspended_grace", suspended_grace)):
            if value is None and name == "suspended_grace":
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise errors.ConfigurationError(
                    f"{name} must be a number of seconds, got {value!r}"
                )
        if session_timeout <= 0 or connect_timeout <= 0:
            raise errors.ConfigurationError("timeouts must be positive (grace may be 0)")
        if suspended_grace is not None and suspended_grace >= session_timeout / 3:
            # kazoo reports SUSPENDED up to 2/3 of the session timeout after the server last
            # heard from us; the server may expire the session 1/3 later and hand our locks,
            # claims and leadership to others.  Ownership must end before that.
            raise errors.ConfigurationError(
                f"suspended_grace ({suspended_grace:g}s) must be under a third of the session "
                f"timeout ({session_timeout:g}s): after that the server may already have "
                "expired the session and given its locks or leadership to someone else"
            )
        self.security = resolve_security(auth, acl, tls)
        self._acl = self.security.acl()
        self.hosts = hosts
        self.chroot = chroot
        self.session_timeout = session_timeout
        self.connect_timeout = connect_timeout
        self.suspended_grace = suspended_grace
        self._limit = InFlightLimit(max_in_flight)
        self._liveness = Liveness(session_timeout)
        self._trust = TrustKeeper(self._liveness)
        self._connection: Connection | None = None
        self._stack: AsyncExitStack | None = None
        self._state = SessionState.LOST
        self._session_id: int | None = None
        self._generation = 0
        self._changed = trio.Event()
        self._closed = False
        self._prefix = ""  # the chroot, once it exists

    # ------------------------------------------------------------------ lifecycle

    async def __aenter__(self) -> Session:
        self._leftovers = Leftovers()
        hosts, _chroot = _collect_hosts(self.hosts)
        connection = Connection(
            hosts,
            session_timeout=self.session_timeout,
            liveness=self._liveness,
            on_state=self._on_state,
            auth_data=self.security.auth_data(),
            ssl_context=self.security.tls.ssl_context() if self.security.tls else None,
        )
        self._connection = connection
        self._stack = AsyncExitStack()
        try:
            nursery = await self._stack.enter_async_context(trio.open_nursery())
            nursery.start_soon(connection.run)
            with trio.fail_after(self.connect_timeout):
                await self.wait_connected()
            if self.chroot:
                await self._make_chroot(self.chroot)
                connection.chroot = self._prefix = self.chroot
        except BaseException as exc:
            await self._shutdown()
            if isinstance(exc, trio.TooSlowError):
                raise errors.NotConnectedError(
                    f"could not connect to ZooKeeper at {self.hosts} within "
                    f"{self.connect_timeout:g}s: is a server running there? "
                    "(`python -m framework zk` starts a local one)" + (
                        "; with TLS: is that the servers' secureClientPort, and does the CA "
                        "(FRAMEWORK_ZK_TLS_CA) verify their certificate?"
                        if self.security.tls is not None else "")
                ) from None
            raise
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self._shutdown()

    async def _shutdown(self) -> None:
        if self._closed or self._connection is None or self._stack is None:
            return
        self._closed = True
        self._trust.close()
        connection, stack = self._connection, self._stack
        with trio.CancelScope(shield=True):
            # a healthy close takes one round trip; a server that does not answer must not
            # hold the caller for a session timeout: past CLOSE_GRACE the connection is
            # dropped and the server expires the session by itself
            await connection.close(CLOSE_GRACE if self.state is SessionState.CONNECTED else 0.0)
        # the connection's nursery is left outside the shield (it encloses it)
        connection.stop()
        await stack.aclose()
        self._on_state(SessionState.LOST, None)
        log.info("zk.session.closed", hosts=self.hosts)

    # ------------------------------------------------------------------ state

    def _on_state(self, state: SessionState, session_id: int | None) -> None:
        previous_id = self._session_id
        if state is SessionState.CONNECTED:
            self._session_id = session_id
        elif state is SessionState.LOST:
            self._session_id = None
        if state is self._state and self._session_id == previous_id:
            return
        self._state = state
        self._generation += 1
        self._changed.set()
        self._changed = trio.Event()
        if state is SessionState.CONNECTED and not self._closed:
            self._leftovers.connected(self._connection, session_id)
        else:
            self._leftovers.disconnected()
            if state is SessionState.LOST or self._closed:
                self._leftovers.forget()
        if self._closed and state is SessionState.LOST:
            return
        if state is SessionState.CONNECTED:
            log.info(
                "zk.session.connected",
                session_id=_hex(session_id),
                new_session=session_id != previous_id,
                hosts=self.hosts,
                **self.security.describe(),
            )
        elif state is SessionState.SUSPENDED:
            log.warning("zk.session.suspended", session_id=_hex(previous_id), hosts=self.hosts)
        else:
            log.warning("zk.session.lost", session_id=_hex(previous_id), hosts=self.hosts)

    @property
    def state(self) -> SessionState:
        """The latest state seen in this trio run."""
        return self._state

    @property
    def session_id(self) -> int | None:
        """The id of the current session, or ``None`` while there is none."""
        return self._session_id

    @property
    def connected(self) -> bool:
        return self._state is SessionState.CONNECTED and not self._closed

    @property
    def client_id(self) -> tuple[int, bytes]:
        """``(session_id, password)`` as the server knows them (for tools that must act as
        this session, such as the fault injectors that expire it)."""
        connection = self._connection
        if connection is None or connection.session_id is None:
            raise errors.NotConnectedError("session not started: use `async with Session(...)`")
        return connection.session_id, connection.password

    @property
    def server(self) -> tuple[str, int] | None:
        """The ensemble member the session is connected to now (``None`` while not)."""
        return self._connection.peer if self._connection is not None else None

    def snapshot(self) -> StateChange:
        return StateChange(self._state, self._session_id, self._generation)

    async def wait_change(self, generation: int) -> StateChange:
        """Wait until the state generation is past ``generation``; return the latest state."""
        while self._generation <= generation:
            await self._changed.wait()
        return self.snapshot()

    async def wait_connected(self) -> int:
        """Wait until connected; return the session id."""
        while self._state is not SessionState.CONNECTED:
            if self._closed:
                raise errors.NotConnectedError("session is closed")
            if self._connection is not None and self._connection.failure is not None:
                raise errors.NotConnectedError(self._connection.failure)
            await self._changed.wait()
        assert self._session_id is not None
        return self._session_id

    async def states(self) -> AsyncIterator[StateChange]:
        """Yield the current state, then every later one (a slow reader sees the latest)."""
        seen = -1
        while True:
            if self._generation > seen:
                current = self.snapshot()
                seen = current.generation
                yield current
            await self._changed.wait()

    @asynccontextmanager
    async def guard(self, *, suspended_grace: float | None = None) -> AsyncIterator[None]:
        """Run a block only while this session can be trusted.

        The block is cancelled, and :class:`SessionInterrupted` is raised from the ``async
        with``, when the session that was current on entry is lost (expired, closed, or
        replaced by a new one), when no reply has proven it alive before
        :meth:`trusted_until` (a silent link, or this process paused: trio's own scheduler
        cancels the block at that deadline, whichever task it runs first), or when the
        connection stays SUSPENDED longer than ``suspended_grace`` seconds (default: the
        session's); ``math.inf`` ignores suspensions and the deadline (unsafe).  Entering
        while not connected raises at once.  Reasons: ``"lost"``, ``"suspended"``.
        """
        grace = self.suspended_grace if suspended_grace is None else suspended_grace
        if not self.connected:
            raise errors.SessionInterrupted("suspended" if not self._closed else "lost")
        session_id = self._session_id
        reason: list[str] = []
        with single_body_error():
            async with trio.open_nursery() as nursery:
                scope = nursery.cancel_scope
                try:
                    with self.trusting(scope, session_id, grace) as trust:
                        nursery.start_soon(self._cancel_when_untrusted, session_id, grace,
                                           reason, scope)
                        yield
                finally:
                    scope.cancel()  # after the trust is settled (see Trust)
        if not reason and trust.expired:
            reason.append(self.expired_reason(session_id))
        if reason:
            raise errors.SessionInterrupted(reason[0])

    async def _cancel_when_untrusted(
        self, session_id: int | None, grace: float | None, reason: list[str],
        scope: trio.CancelScope
    ) -> None:
        reason.append(await self.wait_untrusted(session_id, grace, scope=scope))
        scope.cancel()

    def trusted_until(self) -> float:
        """The trio time until which the current session is provably alive with a margin.

        That is the send time of the newest request answered through the leader (a write,
        a ``sync``: a follower's replies to reads and pings prove nothing) plus 2/3 of the
        session timeout: the server cannot expire the session within the remaining third.
        While connected the value keeps moving forward; once the connection drops it stays.
        """
        return trio.current_time() + (self._liveness.trusted_until() - time.monotonic())

    def is_trusted(self, session_id: int | None = None) -> bool:
        """True while the session (``session_id``, if given) is provably alive on the server.

        Synchronous and callable from any thread: the newest reply's send time plus 2/3 of
        the session timeout is still ahead of the monotonic clock, and the session was not
        lost, closed or replaced.  A SUSPENDED connection within that window is trusted."""
        wanted = self._session_id if session_id is None else session_id
        if self._closed or wanted is None or self._liveness.session_id != wanted:
            return False
        return time.monotonic() < self._liveness.trusted_until()

    def ensure_trusted(self, session_id: int | None = None) -> None:
        """Raise :class:`SessionInterrupted` unless :meth:`is_trusted`.

        Call it right before an effect outside ZooKeeper that only an owner may cause
        (writing a file, answering a client, acknowledging a publish): a process that was
        paused (GC, VM migration, SIGSTOP) past its trust deadline raises here before the
        effect, even if trio has not yet run the task that cancels its scope.  The reason is
        ``"lost"`` when the session is gone or replaced, else ``"suspended"``."""
        if self.is_trusted(session_id):
            return
        wanted = self._session_id if session_id is None else session_id
        gone = self._closed or wanted is None or self._liveness.session_id != wanted
        raise errors.SessionInterrupted("lost" if gone else "suspended")

    @property
    def read_timeout(self) -> float:
        """Seconds without a reply after which the connection counts as dead (2/3 of the
        negotiated session timeout)."""
        return self._liveness.read_timeout

    @contextmanager
    def trusting(
        self, scope: trio.CancelScope, session_id: int | None, grace: float | None
    ) -> Iterator[Trust]:
        """Keep ``scope``'s deadline at ``session_id``'s trust deadline inside the block.

        trio's scheduler then cancels the scope at that time by itself, before it runs any
        task of the scope, so a process that resumes from a pause past the deadline starts
        no new step in it; while replies prove the session alive the deadline moves forward
        (:mod:`framework.zk.trust`).  After the block, the yielded :class:`Trust` says
        whether the deadline ended the scope (``expired``): leave this block *before*
        cancelling the scope yourself.  ``grace=math.inf`` (unsafe) arms nothing."""
        if grace is not None and math.isinf(grace):
            yield Trust(session_id)
            return
        trust = self._trust.arm(scope, session_id)
        try:
            yield trust
        finally:
            self._trust.disarm(scope)

    def expired_reason(self, session_id: int | None) -> str:
        """The reason to give for a scope of ``session_id`` that its trust deadline ended
        (:attr:`Trust.expired`): ``"lost"`` if the session is gone, else ``"suspended"``."""
        gone = self._closed or session_id is None or self._liveness.session_id != session_id
        return "lost" if gone else "suspended"

    async def wait_untrusted(
        self, session_id: int | None, grace: float | None, *,
        scope: trio.CancelScope | None = None,
    ) -> str:
        """Return ``"lost"`` or ``"suspended"`` once ``session_id`` can no longer be trusted.

        While SUSPENDED, that is ``grace`` seconds after the suspension was noticed (``None``:
        no limit of its own) and never later than :meth:`trusted_until`; ``math.inf`` waits
        for LOST only (unsafe: the server may expire the session while the body still runs).

        With ``scope`` (armed with :meth:`trusting`, the scope this task runs in and is
        meant to cancel), the end of the grace period is also set as the scope's deadline.
        If a deadline passes before this task runs (a paused process), trio cancels the
        scope, this task with it, and nothing is returned: the owner of the scope tells that
        case by :attr:`Trust.expired`.
        """
        unsafe = grace is not None and math.isinf(grace)
        while True:
            if self._closed or self._session_id not in (session_id, None) or (
                self._state is SessionState.LOST
            ):
                return "lost"
            if self._state is SessionState.SUSPENDED:
                if unsafe:
                    deadline = math.inf
                else:
                    deadline = self.trusted_until()
                    if grace is not None:
                        deadline = min(deadline, trio.current_time() + grace)
                if deadline <= trio.current_time():
                    return "suspended"
                if scope is not None and grace is not None and not unsafe:
                    self._trust.cap(scope, deadline)
                with trio.move_on_at(deadline):
                    while self._state is SessionState.SUSPENDED and not self._closed:
                        await self._changed.wait()
                    continue
                return "suspended"
            if scope is not None and grace is not None and not unsafe:
                self._trust.cap(scope, math.inf)  # connected again: the grace starts anew
            await self._changed.wait()

    # ------------------------------------------------------------------ requests

    def _full(self, path: str) -> str:
        """``path`` as the server knows it (under the chroot)."""
        if not self._prefix:
            return path
        return self._prefix if path == "/" else self._prefix + path

    def _relative(self, path: str) -> str:
        """A server path given back by a create, seen from inside the chroot."""
        if self._prefix and path.startswith(self._prefix):
            return path[len(self._prefix):] or "/"
        return path

    async def _call(self, request: Any) -> Any:
        """Send one request (a kazoo protocol record: ``GetData(...)``) once and await its
        reply, with errors translated."""
        await self._limit.acquire()
        with self._limit.held():
            await self._usable()
            assert self._connection is not None
            try:
                return await self._connection.call(request)
            except kz.ConnectionClosedError as exc:  # closed for good: never retry
                raise errors.NotConnectedError(str(exc) or "connection closed") from exc
            except kz.AuthFailedError as exc:
                raise errors.NotConnectedError(str(exc)) from exc
            except kz.KazooException as exc:
                path = getattr(request, "path", None)
                context = None
                if isinstance(path, str):
                    context = describe(type(request).__name__, self._relative(path))
                raise self._explain(translate(exc, context)) from exc

    def _explain(self, error: BaseException) -> BaseException:
        """A NoAuth error saying who this session is and how to give it credentials."""
        if not isinstance(error, errors.NoAuthError):
            return error
        if self.security.credentials is None:
            who = ("this session has no credentials (set FRAMEWORK_ZK_AUTH=user:password, "
                   "or Session(auth=...))")
        else:
            who = (f"this session is authenticated as {self.security.user!r}, which the "
                   "node's ACL does not allow that")
        explained = errors.NoAuthError(f"{error}; {who}")
        explained.__cause__ = error.__cause__
        return explained

    async def _usable(self) -> None:
        """Wait for a connection before sending (sending nothing is always safe)."""
        if self._closed or self._connection is None:
            raise errors.NotConnectedError("session is closed")
        if self._state is not SessionState.CONNECTED:
            await self.wait_connected()

    async def _read(self, request: Any) -> Any:
        """A read, retried after a connection loss as long as the session is the same."""
        while True:
            session_id = self._session_id
            try:
                return await self._call(request)
            except errors.ConnectionLossError:
                await self.wait_connected()
                if self._session_id != session_id and session_id is not None:
                    raise errors.SessionExpiredError(
                        "session expired while a read was being retried"
                    ) from None

    async def create(
        self,
        path: str,
        data: bytes = b"",
        *,
        ephemeral: bool = False,
        sequence: bool = False,
        makepath: bool = False,
        ttl: float | None = None,
    ) -> str:
        """Create a node; return its path (with the sequence suffix when ``sequence``).

        ``ttl`` (seconds, persistent nodes only) makes a TTL node: the server deletes it once
        it has had no child and no write for that long (checked every
        ``znode.container.checkIntervalMs``, 60 s by default, so it can outlive its TTL by
        that much).  A server without ``extendedTypesEnabled=true`` refuses it with
        :class:`UnsupportedByServerError`.

        Not retried: after :class:`ConnectionLossError` the node may or may not exist (see
        :func:`framework.zk.protected.create_protected` for sequential nodes).
        """
        validate_path(path, allow_root=False)
        data = validate_data(data)
        request: Any
        if ttl is None:
            request = Create(self._full(path), data, self._acl,
                             (1 if ephemeral else 0) | (2 if sequence else 0))
        else:
            request = CreateTTL(self._full(path), data, self._acl, 6 if sequence else 5,
                                _ttl_ms(ttl, ephemeral))
        while True:
            try:
                # Parents are made here, in this task: a create whose caller was cancelled
                # (and cleaned up) can never be issued again behind its back.
                return self._relative(await self._call(request))
            except errors.ZooKeeperError as exc:
                if ttl is not None and isinstance(exc.__cause__, kz.UnimplementedError):
                    raise errors.UnsupportedByServerError(
                        f"create {path!r} with a TTL refused: the ZooKeeper server does not "
                        "enable TTL nodes (set extendedTypesEnabled=true in its zoo.cfg; "
                        "ZooKeeper 3.5.3 or later)"
                    ) from exc
                if not isinstance(exc, errors.NoNodeError):
                    raise
                parent = path.rsplit("/", 1)[0]
                if not makepath or not parent:
                    raise
                await self.ensure_path(parent)

    async def ensure_path(self, path: str) -> None:
        """Create ``path`` and its parents if missing (idempotent, safe to retry)."""
        validate_path(path)
        if path == "/":
            return
        while True:
            try:
                await self._call(Create(self._full(path), b"", self._acl, 0))
                return
            except errors.NodeExistsError:
                return
            except errors.NoNodeError:
                await self.ensure_path(path.rsplit("/", 1)[0] or "/")
            except errors.ConnectionLossError:
                await self.wait_connected()

    async def _make_chroot(self, chroot: str) -> None:
        """Create the chroot (with this session's ACL) if missing.  Its missing ancestors are
        a namespace shared with other applications and are created open: made with a
        ``creator`` ACL, the first application to create ``/apps`` would keep every other one
        (with other credentials) from creating its own chroot beside it."""
        parts = chroot.strip("/").split("/")
        while True:
            try:
                await self._call(Create(chroot, b"", self._acl, 0))
                return
            except errors.NodeExistsError:
                return
            except errors.NoNodeError:
                for depth in range(1, len(parts)):
                    ancestor = "/" + "/".join(parts[:depth])
                    try:
                        await self._call(Create(ancestor, b"", OPEN_ACL_UNSAFE, 0))
                    except errors.NodeExistsError:
                        pass
            except errors.ConnectionLossError:
                await self.wait_connected()

    async def get(self, path: str, *, watch: WatchCallback | None = None) -> tuple[bytes, Stat]:
        """Return ``(data, stat)``; raises :class:`NoNodeError` when missing."""
        validate_path(path)
        return cast("tuple[bytes, Stat]",
                    await self._read(GetData(self._full(path), _watcher(watch))))

    async def exists(self, path: str, *, watch: WatchCallback | None = None) -> Stat | None:
        """Return the node's stat, or ``None``.  A watch set here also fires on creation."""
        validate_path(path)
        return cast("Stat | None", await self._read(Exists(self._full(path), _watcher(watch))))

    async def children(self, path: str, *, watch: WatchCallback | None = None) -> list[str]:
        """Return the names of the children of ``path`` (unsorted, as the server gives them)."""
        validate_path(path)
        return cast("list[str]",
                    await self._read(GetChildren(self._full(path), _watcher(watch))))

    async def children_stat(
        self, path: str, *, watch: WatchCallback | None = None
    ) -> tuple[list[str], Stat]:
        """Return ``(children, stat)`` of ``path`` (``stat.pzxid``/``cversion`` version them)."""
        validate_path(path)
        return cast("tuple[list[str], Stat]",
                    await self._read(GetChildren2(self._full(path), _watcher(watch))))

    async def set(self, path: str, data: bytes, *, version: int = -1) -> Stat:
        """Write data; with ``version`` the write happens only if the node has that version."""
        validate_path(path)
        data = validate_data(data)
        return cast(Stat, await self._call(SetData(self._full(path), data, _version(version))))

    async def delete(self, path: str, *, version: int = -1, missing_ok: bool = False) -> None:
        """Delete a node (only at ``version`` when given)."""
        validate_path(path, allow_root=False)
        try:
            await self._call(Delete(self._full(path), _version(version)))
        except errors.NoNodeError:
            if not missing_ok:
                raise

    async def delete_tree(self, path: str) -> None:
        """Delete ``path`` and everything under it (not atomic; safe to repeat)."""
        validate_path(path, allow_root=False)
        try:
            kids = await self.children(path)
        except errors.NoNodeError:
            return
        for kid in kids:
            await self.delete_tree(f"{path}/{kid}")
        try:
            await self.delete(path, missing_ok=True)
        except errors.NotEmptyError:
            await self.delete_tree(path)

    async def sync(self, path: str = "/") -> None:
        """Make the server we are connected to catch up with the leader for ``path``."""
        validate_path(path)
        await self._read(Sync(self._full(path)))

    async def add_watch(self, path: str, callback: WatchCallback, *,
                        recursive: bool = False) -> None:
        """Watch ``path`` until :meth:`remove_watch` (ZooKeeper 3.6's persistent watches):
        ``callback(event)`` runs for every change - created, deleted, data changed (and
        children changed, unless ``recursive``) - of ``path``, and with ``recursive`` of
        every node below it too; the node need not exist.  Events come in the order of the
        changes, interleaved in order with replies read through :meth:`send_read`.

        SUSPENDED: the watch is set again on the next connection, and ``callback`` gets a
        ``NONE`` event in state ``CONNECTED``: what changed meanwhile was not told, read
        again.  LOST (or close): a ``NONE`` event in state ``EXPIRED_SESSION`` (``CLOSED``)
        and the watch is gone.  Raises :class:`UnsupportedByServerError` on a server
        older than 3.6."""
        validate_path(path)
        mode = ADD_WATCH_RECURSIVE if recursive else ADD_WATCH_PERSISTENT
        try:
            await self._read(AddWatch(self._full(path), mode, _watcher(callback)))
        except errors.ZooKeeperError as exc:
            if isinstance(exc.__cause__, kz.UnimplementedError):
                raise errors.UnsupportedByServerError(
                    "this ZooKeeper server has no persistent watches (addWatch, ZooKeeper "
                    "3.6 and newer)") from None
            raise

    async def remove_watch(self, path: str, callback: WatchCallback, *,
                           recursive: bool = False) -> None:
        """Stop calling ``callback`` for :meth:`add_watch`'s watch on ``path``; the server's
        watch is removed with the last callback where the server can remove a persistent
        watch alone (3.9); an older server keeps it until the next connection (which does
        not set it again) or the session's end, and its events are ignored."""
        validate_path(path)
        connection = self._connection
        if connection is None or not connection.forget_persistent(
                self._full(path), callback, recursive=recursive):
            return
        if not self.connected:
            return
        kind = REMOVE_RECURSIVE if recursive else REMOVE_PERSISTENT
        try:
            await self._call(RemoveWatches(self._full(path), kind))
        except (errors.ConnectionLossError, errors.NotConnectedError,
                errors.SessionExpiredError, errors.ZooKeeperError):
            pass  # gone with the connection, or the server has none left

    def send_read(self, kind: str, path: str, on_reply: Callable[[outcome.Outcome[Any]], Any],
                  *, watch: WatchCallback | None = None) -> None:
        """Send one read now - ``kind`` is ``"get"`` (``(data, stat)``), ``"exists"`` (the
        stat or ``None``; a watch then also fires on creation) or ``"children"`` (names) -
        and call ``on_reply(outcome)`` with its result (errors translated) in the
        order replies and watch events arrive: the reply of a read sent after an event
        describes the tree after that event, so a view updated only in these callbacks and
        in watch callbacks is never rolled back by a stale reply (trio's scheduler does not
        keep that order between tasks; callbacks run in the session's loop, and must not
        block).  Raises :class:`ConnectionLossError` at once when not connected (nothing
        sent).  Not counted against ``max_in_flight``."""
        validate_path(path)
        record: Any
        if kind == "get":
            record = GetData(self._full(path), _watcher(watch))
        elif kind == "exists":
            record = Exists(self._full(path), _watcher(watch))
        elif kind == "children":
            record = GetChildren(self._full(path), _watcher(watch))
        else:
            raise ValueError(f"kind must be 'get', 'exists' or 'children', got {kind!r}")
        connection = self._connection
        if self._closed or connection is None:
            raise errors.NotConnectedError("session is closed")
        if not self.connected:
            raise errors.ConnectionLossError("not connected to ZooKeeper")
        context = describe(type(record).__name__, path)

        def reply(result: outcome.Outcome[Any]) -> None:
            if isinstance(result, outcome.Error):
                result = outcome.Error(self._explain(translate(result.error, context)))
            on_reply(result)

        try:
            connection.send(record, reply)
        except kz.KazooException as exc:
            raise translate(exc, context) from exc

    def delete_later(self, path: str, *, data: bytes | None = None,
                     session_id: int | None = None) -> None:
        """Delete ephemeral node ``path`` of session ``session_id`` (default: the current
        one) as soon as the connection is back in that session, if that session owns it and
        (with ``data``) it still holds ``data``; forgotten once the session is lost.  For a
        clean-up that gave up while ZooKeeper was unreachable: a session can outlive that
        (:mod:`framework.zk.leftovers`)."""
        validate_path(path)
        owner = session_id if session_id is not None else self._session_id
        if owner is not None and not self._closed:
            self._leftovers.add(Leftover(path, owner, data))

    def delete_guid_later(self, parent: str, guid: str) -> None:
        """:meth:`delete_later` for the child of ``parent`` whose name carries ``guid`` (a
        protected create whose name we never learned)."""
        validate_path(parent)
        if self._session_id is not None and not self._closed:
            self._leftovers.add(Leftover(parent, self._session_id, guid=guid))

    @property
    def leftovers(self) -> list[Leftover]:
        """Nodes waiting for :meth:`delete_later` (diagnostics and tests)."""
        return self._leftovers.pending if self._connection is not None else []

    async def wait_leftovers_done(self) -> None:
        """Return once no node waits for :meth:`delete_later` (deleted, found gone, or
        forgotten with a lost session)."""
        await self._leftovers.wait_settled()

    def transaction(self) -> Transaction:
        """Start building a multi-op transaction (all applied, or none)."""
        return Transaction(self)

    def waker(self, event: trio.Event) -> WatchCallback:
        """A watch callback that sets ``event`` (watch callbacks run in this trio run)."""

        def wake(*_args: Any) -> None:
            event.set()

        return wake


class Transaction:
    """A builder for one atomic multi-op; ``await commit()`` sends it.

    A failed commit raises :class:`TransactionFailedError` carrying every operation's result.
    Like any write, a commit is not retried: after :class:`ConnectionLossError` its outcome
    is unknown (but it was applied entirely or not at all).
    """

    def __init__(self, session: Session) -> None:
        self._session = session
        self._ops: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    def create(
        self, path: str, data: bytes = b"", *, ephemeral: bool = False, sequence: bool = False
    ) -> Transaction:
        validate_path(path, allow_root=False)
        self._ops.append(
            ("create", (path, validate_data(data)),
             {"ephemeral": ephemeral, "sequence": sequence, "acl": self._session._acl})
        )
        return self

    def delete(self, path: str, *, version: int = -1) -> Transaction:
        validate_path(path, allow_root=False)
        self._ops.append(("delete", (path, version), {}))
        return self

    def set(self, path: str, data: bytes, *, version: int = -1) -> Transaction:
        validate_path(path)
        self._ops.append(("set_data", (path, validate_data(data), version), {}))
        return self

    def check(self, path: str, version: int) -> Transaction:
        validate_path(path)
        self._ops.append(("check", (path, version), {}))
        return self

    @property
    def operations(self) -> Sequence[tuple[str, tuple[Any, ...], dict[str, Any]]]:
        return tuple(self._ops)

    def _check_size(self, prefix: int) -> None:
        """Refuse a request the server would answer by dropping the connection (which would
        interrupt every guarded scope of the session): ZooKeeper takes at most about 1 MB
        per request, the sum of all its operations, not only each node's data."""
        total = _MULTI_HEADER
        for _name, args, _kwargs in self._ops:
            data = args[1] if len(args) > 1 and isinstance(args[1], bytes) else b""
            total += _OP_OVERHEAD + prefix + len(args[0].encode()) + len(data)
        if total > MAX_REQUEST_BYTES:
            raise errors.DataTooLargeError(
                f"transaction of {len(self._ops)} operations is about {total:,} bytes; "
                f"ZooKeeper accepts at most {MAX_REQUEST_BYTES:,} per request (split it into "
                "several transactions, or keep large data out of ZooKeeper)"
            )

    async def commit(self) -> list[Any]:
        """Apply every operation atomically; return their results in order."""
        if not self._ops:
            return []
        session = self._session
        self._check_size(len(session._prefix))
        request = MultiRequest([_record(session, name, args, kwargs)
                                for name, args, kwargs in self._ops])
        results = [session._relative(r) if isinstance(r, str) else r
                   for r in await session._call(request)]
        if any(isinstance(r, Exception) for r in results):
            raise errors.TransactionFailedError(
                [
                    session._explain(translate(cast(BaseException, r), describe(name, args[0])))
                    for r, (name, args, _kwargs) in zip(results, self._ops, strict=True)
                ]
            )
        return results


def _record(session: Session, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The kazoo protocol record of one transaction operation (paths already validated)."""
    path = session._full(args[0])
    if name == "create":
        flags = (1 if kwargs["ephemeral"] else 0) | (2 if kwargs["sequence"] else 0)
        return Create(path, args[1], kwargs["acl"], flags)
    if name == "delete":
        return Delete(path, args[1])
    if name == "set_data":
        return SetData(path, args[1], args[2])
    return CheckVersion(path, args[1])


def _watcher(watch: WatchCallback | None) -> WatchCallback | None:
    if watch is not None and not callable(watch):
        raise TypeError(f"watch must be a callable, got {watch!r}")
    return watch


def _ttl_ms(ttl: float, ephemeral: bool) -> int:
    """``ttl`` seconds as the whole milliseconds ZooKeeper takes (1 ms to 2**40 - 1 ms)."""
    if ephemeral:
        raise errors.ConfigurationError("a TTL node cannot be ephemeral (leave out ttl=)")
    if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not 0 < ttl * 1000 < 2**40:
        raise errors.ConfigurationError(
            f"ttl must be a positive number of seconds (at most about 34 years), got {ttl!r}"
        )
    return max(1, round(ttl * 1000))


def _version(version: int) -> int:
    if isinstance(version, bool) or not isinstance(version, int):
        raise TypeError(f"version must be an int, got {version!r}")
    return version


def _hex(session_id: int | None) -> str | None:
    return None if session_id is None else f"{session_id:#x}"


def _collect_hosts(hosts: str) -> tuple[list[tuple[str, int]], str | None]:
    """kazoo's parse of a connect string: ``[(host, port)]`` and the chroot in it."""
    return collect_hosts(hosts)  # type: ignore[no-untyped-call, no-any-return]


def _check_hosts(hosts: str) -> None:
    """A connect string kazoo can use, or :class:`ConfigurationError` saying what is wrong."""
    expected = "expected HOST:PORT[,HOST:PORT...] with ports 1-65535"
    try:
        parsed, _chroot = _collect_hosts(hosts)
    except ValueError as exc:
        raise errors.ConfigurationError(
            f"bad ZooKeeper hosts {hosts!r}: {exc}; {expected}") from None
    if not parsed or any(not host or not 0 < port < 65536 for host, port in parsed):
        raise errors.ConfigurationError(f"bad ZooKeeper hosts {hosts!r}: {expected}")
