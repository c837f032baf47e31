"""RQ: a worker process is one ``SimpleWorker`` (each job in the worker's own process, no fork;
one job at a time, so ``threads`` must be 1); results are kept (RQ's default result TTL)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from redis import Redis
from rq import Queue, SimpleWorker

QUEUE = "bench"
WAIT_S = 60


def trivial(n: int) -> int:
    return n


def serve(url: str, threads: int) -> None:
    if threads != 1:
        raise SystemExit("an RQ SimpleWorker runs one job at a time: threads must be 1")
    connection = Redis.from_url(url)
    worker = SimpleWorker([Queue(QUEUE, connection=connection)], connection=connection)
    print("READY", flush=True)
    worker.work(logging_level="WARNING")


class Client:
    def __init__(self, url: str) -> None:
        self.queue = Queue(QUEUE, connection=Redis.from_url(url))

    def send(self, n: int) -> Any:
        return self.queue.enqueue(trivial, n)

    def send_many(self, ns: Iterable[int]) -> list[Any]:
        return self.queue.enqueue_many([Queue.prepare_data(trivial, (n,)) for n in ns])

    def result(self, job: Any) -> Any:
        result = job.latest_result(timeout=WAIT_S)
        assert result is not None and result.type == result.Type.SUCCESSFUL, result
        return result.return_value
