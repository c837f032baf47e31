"""``BlockingClient``: the Client's operations from plain threads (no trio in the caller),
the same errors, several threads at once, close: against a real ZooKeeper."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import trio

import framework
from framework import ConfigurationError, FrameworkError, PermanentFailure, Session
from framework.runtime import (
    BlockingClient,
    ClientClosedError,
    Outcome,
    Revocation,
    Task,
    TaskExists,
    Worker,
)
from framework.runtime.operations.actions import UnknownApp

APP = "blocking"


class Echo(Worker):
    app_name = APP
    max_attempts = 1
    concurrency = 4

    async def handle(self, task: Task) -> Any:
        if task.payload == "fail":
            raise PermanentFailure("told to fail")
        return task.payload


@contextmanager
def running(hosts: str, chroot: str, worker: Worker) -> Iterator[None]:
    """``worker`` in a trio loop of its own thread, for the block; drained at its end."""
    ready = threading.Event()
    token: list[trio.lowlevel.TrioToken] = []

    async def main() -> None:
        async with Session(hosts, chroot=chroot, session_timeout=4.0) as session:
            token.append(trio.lowlevel.current_trio_token())
            ready.set()
            await worker.run(session)

    thread = threading.Thread(target=trio.run, args=(main,))
    thread.start()
    ready.wait()
    try:
        yield
    finally:
        trio.from_thread.run_sync(worker.request_stop, trio_token=token[0])
        thread.join()


def test_the_client_operations_from_plain_threads(zk_hosts: str, chroot: str) -> None:
    assert framework.BlockingClient is BlockingClient
    with BlockingClient(zk_hosts, APP, chroot=chroot, create=True) as client:
        assert client.result("b1") is None
        with pytest.raises(trio.TooSlowError,
                           match=r"^no result for task 'b1' of 'blocking' within 0.2s$"):
            client.result("b1", wait=True, timeout=0.2)
        assert client.submit("handle", {"n": 1}, key="b1").id == "b1"
        with pytest.raises(TaskExists, match="is queued"):
            client.submit("handle", {"n": 1}, key="b1")
        with pytest.raises(ConfigurationError):
            client.submit("handle", {"x": object()})
        with pytest.raises(ConfigurationError):
            client.result("bad/key")
        client.submit("handle", "never", key="r1")
        assert client.revoke("r1") is Revocation.REVOKED
        assert client.revoke("r1") is Revocation.ALREADY
        with running(zk_hosts, chroot, Echo(APP, name="w1")):
            revoked = client.result("r1", wait=True, timeout=30)
            assert revoked is not None and revoked.outcome is Outcome.REVOKED
            record = client.result("b1", wait=True, timeout=30)
            assert record is not None and record.ok and record.result == {"n": 1}
            assert client.processes() == (0, 1)

            # several plain threads at once, each submitting and waiting on the one client
            results: dict[int, Any] = {}
            failures: list[BaseException] = []

            def one(n: int) -> None:
                try:
                    client.submit("handle", n, key=f"t{n}")
                    results[n] = client.result(f"t{n}", wait=True, timeout=30)
                except BaseException as exc:  # reported by the test, not lost in a thread
                    failures.append(exc)

            threads = [threading.Thread(target=one, args=(n,)) for n in range(8)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            assert failures == []
            assert {n: r.result for n, r in results.items()} == {n: n for n in range(8)}

            for key in ("f1", "f2"):
                client.submit("handle", "fail", key=key)
                failed = client.result(key, wait=True, timeout=30)
                assert failed is not None and not failed.ok and failed.error == "told to fail"
        # the worker has drained: both are dead letters now
        first, second = client.dead_letters()
        assert (first.key, second.key) == ("f1", "f2") and first.error == "told to fail"
        client.requeue(first.name)
        client.discard(second.name)
        assert client.dead_letters() == []
        with pytest.raises(TaskExists, match="'f1' of 'blocking' is queued"):
            client.submit("handle", "again", key="f1")  # requeued: it is queued again
        assert client.cancel(by="test") is True and client.cancel() is False
        with pytest.raises(ConfigurationError, match="is cancelled"):
            client.submit("handle", 1)
        assert client.resume() is not None and client.resume() is None
        assert client.purge() is True
    with pytest.raises(ClientClosedError, match="is closed"):
        client.submit("handle", 1)
    client.close()  # idempotent


def test_close_ends_calls_in_flight_and_refuses_later_ones(zk_hosts: str, chroot: str) -> None:
    client = BlockingClient(zk_hosts, APP, chroot=chroot)
    outcome: list[BaseException] = []
    waiting = threading.Event()

    def wait_forever() -> None:
        waiting.set()
        try:
            client.result("never", wait=True)
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=wait_forever)
    thread.start()
    waiting.wait()
    client.close()
    thread.join()
    (error,) = outcome
    assert isinstance(error, ClientClosedError) and "closed" in str(error)
    assert client.closed
    with pytest.raises(ClientClosedError):
        client.result("x")


def test_create_false_and_unknown_apps(zk_hosts: str, chroot: str) -> None:
    with BlockingClient(zk_hosts, "thumbnails", chroot=chroot, create=True) as client:
        client.submit("handle", 1)  # creates the app
    for options in ({}, {"create": False}):  # create=False is the default, as in the CLI
        with BlockingClient(zk_hosts, "thumbnial", chroot=chroot, **options) as client:
            with pytest.raises(UnknownApp, match=r"no application 'thumbnial' in this "
                                                 r"ZooKeeper \(known: thumbnails\)"):
                client.submit("handle", 1)
            with pytest.raises(UnknownApp):
                client.cancel()


def test_a_call_timeout_and_connection_errors(zk_hosts: str, chroot: str) -> None:
    with BlockingClient(zk_hosts, APP, chroot=chroot, timeout=0.3) as client:
        with pytest.raises(trio.TooSlowError, match=r"^result on 'blocking' took over the "
                                                    r"client's timeout of 0\.3s$"):
            client.result("nothing", wait=True)  # no timeout of its own: the client's
    with pytest.raises(ConfigurationError):
        BlockingClient("127.0.0.1:99999", APP)
    from framework.zkserver import free_ports

    (port,) = free_ports(1)
    with pytest.raises(FrameworkError):
        BlockingClient(f"127.0.0.1:{port}", APP, connect_timeout=0.5)

