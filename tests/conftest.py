"""Fixtures: one real ZooKeeper per test session, a fresh chroot and Session per test."""

from __future__ import annotations

import os
import re
import signal
import uuid
from collections.abc import AsyncIterator, Iterator

os.environ.setdefault("FRAMEWORK_LOG_LEVEL", "warning")  # before framework configures logging

import pytest
import structlog

from framework import Session, ZooKeeperEnsemble
from framework.logs import configure_logging
from framework.testing import TcpProxy

SESSION_TIMEOUT = 4.0

# A run started in the background by a non-interactive shell (`make test &`, nohup, some CI
# runners) inherits SIGINT ignored, and a Python child whose SIGINT is ignored never turns
# it into KeyboardInterrupt: the tests that press Ctrl-C on a child (`framework status
# --watch`, `framework run`) would hang.  A handled signal is reset to the default on
# exec, so handling it here gives every child the default disposition.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session")
def zk_hosts() -> Iterator[str]:
    """A standalone server started for this test run (each pytest-xdist worker of
    ``make test TEST_WORKERS=3`` starts its own), or ``FRAMEWORK_ZK_HOSTS`` (shared by the
    workers: each test has its own chroot)."""
    hosts = os.environ.get("FRAMEWORK_ZK_HOSTS")
    if hosts:
        yield hosts
        return
    with ZooKeeperEnsemble(1) as server:
        yield server.connect_string


@pytest.fixture
def captured_logs() -> Iterator[list[dict[str, object]]]:
    """Every structlog event of the test, at every level, as dicts (``event`` and keys)."""
    configure_logging(level="debug")
    try:
        with structlog.testing.capture_logs() as logs:
            yield logs
    finally:
        configure_logging(level=os.environ["FRAMEWORK_LOG_LEVEL"])


@pytest.fixture
def ensemble() -> Iterator[ZooKeeperEnsemble]:
    """A fresh 3-node ensemble on loopback, for tests that kill servers."""
    with ZooKeeperEnsemble(3) as members:
        yield members


@pytest.fixture
def chroot(request: pytest.FixtureRequest) -> str:
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", request.node.name)[:60]
    return f"/tests/{name}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
async def session(zk_hosts: str, chroot: str) -> AsyncIterator[Session]:
    async with Session(zk_hosts, chroot=chroot, session_timeout=SESSION_TIMEOUT) as s:
        yield s


@pytest.fixture
def proxy(zk_hosts: str) -> Iterator[TcpProxy]:
    with TcpProxy(zk_hosts) as p:
        yield p
