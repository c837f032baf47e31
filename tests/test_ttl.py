"""TTL nodes: the embedded server enables them; a server without them says so clearly."""

from __future__ import annotations

import pytest
import trio

from framework import Session, ZooKeeperEnsemble
from framework.errors import ConfigurationError, UnsupportedByServerError
from framework.zk import wait_gone


async def test_a_ttl_node_is_reaped_once_idle(session: Session) -> None:
    path = await session.create("/ttl/node", b"x", ttl=0.2, makepath=True)
    assert path == "/ttl/node"
    data, _stat = await session.get(path)
    assert data == b"x"
    seq = await session.create("/ttl/seq-", b"", ttl=0.2, sequence=True)
    assert seq.startswith("/ttl/seq-") and seq[-10:].isdigit()
    with trio.fail_after(20):  # reaped by the server's container manager (every 0.5 s)
        await wait_gone(session, path)
        await wait_gone(session, seq)


async def test_bad_ttls_are_clear_errors(session: Session) -> None:
    with pytest.raises(ConfigurationError, match="cannot be ephemeral"):
        await session.create("/e", ttl=1, ephemeral=True)
    for bad in (0, -1, True, "1"):
        with pytest.raises(ConfigurationError, match="ttl must be"):
            await session.create("/e", ttl=bad)  # type: ignore[arg-type]


async def test_a_server_without_ttl_nodes_refuses_with_a_typed_error() -> None:
    with ZooKeeperEnsemble(1, extended_types=False) as server:
        async with Session(server.connect_string) as s:
            with pytest.raises(UnsupportedByServerError, match="extendedTypesEnabled"):
                await s.create("/t", b"", ttl=5)
            assert await s.create("/plain", b"") == "/plain"  # the session still serves
