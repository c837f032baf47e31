"""Dramatiq: Redis broker, the Results middleware on a Redis backend; a worker process is
dramatiq's ``Worker`` with ``threads`` worker threads (what ``dramatiq --processes 1
--threads N`` runs, without the CLI's forking parent, so that kill -9 ends all of it)."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

import dramatiq
from dramatiq.brokers.redis import RedisBroker
from dramatiq.results import Results
from dramatiq.results.backends.redis import RedisBackend

QUEUE = "bench"
WAIT_MS = 60_000


def trivial(n: int) -> int:
    return n


def actor(url: str) -> Any:
    """The task on a broker for ``url`` (results stored), the process's default broker."""
    broker = RedisBroker(url=url)
    broker.add_middleware(Results(backend=RedisBackend(url=url)))
    dramatiq.set_broker(broker)
    return dramatiq.actor(trivial, broker=broker, queue_name=QUEUE, store_results=True)


def serve(url: str, threads: int) -> None:
    task = actor(url)
    worker = dramatiq.Worker(task.broker, worker_threads=threads)
    worker.start()
    print("READY", flush=True)
    threading.Event().wait()


class Client:
    def __init__(self, url: str) -> None:
        self.actor = actor(url)

    def send(self, n: int) -> Any:
        return self.actor.send(n)

    def send_many(self, ns: Iterable[int]) -> list[Any]:
        return [self.actor.send(n) for n in ns]  # dramatiq enqueues one message at a time

    def result(self, message: Any) -> Any:
        return message.get_result(block=True, timeout=WAIT_MS)
