"""ServiceDiscovery: register with address and payload, query, watch; instances vanish with
their session (a killed process) and come back after a session loss."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from framework import Session
from framework.errors import ConfigurationError
from framework.primitives import ServiceDiscovery, ServiceInstance
from framework.testing import expire_session, python_argv, spawn
from framework.zk import wait_created

HELPER = Path(__file__).parent / "helpers" / "recipe_holder.py"


async def test_register_query_and_unregister(session: Session) -> None:
    discovery = ServiceDiscovery(session)
    web = ServiceInstance("web", "10.0.0.5", 8080, payload={"zone": "a", "weight": 2})
    async with discovery.register(web) as registration:
        assert registration.present
        assert await discovery.names() == ["web"]
        [found] = await discovery.instances("web")
        assert found == web
        assert found.endpoint == "10.0.0.5:8080" and found.payload["zone"] == "a"
        assert await discovery.instance("web", web.id) == web
        await session.create("/services/web/junk", b"not json")  # skipped, not fatal
        assert await discovery.instances("web") == [web]
        await session.delete("/services/web/junk")
    assert await discovery.instances("web") == []
    assert await discovery.instance("web", web.id) is None
    assert await discovery.instances("nothing") == []


def test_invalid_instances_are_clear_errors() -> None:
    for kwargs in ({"name": "a/b", "address": "h"}, {"name": "s", "address": ""},
                   {"name": "s", "address": "h", "port": 0},
                   {"name": "s", "address": "h", "id": ".."}):
        with pytest.raises(ConfigurationError):
            ServiceInstance(**kwargs)
    with pytest.raises(ConfigurationError, match="not JSON"):
        ServiceInstance("s", "h", payload=object()).encode()


async def test_watch_follows_registrations_and_a_killed_server(
    zk_hosts: str, chroot: str, session: Session
) -> None:
    discovery = ServiceDiscovery(session)
    seen: list[set[str]] = []
    argv = python_argv(HELPER, zk_hosts, chroot, "register", "search", "--timeout", 1.0)
    with trio.fail_after(40):
        async with spawn(argv, pipe_stdout=True) as server:
            assert server.lines is not None
            await server.lines.until(lambda line: line == "READY")
            local = ServiceInstance("search", "127.0.0.1", 1)
            watch = discovery.watch("search")
            instances = await watch.__anext__()
            [remote] = instances
            assert remote.port == server.pid
            async with discovery.register(local):
                while {i.id for i in instances} != {remote.id, local.id}:
                    instances = await watch.__anext__()
                seen.append({i.endpoint for i in instances})
                server.kill()  # its instance goes when the server expires its session
                while {i.id for i in instances} != {local.id}:
                    instances = await watch.__anext__()
            while instances:
                instances = await watch.__anext__()
            await watch.aclose()
    assert seen == [{"127.0.0.1:1", f"127.0.0.1:{server.pid}"}]


async def test_registered_again_after_a_session_loss(zk_hosts: str, chroot: str,
                                                     session: Session) -> None:
    async with Session(zk_hosts, chroot=chroot, session_timeout=4) as s:
        instance = ServiceInstance("broker", "127.0.0.1", 9092)
        with trio.fail_after(30):
            async with ServiceDiscovery(s).register(instance):
                await expire_session(s)
                await s.wait_connected()
                await wait_created(session, f"/services/broker/{instance.id}")
                assert await ServiceDiscovery(session).instances("broker") == [instance]


def test_endpoint_brackets_an_ipv6_literal() -> None:
    assert ServiceInstance("s", "::1", 9092).endpoint == "[::1]:9092"
    assert ServiceInstance("s", "10.0.0.1", 9092).endpoint == "10.0.0.1:9092"
    assert ServiceInstance("s", "db.example").endpoint == "db.example"


async def test_instance_by_id_with_a_watch(session: Session) -> None:
    """An id found elsewhere (an owner record) is looked up with a watch: it fires when the
    instance is registered and again when it goes."""
    discovery = ServiceDiscovery(session)
    server = ServiceInstance("broker", "10.0.0.7", 9092, id="s1")
    registered = trio.Event()
    assert await discovery.instance("broker", "s1", watch=session.waker(registered)) is None
    with trio.fail_after(20):
        async with discovery.register(server):
            await registered.wait()
            gone = trio.Event()
            assert await discovery.instance("broker", "s1", watch=session.waker(gone)) == server
            assert not gone.is_set()
        await gone.wait()
    assert await discovery.instance("broker", "s1", watch=session.waker(trio.Event())) is None


async def test_watch_reads_an_instance_registered_again_under_its_id(session: Session) -> None:
    """A server restarted with its name on another port: its node is deleted and created
    again under the same id (here in one multi, so no listing ever misses the id); the
    watch yields the new endpoint, not the one it read first."""
    discovery = ServiceDiscovery(session)
    first = ServiceInstance("katta", "10.0.0.1", 7001, id="n1")
    again = ServiceInstance("katta", "10.0.0.1", 7002, id="n1")
    with trio.fail_after(20):
        async with discovery.register(first) as registration:
            watch = discovery.watch("katta")
            assert await watch.__anext__() == (first,)
            txn = session.transaction()
            txn.delete(registration.path)
            txn.create(registration.path, again.encode(), ephemeral=True)
            await txn.commit()
            assert await watch.__anext__() == (again,)
            await watch.aclose()
