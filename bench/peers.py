"""The runtime benchmark's peers: Dramatiq, Celery and RQ on a Redis server started here.

What a user would pick instead of this framework, measured on the same workload as ours
(``bench/runtime.py``): trivial tasks whose results are stored, the workers already running;
tasks/s for a batch of tasks (first submit -> last result read), and the latency of one task
on an idle system (submit -> its result can be read).  The peers' code is in
:mod:`bench.peer_tasks`; every process (redis-server, workers, the submitting driver) is
started with :func:`framework.testing.spawn` and killed with kill -9 at the end.

Redis is Debian's ``redis-server`` on a free loopback port, its output in
``<log_dir>/redis-server-<persistence>.log``, with one of :data:`PERSISTENCE`: ``none`` (no
RDB snapshots, no append-only file), ``everysec`` (an append-only file fsynced once a
second: a crash loses up to a second of acknowledged work) or ``always`` (fsynced before
each reply: durable like a ZooKeeper write).  The Python
packages are the ``bench`` extra (``pip install -e '.[bench]'``; ``make bench`` installs it
and redis-server).
"""

from __future__ import annotations

import importlib.util
import shutil
import statistics
import sys
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import attrs
import trio
from rich.console import Console
from rich.table import Table

from bench.common import Result
from bench.peer_tasks import PEERS
from framework.testing import Child, Lines, spawn
from framework.zkserver import free_ports

ROOT = Path(__file__).resolve().parent.parent
ENV = {"PYTHONPATH": str(ROOT)}
STARTUP_TIMEOUT = 120.0  # a hang guard: a worker that never says READY


@attrs.frozen
class Setup:
    """How a peer runs: ``processes`` worker processes with ``threads`` tasks at a time each."""

    label: str
    processes: int
    threads: int


SETUPS = {
    "dramatiq": Setup("Dramatiq (Redis broker, Results middleware, 4 processes x 4 threads)",
                      4, 4),
    "celery": Setup("Celery (Redis, acks_late, prefetch 1, 4 processes x 4 threads: "
                    "--pool threads)", 4, 4),
    "rq": Setup("RQ (4 SimpleWorkers)", 4, 1),
}
assert set(SETUPS) == set(PEERS)


@attrs.frozen
class PeerRun:
    """One run of a peer: tasks/s over the batch, and the median idle latency in seconds."""

    rate: float
    latency: float


def missing() -> str | None:
    """Why the peers cannot run on this machine (a missing package or redis-server), or
    ``None``."""
    absent = [name for name in ("dramatiq", "celery", "rq", "redis")
              if importlib.util.find_spec(name) is None]
    if absent:
        return (f"the bench extra is not installed ({', '.join(absent)} missing): "
                "pip install -e '.[bench]' (make bench does)")
    if shutil.which("redis-server") is None:
        return "redis-server is not installed: apt-get install redis-server (make bench does)"
    return None


def _lines(child: Child) -> Lines:
    assert child.lines is not None, f"{child.name}: its stdout is not read"
    return child.lines


#: Redis persistence settings the peers run with: ``none``, ``everysec``, ``always`` (the
#: value of ``appendfsync``; ``none`` turns the append-only file off).
PERSISTENCE = ("none", "everysec", "always")


@asynccontextmanager
async def redis_server(log_dir: Path, persistence: str = "none") -> AsyncIterator[str]:
    """A fresh redis-server on a free 127.0.0.1 port for the block, with ``persistence``
    (one of :data:`PERSISTENCE`; its append-only file in a fresh directory under
    ``log_dir``); its URL.  Killed (kill -9) when the block ends."""
    if persistence not in PERSISTENCE:
        raise ValueError(f"persistence must be one of {', '.join(PERSISTENCE)}, "
                         f"not {persistence!r}")
    port = free_ports(1)[0]
    argv = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
            "--daemonize", "no"]
    if persistence == "none":
        argv += ["--appendonly", "no"]
    else:
        data = log_dir / f"redis-{persistence}-{port}"
        data.mkdir(parents=True, exist_ok=True)
        argv += ["--appendonly", "yes", "--appendfsync", persistence, "--dir", str(data)]
    async with spawn(argv, name=f"redis-server-{persistence}", log_dir=log_dir,
                     pipe_stdout=True) as server:
        with trio.fail_after(STARTUP_TIMEOUT):
            await _lines(server).until(lambda line: "Ready to accept connections" in line)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_lines(server).rest)  # its log, read so that it never blocks
            yield f"redis://127.0.0.1:{port}/0"
            nursery.cancel_scope.cancel()


async def _python(stack: AsyncExitStack, name: str, log_dir: Path, *args: str) -> Child:
    return await stack.enter_async_context(spawn(
        [sys.executable, "-m", "bench.peer_tasks", *args], name=name, log_dir=log_dir,
        pipe_stdout=True, env=ENV))


async def run_peer(peer: str, url: str, tasks: int, rounds: int, log_dir: Path) -> PeerRun:
    """Start the peer's workers on ``url``, wait until each consumes, then drive ``tasks``
    tasks and ``rounds`` idle-latency rounds through it (see :mod:`bench.peer_tasks`)."""
    setup = SETUPS[peer]
    async with AsyncExitStack() as stack:
        workers = [await _python(stack, f"{peer}-w{i}", log_dir, peer, "serve", url,
                                 str(setup.threads)) for i in range(setup.processes)]
        with trio.fail_after(STARTUP_TIMEOUT):
            for worker in workers:
                await _lines(worker).until(lambda line: line == "READY")
        driver = await _python(stack, f"{peer}-driver", log_dir, peer, "drive", url,
                               str(tasks), str(rounds))
        out = await _lines(driver).rest()
        if await driver.wait():
            raise RuntimeError(f"the {peer} driver failed: {driver.log()[-2000:]}")
    elapsed = [float(line.split()[1]) for line in out if line.startswith("ELAPSED")]
    latencies = [float(line.split()[1]) for line in out if line.startswith("LATENCY")]
    return PeerRun(tasks / elapsed[0], statistics.median(latencies))


@attrs.frozen
class PeerRow:
    """One row against a peer: ``peer`` (``dramatiq``, ``celery``, ``rq``, ``ceiling``,
    ``cpu``), the Redis ``persistence`` it ran with (``None``: not a Redis peer) and the
    row (the peer's value in ``Result.kazoo``)."""

    peer: str
    persistence: str | None
    result: Result


def print_peer_results(title: str, rows: list[PeerRow]) -> None:
    """A table of rows: the peer's value (``Result.kazoo``, the comparison column) next to
    ours and ours/peer."""
    table = Table(title=title)
    for column in ("workload", "unit", "peer", "redis", "value", "ours", "ours/peer", "note"):
        table.add_column(column, justify="left" if column in ("workload", "note") else "right")
    for row in rows:
        peer, r = row.peer, row.result
        ratio = r.ratio
        verdict = "" if ratio is None else (
            " (better)" if (ratio >= 1) == r.higher_is_better else " (worse)")
        table.add_row(r.workload, r.unit, peer, row.persistence or "-",
                      *("-" if v is None else f"{v:,.1f}" for v in (r.kazoo, r.ours)),
                      "-" if ratio is None else f"{ratio:.2f}x{verdict}", r.note)
    Console(width=160).print(table)
