"""The dashboard's cost on ZooKeeper does not depend on how many people watch it.

Every request of the dashboard's session is counted (``Session._call`` is where each one
goes); once the feed has read the app, opening more viewers (server-sent event streams, each
receiving several pushes) and scraping ``/metrics`` must add no request at all.
"""

from __future__ import annotations

import json
from typing import Any

import trio

from framework import Session
from framework.dashboard import listen, run_dashboard
from framework.primitives import ConfigStore
from framework.runtime import App

APP = App("quiet")


class CountingSession(Session):
    requests = 0

    async def _call(self, request: Any) -> Any:
        self.requests += 1
        return await super()._call(request)


async def _viewer(url: str, pushes: int, until: Any = None) -> dict[str, Any]:
    """Open ``/events`` and read ``pushes`` states (or until ``until(state)``)."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    stream = await trio.open_tcp_stream(host, int(port))
    async with stream:
        await stream.send_all(b"GET /events HTTP/1.1\r\nHost: t\r\n\r\n")
        buffer, seen, state = b"", 0, {}
        while seen < pushes or (until is not None and not until(state)):
            chunk = await stream.receive_some(65536)
            assert chunk, "the event stream ended"
            buffer += chunk
            while b"\n\n" in buffer:
                event, buffer = buffer.split(b"\n\n", 1)
                for line in event.split(b"\n"):
                    # chunked transfer encoding: the event's line is inside a chunk
                    if line.startswith(b"data: "):
                        state = json.loads(line[6:])
                        seen += 1
        return state


async def _scrape(url: str) -> bytes:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    stream = await trio.open_tcp_stream(host, int(port))
    async with stream:
        await stream.send_all(b"GET /metrics HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        body = b""
        while chunk := await stream.receive_some(65536):
            body += chunk
        return body


def _has_worker(state: dict[str, Any]) -> bool:
    return any(app["name"] == APP.name and app["workers"] and app["config"] is not None
               for app in state.get("apps", []))


async def test_viewers_cost_zookeeper_nothing(zk_hosts: str, chroot: str) -> None:
    with trio.fail_after(40):
        async with Session(zk_hosts, chroot=chroot) as writer:
            await writer.create(f"{APP.workers}/w1", b'{"state": "running", "done": 3}',
                                makepath=True, ephemeral=True)
            await ConfigStore(writer, APP.config).write({"greeting": "hi"})
            async with CountingSession(zk_hosts, chroot=chroot) as session:
                async with trio.open_nursery() as nursery:
                    url = await nursery.start(lambda task_status: run_dashboard(
                        session, listen(port=0), task_status=task_status))
                    await _viewer(url, 1, _has_worker)  # the feed has read everything
                    before = session.requests
                    states: list[dict[str, Any]] = []

                    async def view() -> None:
                        states.append(await _viewer(url, 3))

                    async with trio.open_nursery() as viewers:
                        for _ in range(8):
                            viewers.start_soon(view)
                        viewers.start_soon(_scrape, url)
                    after = session.requests
                    nursery.cancel_scope.cancel()
    assert len(states) == 8 and all(_has_worker(s) for s in states)
    assert before > 0  # the feed's own reads are counted
    assert after == before, f"{after - before} ZooKeeper requests for 8 viewers"
