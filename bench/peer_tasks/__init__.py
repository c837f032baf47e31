"""The peers of the runtime benchmark (Dramatiq, Celery, RQ on Redis): one module each with
the same trivial task, and one entry point for their worker and driver processes.

Each peer module defines:

- ``serve(url, threads)``: run one worker process on the Redis server at ``url`` with
  ``threads`` tasks at a time; print ``READY`` once it consumes, then run until killed;
- ``Client(url)``: the submitting side, with ``send(n)`` (one task, a handle),
  ``send_many(ns)`` (the peer's own bulk submission where it has one) and ``result(handle)``
  (block until the task's stored result can be read; the task's number).

``python -m bench.peer_tasks PEER serve URL THREADS`` and
``python -m bench.peer_tasks PEER drive URL TASKS ROUNDS`` run them (see ``__main__``).
"""

PEERS = ("dramatiq", "celery", "rq")
