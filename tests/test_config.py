"""Ready-znode configuration against a real ZooKeeper, including a hypothesis property test."""

from __future__ import annotations

import uuid
from contextlib import aclosing
from typing import Any

import attrs
import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from framework import ConfigurationError, LeadershipLost, Session
from framework.primitives.config import ConfigStore, Versioned
from framework.primitives.election import Election
from framework.testing import expire_session

PATH = "/config"


@attrs.frozen
class JobConfig:
    workers: int
    image: str
    env: dict[str, str] = attrs.Factory(dict)
    tags: tuple[str, ...] = ()


async def test_typed_round_trip_versions_and_watch(session: Session) -> None:
    store: ConfigStore[JobConfig] = ConfigStore(session, PATH, JobConfig)
    first = JobConfig(3, "img:1", {"A": "1"}, ("x",))
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            result: list[JobConfig] = []

            async def early_reader() -> None:
                result.append(await store.read())  # waits for the first complete config

            nursery.start_soon(early_reader)
            assert await store.write(first) == 1
        assert result == [first]
        assert sorted(await session.children(f"{PATH}/fields")) == [
            "env", "image", "tags", "workers"]
        assert (await session.get(f"{PATH}/fields/env"))[0] == b'{"A":"1"}'
        async with aclosing(store.watch_versioned()) as versions:
            now = await anext(versions)
            assert (now.version, now.config) == (1, first)
            second = attrs.evolve(first, workers=5)
            assert await store.write(second) == 2
            later = await anext(versions)
            assert (later.version, later.config) == (2, second)
    assert (await session.get(f"{PATH}/ready"))[0] == b"2"


async def test_dict_config_drops_removed_keys(session: Session) -> None:
    store: ConfigStore[dict[str, Any]] = ConfigStore(session, PATH)
    await store.write({"a": 1, "b": [1, 2], "c": {"d": None}})
    await store.write({"a": 2})
    assert await store.read() == {"a": 2}
    assert await session.children(f"{PATH}/fields") == ["a"]


async def test_reader_waits_out_a_writer_that_crashed_half_way(session: Session) -> None:
    """What a writer that died after deleting ready and writing one field leaves behind is
    never served: readers wait for the next complete version."""
    store: ConfigStore[dict[str, Any]] = ConfigStore(session, PATH)
    await store.write({"a": 1, "b": 1})
    await session.delete(f"{PATH}/ready")
    await session.set(f"{PATH}/fields/a", b"99")
    seen: list[Versioned[dict[str, Any]]] = []
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            started = trio.Event()

            async def reader() -> None:
                started.set()
                seen.append(await store.read_versioned())

            nursery.start_soon(reader)
            await started.wait()
            await store.write({"a": 2, "b": 2})
    assert [(v.version, v.config) for v in seen] == [(2, {"a": 2, "b": 2})]


async def test_fenced_write_by_a_deposed_leader_fails(
    zk_hosts: str, chroot: str, session: Session
) -> None:
    reader: ConfigStore[dict[str, Any]] = ConfigStore(session, PATH)
    async with Session(zk_hosts, chroot=chroot, session_timeout=2) as s:
        store: ConfigStore[dict[str, Any]] = ConfigStore(s, PATH)
        with trio.fail_after(20):
            with pytest.raises(LeadershipLost):
                async with Election(s, "/election").leadership() as term:
                    assert await store.write({"leader": "me"}, fence=term) == 1
                    await expire_session(s)
                    await trio.sleep_forever()
            await s.wait_connected()
            with pytest.raises(LeadershipLost):
                await store.write({"leader": "stale"}, fence=term)
            assert await reader.read_versioned() == Versioned(
                1, {"leader": "me"}, (await session.exists(f"{PATH}/ready")).czxid)


async def test_bad_configurations_are_rejected_before_writing(session: Session) -> None:
    with pytest.raises(ConfigurationError):
        await ConfigStore(session, PATH).write({"a/b": 1})
    with pytest.raises(ConfigurationError):
        await ConfigStore(session, PATH).write({"a": object()})
    with pytest.raises(ConfigurationError):
        await ConfigStore(session, PATH, JobConfig).write({"workers": 1})  # type: ignore
    with pytest.raises(ConfigurationError):
        ConfigStore(session, PATH, dict)  # type: ignore[arg-type]
    assert await session.exists(PATH) is None


# ---------------------------------------------------------------------- property test

field_values = st.one_of(
    st.integers(-1000, 1000), st.text(max_size=12), st.lists(st.integers(0, 9), max_size=4)
)
configs = st.dictionaries(
    st.sampled_from(["alpha", "beta", "gamma", "delta", "eps", "zeta", "eta", "theta"]),
    field_values, min_size=1,
)


@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(bursts=st.lists(st.lists(configs, min_size=1, max_size=8), min_size=1, max_size=4))
async def test_readers_never_observe_a_half_written_configuration(
    zk_hosts: str, chroot: str, bursts: list[list[dict[str, Any]]]
) -> None:
    path = f"{chroot}-cfg/{uuid.uuid4().hex[:8]}"
    written: dict[int, dict[str, Any]] = {}
    async with (
        Session(zk_hosts, session_timeout=4) as w,
        Session(zk_hosts, session_timeout=4) as r1,
        Session(zk_hosts, session_timeout=4) as r2,
    ):
        writer: ConfigStore[dict[str, Any]] = ConfigStore(w, path)
        readers = [_Observer(ConfigStore(r, path)) for r in (r1, r2)]
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                for observer in readers:
                    nursery.start_soon(observer.run)
                for burst in bursts:
                    for config in burst:  # back to back: readers race the pipelined writes
                        written[await writer.write(config)] = config
                    for observer in readers:
                        await observer.wait_for(max(written))
                nursery.cancel_scope.cancel()
        await w.delete_tree(f"{chroot}-cfg")
    for observer in readers:
        versions = [item.version for item in observer.seen]
        assert versions == sorted(set(versions)), "versions must strictly increase"
        for item in observer.seen:
            assert item.config == written[item.version], "a config that was never written"
        last_of_each_burst = []
        version = 0
        for burst in bursts:
            version += len(burst)
            last_of_each_burst.append(version)
        assert set(last_of_each_burst) <= set(versions), "the latest of a burst was missed"


@attrs.define
class _Observer:
    store: ConfigStore[dict[str, Any]]
    seen: list[Versioned[dict[str, Any]]] = attrs.Factory(list)
    progress: trio.Event = attrs.Factory(trio.Event)

    async def run(self) -> None:
        async for item in self.store.watch_versioned():
            self.seen.append(item)
            self.progress.set()
            self.progress = trio.Event()

    async def wait_for(self, version: int) -> None:
        while not self.seen or self.seen[-1].version < version:
            await self.progress.wait()
