"""Ephemeral nodes a bounded clean-up could not delete, deleted once the connection is back.

A clean-up (:func:`~framework.zk.cleanup_scope`) gives up a second after the server may
have expired the session (at most one session timeout and a second after it started).
Usually the session has expired by then and its ephemeral nodes went with it.  But a
session survives a longer outage when the whole ensemble was unable to expire it (a
ZooKeeper leader election, a quorum lost for a while): the server resets every session's
timer when it serves again.  Then the node the clean-up meant to delete - a lock contender, a
queue claim, a place in a line - is still there, held by a live session, and blocks everyone
behind it until that session ends.

So a clean-up that gives up hands its node to the session's :class:`Leftovers`: as soon as
the connection is back *in the same session*, each one is read and deleted at the version
read, only if this session owns it (``ephemeralOwner``) and, when the caller said what it
holds, only if it still holds that (a queue claim's token: a claim node of the same name made
since by us or by another consumer is never touched).  A node known only by the GUID in its
name is found by listing its parent after a ``sync`` (a lagging follower must not hide it).
A step whose reply is lost is sent again at the next reconnection (at once if the connection
came back before the loss was known); a node found gone, not ours or changed is done.  When
the session is lost they are forgotten: the server deleted them with it.

No trio task runs this: each step is a request sent on the session's connection with a
callback, which the connection runs in the trio thread with the reply and which sends the
next step, so nothing outlives the session's ``async with``.
"""

from __future__ import annotations

from typing import Any

import attrs
import outcome
import trio
from kazoo import exceptions as kz
from kazoo.protocol.serialization import Delete, GetChildren, GetData, Sync

from framework.logs import get_logger

log = get_logger("framework.zk")

#: kazoo errors that mean "not now": the delete is sent again at the next reconnection.
_RETRY = (kz.ConnectionLoss, kz.SessionExpiredError, kz.ConnectionClosedError,
          kz.OperationTimeoutError)


@attrs.define(eq=False)
class Leftover:
    """A node of session ``session_id`` to delete: ``path`` itself, or (with ``guid``) the
    child of ``path`` whose name carries it.  Paths are relative to the session's chroot."""

    path: str
    session_id: int
    data: bytes | None = None  # what the node must still hold to be deleted (None: any)
    guid: str | None = None
    in_flight: bool = False
    step: str = "start"  # start -> (sync -> list ->) get -> delete
    sent_in: int = 0  # the connection (Leftovers' count of reconnections) it was sent on


class Leftovers:
    """The leftovers of one :class:`~framework.zk.Session` (see the module doc)."""

    def __init__(self) -> None:
        self._pending: list[Leftover] = []
        self._connection: Any = None
        self._session_id: int | None = None
        self._connections = 0  # how many times the connection came up
        self._settled = trio.Event()  # set while nothing is pending
        self._settled.set()

    @property
    def pending(self) -> list[Leftover]:
        """The leftovers not yet deleted (for tests and diagnostics)."""
        return list(self._pending)

    async def wait_settled(self) -> None:
        """Return once no leftover is pending (deleted, found gone, or forgotten with the
        session)."""
        while self._pending:
            await self._settled.wait()

    def _check_settled(self) -> None:
        if not self._pending:
            self._settled.set()

    def add(self, leftover: Leftover) -> None:
        if self._settled.is_set():
            self._settled = trio.Event()
        self._pending.append(leftover)
        log.warning("zk.leftover", path=leftover.path, guid=leftover.guid,
                    note="not deleted in time; deleted when the connection is back")
        self._sweep()

    def connected(self, connection: Any, session_id: int | None) -> None:
        """The connection is up in session ``session_id``: forget the nodes of other
        sessions, send the deletes of this one's."""
        self._connection, self._session_id = connection, session_id
        self._connections += 1
        self._pending = [p for p in self._pending if p.session_id == session_id]
        self._check_settled()
        self._sweep()

    def disconnected(self) -> None:
        self._connection = None

    def forget(self) -> None:
        """The session is lost or closed: the server deletes (or deleted) its nodes."""
        self._pending = []
        self._check_settled()

    def _sweep(self) -> None:
        if self._connection is None:
            return
        for leftover in list(self._pending):
            if leftover.session_id == self._session_id and not leftover.in_flight:
                self._send(leftover)

    def _send(self, leftover: Leftover, version: int = -1) -> None:
        connection = self._connection
        if connection is None or connection.session_id != leftover.session_id:
            return  # already in another session (trio will hear of it next)
        leftover.in_flight = True
        leftover.sent_in = self._connections
        if leftover.step == "start":
            leftover.step = "sync" if leftover.guid is not None else "get"
        path = connection.chroot + leftover.path
        if leftover.step == "sync":
            record: Any = Sync(path)
        elif leftover.step == "list":
            record = GetChildren(path, None)
        elif leftover.step == "get":
            record = GetData(path, None)
        else:
            record = Delete(path, version)
        try:
            connection.send(record, lambda done: self._replied(leftover, done))
        except kz.KazooException:  # not connected, or closing: sent again at reconnection
            leftover.in_flight = False

    def _replied(self, leftover: Leftover, done: outcome.Outcome[Any]) -> None:
        leftover.in_flight = False
        if leftover not in self._pending:
            return
        try:
            value = done.unwrap()
        except _RETRY:  # sent again at the next reconnection, from a fresh read
            leftover.step = {"delete": "get", "list": "sync"}.get(leftover.step, leftover.step)
            if self._connection is not None and self._connections != leftover.sent_in:
                # that reconnection came before this reply (its sweep skipped us: we were
                # in flight): now, once per connection, never in a loop
                self._send(leftover)
            return
        except kz.KazooException:
            value = None  # gone, or changed since: nothing of ours to delete
            leftover.step = "done"
        if leftover.step == "sync":
            leftover.step = "list"
            self._send(leftover)
            return
        if leftover.step == "list":
            mine = [name for name in value or () if leftover.guid in name]
            if mine:  # now the node itself, by its full name
                leftover.path, leftover.guid = f"{leftover.path}/{mine[0]}", None
                leftover.step = "get"
                self._send(leftover)
                return
        elif leftover.step == "get":
            data, stat = value
            if stat.ephemeralOwner == leftover.session_id and (
                leftover.data is None or data == leftover.data
            ):
                leftover.step = "delete"
                self._send(leftover, version=stat.version)
                return
        self._pending.remove(leftover)
        self._check_settled()
        log.info("zk.leftover_done", path=leftover.path, guid=leftover.guid)
