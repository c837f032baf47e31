"""A pytest plugin for integration tests of an application against a real, embedded ZooKeeper.

Enable it in the project's top-level ``conftest.py``::

    pytest_plugins = ["framework.testing.pytest_plugin"]

Fixtures:

* ``embedded_zookeeper`` (once per test session): a standalone ZooKeeper started by the
  framework's own launcher (:class:`~framework.zkserver.ZooKeeperEnsemble`: Debian's
  ``zookeeper`` package or ``ZOOKEEPER_HOME``, free loopback ports, a temporary data
  directory, killed with the test run).  Its ``connect_string`` is what ``run_component``,
  ``Session`` and ``Client`` take.  A missing ZooKeeper installation fails the fixture with
  the launcher's one-line explanation.
* ``zk_chroot`` (per test): a fresh chroot path (``/tests/<test>-<8 hex>``), so tests that
  run the same application (the same ``app_name``) never see each other's znodes.

And :func:`~framework.testing.inprocess.running` (importable from here too), an async
context manager that runs a ``Master`` or ``Worker`` in the background of a trio test (the
real runtime, in this process) and stops it when the block ends.  Async tests need
pytest-trio (``trio_mode = true``), as the framework's own do.

For unit tests without ZooKeeper at all, see :mod:`framework.testing.stub`.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator

import pytest

from framework.testing.inprocess import running
from framework.zkserver import ZooKeeperEnsemble

__all__ = ["embedded_zookeeper", "running", "zk_chroot"]


@pytest.fixture(scope="session")
def embedded_zookeeper() -> Iterator[ZooKeeperEnsemble]:
    """A real standalone ZooKeeper for this test session (see the module doc)."""
    with ZooKeeperEnsemble(1) as server:
        yield server


@pytest.fixture
def zk_chroot(request: pytest.FixtureRequest) -> str:
    """A chroot of this test's own (created by the first session that uses it)."""
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", request.node.name)[:60]
    return f"/tests/{name}-{uuid.uuid4().hex[:8]}"
