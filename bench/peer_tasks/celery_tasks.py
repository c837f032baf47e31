"""Celery: Redis as broker and result backend, ``task_acks_late`` (acknowledged after the task
ran) and ``worker_prefetch_multiplier=1``; a worker process is ``celery worker --pool threads
--concurrency N`` (one process: kill -9 ends all of it)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from celery import Celery, group
from celery.signals import worker_ready

WAIT_S = 60.0


def app_for(url: str) -> tuple[Celery, Any]:
    """(the app, its trivial task) on ``url``."""
    app = Celery("bench_peer", broker=url, backend=url)
    app.conf.update(task_acks_late=True, worker_prefetch_multiplier=1,
                    broker_connection_retry_on_startup=True, task_default_queue="bench",
                    worker_redirect_stdouts=False)  # READY goes to stdout

    @app.task(name="trivial")
    def trivial(n: int) -> int:
        return n

    return app, trivial


def serve(url: str, threads: int) -> None:
    app, _ = app_for(url)
    worker_ready.connect(lambda **_: print("READY", flush=True), weak=False)
    app.worker_main(["worker", "--pool=threads", f"--concurrency={threads}",
                     "--loglevel=WARNING"])


class Client:
    def __init__(self, url: str) -> None:
        self.app, self.task = app_for(url)

    def send(self, n: int) -> Any:
        return self.task.delay(n)

    def send_many(self, ns: Iterable[int]) -> list[Any]:
        return list(group(self.task.s(n) for n in ns).apply_async().results)

    def result(self, handle: Any) -> Any:
        return handle.get(timeout=WAIT_S)
