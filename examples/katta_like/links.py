"""``NodeLinks``: a search client's persistent connections to the search nodes.

Guarantees:

* One TCP connection per node address, opened on the first call to it and shared by every
  call after it: calls are pipelined (sent without waiting for earlier answers) and their
  answers matched by id (:mod:`examples.katta_like.wire`).
* A call is sent whole or not at all, whoever cancels its caller: frames go out through
  one writer task per connection, never from the caller, so a cancelled call (a hedge
  answered first, a timeout) leaves the connection usable and its answer, when it comes,
  is dropped.
* A connection that fails - refused, reset, closed by the node, or bytes that are not
  frames - fails every call waiting on it with :class:`LinkFailed` at once, and is
  forgotten: the next call to that address opens a new one.
* No timeout of its own but :data:`CONNECT_TIMEOUT` (connecting, and the TLS handshake
  when the links use TLS): the caller bounds each call (a node frozen with SIGSTOP accepts
  connections and calls, and never answers).
* TLS (``tls``, default ``$KATTA_TLS*``, see :mod:`examples.katta_like.wire`): a node
  whose certificate does not verify, or that refuses ours, is a :class:`LinkFailed`.
"""

from __future__ import annotations

import itertools
import math
import ssl
from typing import Any

import attrs
import trio

from examples.katta_like.wire import (
    FROM_ENV,
    Answer,
    Call,
    FrameReader,
    Kind,
    ProtocolError,
    ShardRequest,
    client_context,
    frame,
    unpack,
)
from framework import get_logger, records, tls_client_stream
from framework.errors import FrameworkError

log = get_logger("examples.katta_like.links")

#: Seconds a connection may take to open (a call's own deadline usually ends it first).
CONNECT_TIMEOUT = 5.0


class LinkFailed(FrameworkError):
    """The connection to a node could not be opened, or failed while a call waited on it:
    that call will not be answered on it."""


@attrs.define(eq=False)
class _Waiter:
    """One call waiting for its answer (or for its connection's failure)."""

    done: trio.Event = attrs.Factory(trio.Event)
    answer: dict[str, Any] | None = None
    failure: LinkFailed | None = None


@attrs.define(eq=False)
class _Link:
    """One connection: its state, its calls waiting for answers, its frames to send."""

    address: str
    outbox: trio.MemorySendChannel[bytes]
    inbox: trio.MemoryReceiveChannel[bytes]
    ready: trio.Event = attrs.Factory(trio.Event)  # connected, or failed
    waiting: dict[int, _Waiter] = attrs.Factory(dict)
    failure: LinkFailed | None = None
    scope: trio.CancelScope = attrs.Factory(trio.CancelScope)

    def end(self, why: str) -> None:
        """Fail the connection (once): every waiting call fails, its tasks stop."""
        if self.failure is None:
            self.failure = LinkFailed(f"connection to {self.address}: {why}")
        self.scope.cancel()


class NodeLinks:
    """The connections of one client; its tasks run in ``nursery`` (the client's)."""

    def __init__(self, nursery: trio.Nursery, *, tls: ssl.SSLContext | None = FROM_ENV) -> None:
        self._tls = client_context() if tls is FROM_ENV else tls
        self._nursery = nursery
        self._links: dict[str, _Link] = {}
        self._ids = itertools.count(1)

    async def call(self, address: str, kind: Kind, request: ShardRequest) -> Answer:
        """Send one call to the node at ``address`` (``host:port``) and wait for its
        :class:`Answer` (its ``reply`` as plain values, or its ``error``).  Raises
        :class:`LinkFailed` if the connection fails first, :class:`ProtocolError` if
        the node's answer is not an :class:`Answer`."""
        link = self._links.get(address)
        if link is None:
            link = self._open(address)
        if not link.ready.is_set():
            await link.ready.wait()
        if link.failure is not None:
            raise LinkFailed(str(link.failure))  # a new one: tasks raise it concurrently
        call_id = next(self._ids)
        waiter = link.waiting[call_id] = _Waiter()
        try:
            link.outbox.send_nowait(frame(Call(call_id, kind, request)))
            await waiter.done.wait()
        finally:
            link.waiting.pop(call_id, None)
        if waiter.failure is not None:
            raise LinkFailed(str(waiter.failure))
        try:
            return records.structure(waiter.answer, Answer)
        except records.CorruptRecord as exc:
            raise ProtocolError(f"{address}: {exc}") from None

    def close(self) -> None:
        """Close every connection (their calls fail)."""
        for link in list(self._links.values()):
            link.end("closed by the client")

    def _open(self, address: str) -> _Link:
        outbox, inbox = trio.open_memory_channel[bytes](math.inf)
        link = self._links[address] = _Link(address, outbox, inbox)
        self._nursery.start_soon(self._run, link)
        return link

    async def _run(self, link: _Link) -> None:
        """Connect, then read answers and write calls until the connection fails."""
        stream: trio.abc.Stream | None = None
        try:
            with link.scope:
                host, _, port = link.address.rpartition(":")
                try:
                    with trio.fail_after(CONNECT_TIMEOUT):
                        stream = await trio.open_tcp_stream(host.strip("[]"), int(port))
                        stream = await tls_client_stream(stream, self._tls, host)
                except (OSError, ValueError, trio.TooSlowError,
                        trio.BrokenResourceError) as exc:
                    link.end(f"cannot connect ({exc!r})")
                    return
                link.ready.set()
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._write, link, stream)
                    await self._read(link, stream)
        finally:
            if self._links.get(link.address) is link:
                del self._links[link.address]
            link.end("closed")
            assert link.failure is not None
            log.debug("katta.link_closed", address=link.address, error=str(link.failure),
                      waiting=len(link.waiting))
            link.ready.set()
            for waiter in link.waiting.values():
                waiter.failure = link.failure
                waiter.done.set()
            link.waiting.clear()
            if stream is not None:
                with trio.CancelScope(shield=True):
                    await trio.aclose_forcefully(stream)

    @staticmethod
    async def _read(link: _Link, stream: trio.abc.Stream) -> None:
        reader = FrameReader(stream)
        try:
            while (body := await reader.next()) is not None:
                answer = unpack(body)
                waiter = link.waiting.pop(answer["id"], None)
                if waiter is not None:  # else its caller gave up: dropped
                    waiter.answer = answer
                    waiter.done.set()
            link.end("closed by the node")
        except (ProtocolError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            link.end(str(exc) or repr(exc))

    @staticmethod
    async def _write(link: _Link, stream: trio.abc.Stream) -> None:
        try:
            async for data in link.inbox:
                batch = [data]
                while True:  # whatever else is queued goes in the same send
                    try:
                        batch.append(link.inbox.receive_nowait())
                    except trio.WouldBlock:
                        break
                await stream.send_all(b"".join(batch) if len(batch) > 1 else data)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            link.end(str(exc) or repr(exc))
