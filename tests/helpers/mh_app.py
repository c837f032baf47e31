"""The runtime application of ``tests/test_multihost.py``: a master that only leads (the
tasks come from a client on another host) and a worker whose results say who ran them."""

from __future__ import annotations

import trio

from framework.runtime import Master, MasterContext, Task, Worker, task

APP = "mh"


class MhMaster(Master):
    app_name = APP

    async def lead(self, ctx: MasterContext) -> None:
        await trio.sleep_forever()


class MhWorker(Worker):
    app_name = APP
    concurrency = 2

    @task()
    async def echo(self, task: Task) -> dict:
        await trio.sleep(0.05)  # long enough for both workers to take some
        return {"n": task.payload["n"], "by": self.name}
