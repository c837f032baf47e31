"""The runtime benchmark's peers (bench/peers.py) in their quick mode: a redis-server started
for the test, then Dramatiq, Celery and RQ workers (each 4 processes) running a few tasks and
idle-latency rounds; each driver checks every stored result against its task.  Skipped
unless the ``bench`` extra and Debian's redis-server are installed (``make bench`` installs
both)."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from bench import peers

WHY_NOT = peers.missing()
pytestmark = pytest.mark.skipif(WHY_NOT is not None, reason=WHY_NOT or "")


async def test_peers_quick_mode(tmp_path: Path) -> None:
    with trio.fail_after(240):  # a hang guard only
        async with peers.redis_server(tmp_path) as url:
            for peer in peers.PEERS:
                run = await peers.run_peer(peer, url, tasks=40, rounds=3, log_dir=tmp_path)
                assert run.rate > 0, peer
                assert run.latency > 0, peer
