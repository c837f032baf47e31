"""Rendezvous: one znode where a master publishes its address and workers wait for it.

The launcher calls :meth:`Rendezvous.prepare` (an empty node), the master calls
:meth:`Rendezvous.publish`, workers call :meth:`Rendezvous.wait` (a watch, never polling).
An empty or missing node means "no address yet".
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from framework import errors
from framework.logs import get_logger
from framework.zk import Session, validate_data, validate_path, watch_data

log = get_logger("framework.primitives.rendezvous")


class Rendezvous:
    """The rendezvous node at ``path``.

    * SUSPENDED: waiters keep waiting and read again once reconnected; a publish waits for
      the connection (a publish whose reply was lost is checked, not blindly repeated).
    * LOST: an ``ephemeral`` publication disappears with the publisher's session (that is its
      purpose: workers then see "no address" instead of a dead master's).  It is not
      re-published automatically; the publisher decides (usually a new leader publishes).
      Waiters are unaffected beyond reading again in their new session.
    """

    def __init__(self, session: Session, path: str) -> None:
        validate_path(path, allow_root=False)
        self.session = session
        self.path = path

    async def prepare(self) -> None:
        """Make the node exist and be empty (the launcher's step; clears an old address)."""
        session = self.session
        while True:
            stat = await session.exists(self.path)
            try:
                if stat is None:
                    await session.create(self.path, b"", makepath=True)
                elif stat.ephemeralOwner:
                    await session.transaction().delete(self.path, version=stat.version).create(
                        self.path, b""
                    ).commit()
                elif stat.dataLength:
                    await session.set(self.path, b"", version=stat.version)
                log.info("rendezvous.prepared", path=self.path)
                return
            except (errors.NodeExistsError, errors.BadVersionError, errors.NoNodeError,
                    errors.TransactionFailedError, errors.ConnectionLossError):
                await session.wait_connected()  # look again: the next round settles it

    async def publish(self, data: bytes, *, ephemeral: bool = False) -> None:
        """Fill in the address.  With ``ephemeral`` the node lives only as long as our
        session (an empty persistent node left by :meth:`prepare` is replaced atomically).
        Raises :class:`NodeExistsError` if another live session published ephemerally."""
        data = validate_data(data)
        if not data:
            raise errors.ConfigurationError("publish needs non-empty data (empty means unset)")
        session = self.session
        while True:
            stat = await session.exists(self.path)
            if stat is not None and stat.ephemeralOwner not in (0, session.session_id):
                raise errors.NodeExistsError(f"{self.path} is published by another live session")
            try:
                if stat is None:
                    await session.create(self.path, data, ephemeral=ephemeral, makepath=True)
                elif ephemeral and not stat.ephemeralOwner:
                    if stat.numChildren:
                        raise errors.ConfigurationError(
                            f"{self.path} has children: cannot make it ephemeral"
                        )
                    await session.transaction().delete(self.path, version=stat.version).create(
                        self.path, data, ephemeral=True
                    ).commit()
                else:
                    await session.set(self.path, data, version=stat.version)
            except (errors.NodeExistsError, errors.BadVersionError, errors.NoNodeError,
                    errors.TransactionFailedError, errors.ConnectionLossError):
                await session.wait_connected()
                if await self._published(data, ephemeral):
                    break
                continue
            break
        log.info("rendezvous.published", path=self.path, ephemeral=ephemeral)

    async def _published(self, data: bytes, ephemeral: bool) -> bool:
        """After an unclear outcome: is our publication in place?"""
        try:
            current, stat = await self.session.get(self.path)
        except errors.NoNodeError:
            return False
        owner_ok = stat.ephemeralOwner == self.session.session_id if ephemeral else (
            stat.ephemeralOwner == 0
        )
        return current == data and owner_ok

    async def get(self) -> bytes | None:
        """The published data now, or ``None``."""
        try:
            data, _ = await self.session.get(self.path)
        except errors.NoNodeError:
            return None
        return data or None

    async def wait(self) -> bytes:
        """Wait (on a watch) until an address is published; return it."""
        async for data in self.watch():
            if data is not None:
                return data
        raise AssertionError("unreachable: watch() never ends")

    async def watch(self) -> AsyncIterator[bytes | None]:
        """Yield the published data (``None``: none yet), then every change of it."""
        last: object = object()
        async for snap in watch_data(self.session, self.path):
            value = snap.data or None
            if value != last:
                last = value
                yield value
