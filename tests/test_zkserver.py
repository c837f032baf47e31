"""The real-ZooKeeper launcher and the `framework zk` command."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import trio

from framework import ConfigurationError, Session
from framework.testing import spawn
from framework.zkserver import ServerStartError, ZooKeeperEnsemble, four_letter, free_ports


def test_standalone_server_reports_its_mode(zk_hosts: str) -> None:
    port = int(zk_hosts.split(",")[0].rsplit(":", 1)[1])
    assert "Mode: standalone" in four_letter(port, "srvr") or "Mode:" in four_letter(port, "srvr")


def test_missing_installation_gives_a_clear_error(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("ZOOKEEPER_HOME", str(tmp_path))
    with pytest.raises(ConfigurationError, match="no ZooKeeper jars"):
        ZooKeeperEnsemble(1)


def test_a_client_port_in_use_is_refused_not_reported_serving(zk_hosts: str) -> None:
    """A second server on the port of a running one must not take that one's ``srvr``
    answer for its own: it fails at once, in one line naming the port (the CLI prints it
    as ``framework: error: ...`` and exits 2)."""
    port = int(zk_hosts.rsplit(":", 1)[1])
    with pytest.raises(ServerStartError, match=f"port {port} .* already in use"):
        ZooKeeperEnsemble(1, client_port=port).start()
    done = subprocess.run([sys.executable, "-m", "framework", "zk", "--port", str(port)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "already in use" in done.stderr
    assert "Traceback" not in done.stderr and "serving" not in done.stdout


def test_ensemble_kill_restart_and_leader(ensemble: ZooKeeperEnsemble) -> None:
    modes = ensemble.modes()
    assert sorted(modes.values()) == ["follower", "follower", "leader"]
    follower = next(sid for sid, mode in modes.items() if mode == "follower")
    ensemble.kill(follower)
    assert ensemble.modes()[follower] is None
    ensemble.restart(follower)
    assert ensemble.modes()[follower] == "follower"


async def test_cli_zk_runs_until_terminated(tmp_path: Path) -> None:
    (port,) = free_ports(1)
    async with spawn([sys.executable, "-m", "framework", "zk", "--port", str(port)],
                     name="zk", log_dir=tmp_path, pipe_stdout=True,
                     env={"FRAMEWORK_LOG_LEVEL": "warning"}) as zk:
        assert zk.lines is not None
        with trio.fail_after(60):
            first = await zk.lines.next()
            assert f"127.0.0.1:{port}" in first
            async with Session(f"127.0.0.1:{port}") as s:
                await s.create("/hello", b"world")
            zk.terminate()
            out = "\n".join(await zk.lines.rest())
            assert await zk.wait() == 0 and "stopped" in out


@pytest.mark.parametrize("argv", [[], ["bogus"]])
def test_cli_usage_errors_exit_2_without_traceback(argv: list[str]) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "framework", *argv], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
