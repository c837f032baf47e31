"""Rendezvous against a real ZooKeeper: launcher prepares, master publishes, workers wait."""

from __future__ import annotations

from contextlib import aclosing

import pytest
import trio

from framework import ConfigurationError, NodeExistsError, Session
from framework.primitives.rendezvous import Rendezvous

PATH = "/app/master"


async def test_workers_wait_until_the_master_publishes(
    zk_hosts: str, chroot: str, session: Session
) -> None:
    launcher = Rendezvous(session, PATH)
    await launcher.prepare()
    assert await launcher.get() is None
    got: list[bytes] = []
    async with Session(zk_hosts, chroot=chroot, session_timeout=4) as master_session:
        master = Rendezvous(master_session, PATH)
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                waiting = trio.Event()

                async def worker() -> None:
                    async with aclosing(launcher.watch()) as changes:
                        assert await anext(changes) is None
                        waiting.set()
                    got.append(await launcher.wait())

                for _ in range(3):
                    nursery.start_soon(worker)
                await waiting.wait()
                await master.publish(b"10.0.0.7:4000")
        assert got == [b"10.0.0.7:4000"] * 3
        # a new run: prepare clears the old address
        await launcher.prepare()
        assert await launcher.get() is None
        await master.publish(b"10.0.0.8:4000")
        assert await launcher.get() == b"10.0.0.8:4000"


async def test_ephemeral_publication_goes_with_the_publisher(
    zk_hosts: str, chroot: str, session: Session
) -> None:
    launcher = Rendezvous(session, PATH)
    await launcher.prepare()
    with trio.fail_after(10):
        async with aclosing(launcher.watch()) as changes:
            assert await anext(changes) is None
            async with Session(zk_hosts, chroot=chroot, session_timeout=4) as master_session:
                master = Rendezvous(master_session, PATH)
                await master.publish(b"addr-1", ephemeral=True)
                assert await anext(changes) == b"addr-1"
                stat = await session.exists(PATH)
                assert stat.ephemeralOwner == master_session.session_id
                await master.publish(b"addr-2", ephemeral=True)  # ours: updated in place
                assert await anext(changes) == b"addr-2"
                async with Session(zk_hosts, chroot=chroot, session_timeout=4) as rival:
                    with pytest.raises(NodeExistsError):
                        await Rendezvous(rival, PATH).publish(b"addr-3", ephemeral=True)
            # the publisher's session closed: its address is gone, workers see "none"
            assert await anext(changes) is None


async def test_publish_rejects_empty_data(session: Session) -> None:
    with pytest.raises(ConfigurationError):
        await Rendezvous(session, PATH).publish(b"")
