"""PersistentNode: a node kept in place through deletions and session loss."""

from __future__ import annotations

import pytest
import trio

from framework import Session
from framework.errors import ConfigurationError
from framework.primitives import PersistentNode
from framework.testing import expire_session
from framework.zk import wait_created, wait_gone


async def _recreated(node: PersistentNode, times: int) -> None:
    while node.recreated < times or not node.present:
        await node._changed.wait()


async def test_kept_through_deletion_and_removed_at_the_end(session: Session) -> None:
    with trio.fail_after(20):
        async with PersistentNode(session, "/svc/me", b"v1").run() as node:
            await node.wait_present()
            stat = await session.exists("/svc/me")
            assert stat is not None and stat.ephemeralOwner == session.session_id
            await session.delete("/svc/me")
            await _recreated(node, 1)
            assert (await session.get("/svc/me"))[0] == b"v1"
            await node.set_data(b"v2")
            assert (await session.get("/svc/me"))[0] == b"v2"
            await session.delete("/svc/me")
            await _recreated(node, 2)
            assert (await session.get("/svc/me"))[0] == b"v2"
        assert await session.exists("/svc/me") is None


async def test_created_again_in_a_new_session(zk_hosts: str, chroot: str) -> None:
    async with Session(zk_hosts, chroot=chroot, session_timeout=4) as s, \
            Session(zk_hosts, chroot=chroot, session_timeout=4) as observer:
        with trio.fail_after(30):
            async with PersistentNode(s, "/me", b"x").run() as node:
                await node.wait_present()
                first = s.session_id
                await expire_session(s)
                await _recreated(node, 1)
                assert s.session_id != first
                stat = await observer.exists("/me")
                assert stat is not None and stat.ephemeralOwner == s.session_id


async def test_waits_for_another_sessions_node(zk_hosts: str, chroot: str,
                                               session: Session) -> None:
    """A path held by another live session is never taken over: wait until it goes."""
    async with Session(zk_hosts, chroot=chroot, session_timeout=4) as other:
        await other.create("/me", b"theirs", ephemeral=True)
        with trio.fail_after(20):
            async with PersistentNode(session, "/me", b"ours").run() as node:
                await session.sync("/")
                await trio.sleep(0.1)  # a window for a wrong takeover, not a wait for one
                assert not node.present
                await other.delete("/me")
                await node.wait_present()
                assert (await session.get("/me"))[0] == b"ours"


async def test_persistent_and_ttl_modes(session: Session) -> None:
    with trio.fail_after(20):
        await session.create("/p", b"left over")
        async with PersistentNode(session, "/p", b"mine", ephemeral=False).run() as node:
            await node.wait_present()
            data, stat = await session.get("/p")
            assert data == b"mine" and stat.ephemeralOwner == 0
        assert await session.exists("/p") is None
        async with PersistentNode(session, "/t", b"", ephemeral=False, ttl=0.3).run() as node:
            await node.wait_present()
            await wait_gone(session, "/t")  # reaped by the server once idle...
            await wait_created(session, "/t")  # ...and put back while the scope runs
    with pytest.raises(ConfigurationError, match="cannot be ephemeral"):
        PersistentNode(session, "/x", ttl=5)


async def test_an_error_no_retry_can_help_ends_the_scope_as_itself(session: Session) -> None:
    """A missing parent with makepath=False: the scope ends with NoNodeError (not a group)."""
    from framework.errors import NoNodeError

    with trio.fail_after(10), pytest.raises(NoNodeError):
        async with PersistentNode(session, "/missing/me", makepath=False).run() as node:
            await node.wait_present()
