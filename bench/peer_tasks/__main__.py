"""``python -m bench.peer_tasks PEER serve URL THREADS``: one worker process of PEER.

``python -m bench.peer_tasks PEER drive URL TASKS ROUNDS``: with the workers running, one
warm-up task, then TASKS tasks submitted (in batches of 500) and every result read, printing
``ELAPSED <seconds>`` (first submit -> last result read); then ROUNDS times one task
submitted and its result read on an otherwise idle system, printing ``LATENCY <seconds>``
for each."""

from __future__ import annotations

import importlib
import sys
import time

BATCH = 500


def drive(client, tasks: int, rounds: int) -> None:  # type: ignore[no-untyped-def]
    assert client.result(client.send(-1)) == -1  # connections made, scripts loaded
    start = time.perf_counter()
    handles = []
    for offset in range(0, tasks, BATCH):
        handles += client.send_many(range(offset, min(offset + BATCH, tasks)))
    for n, handle in enumerate(handles):
        got = client.result(handle)
        assert got == n, f"task {n}: result {got!r}"
    print(f"ELAPSED {time.perf_counter() - start:.6f}", flush=True)
    for n in range(rounds):
        start = time.perf_counter()
        got = client.result(client.send(n))
        elapsed = time.perf_counter() - start
        assert got == n, f"task {n}: result {got!r}"
        print(f"LATENCY {elapsed:.6f}", flush=True)


def main(argv: list[str]) -> None:
    peer, command, url, *rest = argv
    module = importlib.import_module(f"bench.peer_tasks.{peer}_tasks")
    if command == "serve":
        module.serve(url, int(rest[0]))
    elif command == "drive":
        drive(module.Client(url), int(rest[0]), int(rest[1]))
    else:
        raise SystemExit(f"unknown command {command!r}: serve or drive")


if __name__ == "__main__":
    main(sys.argv[1:])
