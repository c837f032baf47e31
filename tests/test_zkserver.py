"""The real-ZooKeeper launcher and the `framework zk` command."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
import trio

from framework import ConfigurationError, Session
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


def test_cli_zk_runs_until_terminated() -> None:
    (port,) = free_ports(1)
    proc = subprocess.Popen(
        [sys.executable, "-m", "framework", "zk", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "FRAMEWORK_LOG_LEVEL": "warning"},
    )
    try:
        first = proc.stdout.readline()
        assert f"127.0.0.1:{port}" in first

        async def use_it() -> None:
            async with Session(f"127.0.0.1:{port}") as s:
                await s.create("/hello", b"world")

        trio.run(use_it)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=20)
        assert proc.returncode == 0 and "stopped" in out
    finally:
        proc.kill()


@pytest.mark.parametrize("argv", [[], ["bogus"]])
def test_cli_usage_errors_exit_2_without_traceback(argv: list[str]) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "framework", *argv], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
