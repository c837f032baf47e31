"""All recipe benchmarks in one run: ours vs kazoo's recipes on the same server.

Run: ``.venv/bin/python bench/primitives.py`` (starts its own ZooKeeper unless
FRAMEWORK_ZK_HOSTS is set; ``--quick``: every part at a toy size, a smoke run).  Parts:
election and membership (``primitives_election``), queue,
locks and double barrier (``primitives_queue_lock``), semaphore and counter
(``primitives_semaphore_counter``, also against the bare protocol), tree caches
(``primitives_cache``: ours vs kazoo's ``TreeCache``, and the bare reads).
"""

from __future__ import annotations

import sys
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import (
    primitives_cache,
    primitives_election,
    primitives_queue_lock,
    primitives_semaphore_counter,
)
from bench.common import print_results, quick, zookeeper
from framework import configure_logging


def main() -> None:
    configure_logging(level="error")
    if quick():  # a smoke run: the other parts shrank at import (bench.common.sized)
        primitives_semaphore_counter.WINDOW = 0.3
    with zookeeper() as hosts:
        election = trio.run(primitives_election.run, hosts)
        print_results("election and membership: ours vs kazoo recipes "
                      f"(session timeout {primitives_election.SESSION_TIMEOUT:g} s)", election)
        queue_lock = trio.run(primitives_queue_lock.run, hosts)
        print_results("queue, locks, double barrier: ours vs kazoo recipes", queue_lock)
        semaphore_counter = trio.run(primitives_semaphore_counter.run, hosts)
        print_results("semaphore and counter: ours vs kazoo recipes and the bare protocol",
                      semaphore_counter)
        caches = trio.run(primitives_cache.run, hosts)
        print_results("tree cache: ours vs kazoo's TreeCache and the bare protocol", caches)


if __name__ == "__main__":
    main()
