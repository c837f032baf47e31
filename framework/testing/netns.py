"""Hosts in network namespaces on this machine, for partitions that are real to the kernel.

Each :class:`Host` is a network namespace joined to the root namespace by a veth pair on a
private /30 (``10.203.<n>.1`` on the root side, ``10.203.<n>.2`` inside).  ZooKeeper runs in
the root namespace listening on every address (``ZooKeeperEnsemble(client_address=
"0.0.0.0")``); a process started with :meth:`Host.command` lives in the namespace and
reaches it at :attr:`Host.gateway`.

:meth:`Host.partition` cuts the link like a pulled cable (the root end of the veth goes
down): silent to the host (no RST, no ICMP reaches it), its connections stay open and
nothing arrives; :meth:`Host.heal` reconnects it.  This needs only iproute2, no firewall
tool and no kernel module (``tc netem``, used by :meth:`Host.delay`, needs ``sch_netem``,
which containers often lack).

Needs root and ``ip``/``tc``: :func:`netns_available` says why not, for skipping.
Names carry the creating pid, so parallel runs do not collide; :func:`cleanup_stale`
removes what a killed run left behind.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import attrs

_PREFIX = "fwns"


def netns_available() -> str | None:
    """``None`` if hosts can be made here, else the reason they cannot."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"{tool!r} (iproute2) is not installed"
    name = f"{_PREFIX}-{os.getpid()}-probe"
    probe = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"cannot create a network namespace here: {probe.stderr.strip()}"
    veth = subprocess.run(["ip", "link", "add", f"fwp{os.getpid() % 100000}", "type", "veth",
                           "peer", "name", f"fwq{os.getpid() % 100000}"],
                          capture_output=True, text=True)
    subprocess.run(["ip", "link", "del", f"fwp{os.getpid() % 100000}"], capture_output=True)
    subprocess.run(["ip", "netns", "del", name], capture_output=True)
    if veth.returncode != 0:
        return f"cannot create a veth pair here: {veth.stderr.strip()}"
    return None


def _run(*args: str) -> None:
    done = subprocess.run(list(args), capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: {done.stderr.strip()}")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def cleanup_stale() -> None:
    """Delete namespaces (and so their veths) left by runs whose process is gone."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    for line in listed.splitlines():
        name = line.split()[0] if line.strip() else ""
        parts = name.split("-")
        stale = (len(parts) == 3 and parts[0] == _PREFIX and parts[1].isdigit()
                 and not _pid_alive(int(parts[1])))
        if stale:
            subprocess.run(["ip", "netns", "del", name], capture_output=True)


@attrs.define
class Host:
    """One network namespace with a veth link to the root namespace."""

    index: int
    name: str = ""
    outer: str = ""  # the veth end in the root namespace
    inner: str = ""  # the veth end inside the namespace
    partitioned: bool = False

    @property
    def gateway(self) -> str:
        """The root namespace's address on this host's link (where ZooKeeper is reached)."""
        return f"10.203.{self.index}.1"

    @property
    def address(self) -> str:
        return f"10.203.{self.index}.2"

    def create(self) -> Host:
        pid = os.getpid()
        self.name = f"{_PREFIX}-{pid}-{self.index}"
        self.outer = f"fw{pid % 100000}o{self.index}"[:15]
        self.inner = f"fw{pid % 100000}i{self.index}"[:15]
        _run("ip", "netns", "add", self.name)
        try:
            _run("ip", "link", "add", self.outer, "type", "veth", "peer", "name", self.inner)
            _run("ip", "link", "set", self.inner, "netns", self.name)
            _run("ip", "addr", "add", f"{self.gateway}/30", "dev", self.outer)
            _run("ip", "link", "set", self.outer, "up")
            inside = ("ip", "netns", "exec", self.name)
            _run(*inside, "ip", "addr", "add", f"{self.address}/30", "dev", self.inner)
            _run(*inside, "ip", "link", "set", self.inner, "up")
            _run(*inside, "ip", "link", "set", "lo", "up")
        except BaseException:
            self.destroy()
            raise
        return self

    def command(self, *argv: str) -> list[str]:
        """``argv`` run inside this host's namespace."""
        return ["ip", "netns", "exec", self.name, *argv]

    def partition(self) -> None:
        """Cut the link, both ways, like a pulled cable: the root end goes down, the inner
        end loses its carrier, packets are dropped without an RST or an ICMP reaching the
        host, and its connections stay open."""
        _run("ip", "link", "set", self.outer, "down")
        self.partitioned = True

    def delay(self, ms: int) -> None:
        """Add ``ms`` of latency each way (needs the kernel's ``sch_netem``)."""
        _run("tc", "qdisc", "replace", "dev", self.outer, "root", "netem", "delay", f"{ms}ms")
        _run("ip", "netns", "exec", self.name, "tc", "qdisc", "replace", "dev", self.inner,
             "root", "netem", "delay", f"{ms}ms")

    def heal(self) -> None:
        """Reconnect the link (and remove a delay)."""
        _run("ip", "link", "set", self.outer, "up")
        subprocess.run(["tc", "qdisc", "del", "dev", self.outer, "root"], capture_output=True)
        subprocess.run(["ip", "netns", "exec", self.name, "tc", "qdisc", "del", "dev",
                        self.inner, "root"], capture_output=True)
        self.partitioned = False

    def destroy(self) -> None:
        """Remove the namespace and the link (deleting one veth end deletes both)."""
        subprocess.run(["ip", "link", "del", self.outer], capture_output=True)
        if self.name:
            subprocess.run(["ip", "netns", "del", self.name], capture_output=True)
