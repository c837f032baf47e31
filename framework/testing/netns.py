"""A virtual network of hosts on this machine, for partitions that are real to the kernel.

Each *host* is a Linux network namespace with one interface, ``eth0``, whose veth peer is a
port of a bridge living in a namespace of its own (the "switch").  The root namespace (where
the test runner is) gets a port on the same bridge too, so it can reach every host::

    root namespace (test runner)                 bridge namespace <prefix>-<pid>-<seq>
      fwn<pid>n<seq> 10.203.X.254 ---- veth ---- root --+
                                                        |
    host "zk1"  <prefix>-<pid>-<seq>-zk1                |   br0: iptables FORWARD rules
      eth0 10.203.X.1 ---------------------- veth ---- p1 --+        are the faults
    host "a"    <prefix>-<pid>-<seq>-a                  |
      eth0 10.203.X.2 ---------------------- veth ---- p2 --+
    ...

A process started with :meth:`Host.command` (``ip netns exec <namespace> ...``) lives in the
host: its sockets use the host's address and reach the others only through the bridge.

**Faults** are iptables ``DROP`` rules in the bridge namespace's ``FORWARD`` chain (bridged
IPv4 passes through iptables there via the kernel's ``br_netfilter``), so they act *in the
network*, as a failed switch would, and leave the hosts' own network stacks untouched:

* :meth:`VirtualNetwork.partition` drops every packet between two hosts (both ways, or one);
  :meth:`VirtualNetwork.isolate` drops every packet to or from one host (the root namespace
  included).  ``DROP`` is silent: no RST and no ICMP error reaches either side, sends succeed
  locally, established TCP connections stay open and retransmit into the void, new
  connection attempts time out.  That is what a partition looks like.  (``REJECT`` would
  answer with an RST or an ICMP error: the peer learns at once that the connection is gone,
  as when a process crashes, and a client would never have to notice silence.  A ``DROP``
  in the sender's own ``OUTPUT`` chain would make its sends fail with ``EPERM``, which no
  real network does.  ``tc netem loss 100%`` cuts a whole interface rather than a pair of
  hosts, and needs ``sch_netem``, which many kernels - this project's CI VM included - lack.)
* :meth:`VirtualNetwork.heal` removes every rule and delay: retransmissions get through
  again, and connections that neither end gave up on carry on.
* :meth:`VirtualNetwork.delay` adds latency with ``tc netem`` (needs ``sch_netem``; a clear
  :class:`NetnsError` otherwise, see :func:`delay_available`).

ARP is not filtered: neighbours stay resolved, the partition is at the IP level.

**Names and cleanup.**  Every namespace is named ``<prefix>-<pid>-<seq>[-<host>]`` (pid of
the creating process, a per-process sequence number), the root namespace's veth
``fwn<pid>n<seq>``, and the subnet ``10.203.X.0/24`` is chosen (under a file lock) among those
no address or route of the root namespace uses, so parallel runs do not collide.
:meth:`VirtualNetwork.destroy` (called by the context manager, also after an exception, and
at interpreter exit) kills what still runs in its namespaces and deletes them; the bridge,
every veth and every iptables rule go with them, and nothing is left in the root namespace.
:func:`cleanup_stale` does the same for networks whose creating process is dead (a run
killed with SIGKILL).

Needs root, iproute2 (``ip``, ``tc``) and iptables; :func:`netns_available` says why hosts
cannot be made here (for ``pytest.skip``), and every failing command raises a one-line
:class:`NetnsError` naming the command and its error.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import ipaddress
import itertools
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import attrs

from framework.errors import FrameworkError

__all__ = [
    "PREFIX",
    "Host",
    "NetnsError",
    "VirtualNetwork",
    "cleanup_stale",
    "delay_available",
    "netns_available",
]

#: Default first part of every namespace name made here.
PREFIX = "fwnet"
_SUBNETS = "10.203"
_ROOT_HOST = 254  # the root namespace's address on the bridge: 10.203.X.254
_LOCK = Path("/run/lock/framework-netns.lock")
_HOST_NAME = re.compile(r"[a-z][a-z0-9]{0,11}")
_sequence = itertools.count(1)
_availability: dict[str, str | None] = {}


class NetnsError(FrameworkError):
    """A network-namespace operation failed; the message names the command and its error."""


# ------------------------------------------------------------------------------ commands


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run one command; on failure (with ``check``) raise :class:`NetnsError` in one line."""
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        raise NetnsError(f"{argv[0]!r} is not installed") from None
    except subprocess.TimeoutExpired:
        raise NetnsError(f"`{' '.join(argv)}` did not finish in 30 s") from None
    if check and done.returncode != 0:
        error = " ".join(done.stderr.split()) or f"exit status {done.returncode}"
        raise NetnsError(f"`{' '.join(argv)}` failed: {error}")
    return done


def _in(netns: str, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return _run("ip", "netns", "exec", netns, *argv, check=check)


def _missing_tools() -> str | None:
    for tool, package in (("ip", "iproute2"), ("tc", "iproute2"), ("iptables", "iptables")):
        if shutil.which(tool) is None:
            return f"{tool!r} is not installed (apt-get install {package})"
    return None


def netns_available() -> str | None:
    """``None`` if virtual networks can be built and partitioned here, else why not.

    Checked once per process by building a one-host network and adding a ``DROP`` rule, so
    a restricted container (namespaces refused, nftables refused, no ``br_netfilter``) is
    found out here rather than in the middle of a test."""
    if "netns" not in _availability:
        _availability["netns"] = _probe()
    return _availability["netns"]


def _probe() -> str | None:
    if not sys.platform.startswith("linux"):
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "network namespaces need root (run the netns tests as root)"
    missing = _missing_tools()
    if missing:
        return missing
    try:
        with VirtualNetwork.create(["probe"]) as net:
            net.isolate("probe")
            net.heal()
    except NetnsError as exc:
        return str(exc)
    return None


def delay_available() -> str | None:
    """``None`` if :meth:`VirtualNetwork.delay` works here, else why not (``sch_netem``)."""
    if "delay" not in _availability:
        reason = netns_available()
        if reason is None:
            try:
                with VirtualNetwork.create(["probe"]) as net:
                    net.delay("probe", 1)
            except NetnsError as exc:
                reason = str(exc)
        _availability["delay"] = reason
    return _availability["delay"]


# ------------------------------------------------------------------------------ cleanup


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _namespaces() -> list[str]:
    listed = _run("ip", "netns", "list", check=False).stdout
    return [line.split()[0] for line in listed.splitlines() if line.strip()]


def _kill_inside(netns: str) -> None:
    """SIGKILL every process still running in ``netns`` (they were started in it by the
    network's owner) and wait until they are gone, so the namespace can really go."""
    pids = [int(p) for p in _run("ip", "netns", "pids", netns, check=False).stdout.split()]
    handles = []
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            handles.append(os.pidfd_open(pid))  # readable once the process has exited
            os.kill(pid, signal.SIGKILL)
    try:
        deadline = time.monotonic() + 5
        for handle in handles:
            select.select([handle], [], [], max(0.0, deadline - time.monotonic()))
    finally:
        for handle in handles:
            os.close(handle)


def cleanup_stale(prefix: str = PREFIX) -> list[str]:
    """Delete the networks of ``prefix`` whose creating process is dead (killed runs):
    processes still in their namespaces are killed, the namespaces deleted (with the bridge,
    the veths and the iptables rules), and a root-namespace veth left alone deleted.
    Returns the namespaces deleted.  Networks of live processes are never touched."""
    removed = []
    for name in _namespaces():
        parts = name.split("-")
        if (len(parts) >= 3 and parts[0] == prefix and parts[1].isdigit()
                and not _pid_alive(int(parts[1]))):
            _kill_inside(name)
            _run("ip", "netns", "del", name, check=False)
            removed.append(name)
    links = _run("ip", "-o", "link", "show", check=False).stdout
    for match in re.finditer(r"^\d+: (fwn(\d+)n\d+)[@:]", links, re.MULTILINE):
        if not _pid_alive(int(match.group(2))):
            _run("ip", "link", "del", match.group(1), check=False)
    return removed


# ------------------------------------------------------------------------------ the network


@attrs.frozen
class Host:
    """One host of a :class:`VirtualNetwork`: a network namespace with ``eth0`` at
    :attr:`address`, plugged into the bridge at :attr:`port`."""

    name: str
    netns: str
    address: str
    port: str  # the veth end in the bridge namespace

    def command(self, *argv: str) -> list[str]:
        """``argv`` as run inside this host (``ip netns exec``: the program's pid is that of
        the process started, so it can be signalled directly)."""
        return ["ip", "netns", "exec", self.netns, *argv]

    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` inside this host and wait for it (:class:`NetnsError` on failure)."""
        return _in(self.netns, *argv, check=check)

    def popen(self, argv: Sequence[str], **kwargs: object) -> subprocess.Popen[bytes]:
        """Start ``argv`` inside this host (keyword arguments go to ``subprocess.Popen``)."""
        return subprocess.Popen(self.command(*argv), **kwargs)  # type: ignore[call-overload]


@attrs.define
class VirtualNetwork:
    """Hosts on one bridge, with faults between them (see the module doc).

    Build it with :meth:`create` and use it as a context manager: on exit (also after an
    exception) everything it made is removed.  Fault methods take host names or
    :class:`Host` objects; they are synchronous and take a few milliseconds.
    """

    prefix: str
    bridge_netns: str
    subnet: ipaddress.IPv4Network
    hosts: dict[str, Host]
    root_link: str | None
    root_address: str | None
    _delayed: set[str] = attrs.field(factory=set)
    _destroyed: bool = False

    @classmethod
    def create(cls, names: Iterable[str], *, prefix: str = PREFIX,
               root_access: bool = True) -> VirtualNetwork:
        """Build the bridge and one host per name (names: a lower-case letter, then up to 11
        letters or digits).  With ``root_access`` the root namespace gets the address
        ``10.203.X.254`` on the bridge, so this process can reach every host."""
        names = list(names)
        if not names or len(set(names)) != len(names) or len(names) > 250:
            raise NetnsError(f"need 1 to 250 distinct host names, got {names!r}")
        for name in names:
            if not _HOST_NAME.fullmatch(name):
                raise NetnsError(f"bad host name {name!r} (a-z, then up to 11 of a-z0-9)")
        missing = _missing_tools()
        if missing:
            raise NetnsError(missing)
        if os.geteuid() != 0:
            raise NetnsError("network namespaces need root")
        pid, seq = os.getpid(), next(_sequence)
        base = f"{prefix}-{pid}-{seq}"
        net = cls(prefix=prefix, bridge_netns=base, subnet=ipaddress.IPv4Network("0.0.0.0/32"),
                  hosts={}, root_link=f"fwn{pid}n{seq}" if root_access else None,
                  root_address=None)
        atexit.register(net.destroy)
        try:
            with _locked():
                net.subnet = _free_subnet(pid)
                net._build(names)
        except BaseException:
            net.destroy()
            raise
        return net

    def _build(self, names: list[str]) -> None:
        br = self.bridge_netns
        _run("ip", "netns", "add", br)
        _run("ip", "-n", br, "link", "add", "br0", "type", "bridge")
        _run("ip", "-n", br, "link", "set", "br0", "up")
        _check_bridge_filtering(br)
        prefix_len = self.subnet.prefixlen
        for index, name in enumerate(names, start=1):
            host = Host(name, f"{br}-{name}", str(self.subnet[index]), f"p{index}")
            _run("ip", "netns", "add", host.netns)
            self.hosts[name] = host
            _run("ip", "-n", br, "link", "add", host.port, "type", "veth",
                 "peer", "name", "eth0", "netns", host.netns)
            _run("ip", "-n", br, "link", "set", host.port, "master", "br0", "up")
            _run("ip", "-n", host.netns, "addr", "add", f"{host.address}/{prefix_len}",
                 "dev", "eth0")
            _run("ip", "-n", host.netns, "link", "set", "eth0", "up")
            _run("ip", "-n", host.netns, "link", "set", "lo", "up")
        if self.root_link is not None:
            address = str(self.subnet[_ROOT_HOST])
            _run("ip", "link", "add", self.root_link, "type", "veth",
                 "peer", "name", "root", "netns", br)
            _run("ip", "-n", br, "link", "set", "root", "master", "br0", "up")
            _run("ip", "addr", "add", f"{address}/{prefix_len}", "dev", self.root_link)
            _run("ip", "link", "set", self.root_link, "up")
            self.root_address = address

    # -------------------------------------------------------------------------- access

    def __getitem__(self, name: str) -> Host:
        return self.hosts[name]

    def _host(self, host: str | Host) -> Host:
        name = host.name if isinstance(host, Host) else host
        try:
            return self.hosts[name]
        except KeyError:
            raise NetnsError(f"no host {name!r} in this network") from None

    # -------------------------------------------------------------------------- faults

    def _drop(self, *match: str) -> None:
        _in(self.bridge_netns, "iptables", "-w", "5", "-A", "FORWARD", *match, "-j", "DROP")

    def partition(self, a: str | Host, b: str | Host, *, both_ways: bool = True) -> None:
        """Drop every packet from ``a`` to ``b`` (and from ``b`` to ``a`` unless
        ``both_ways=False``, a one-way partition).  Silent: see the module doc.  Takes
        effect for the next packet; cumulative with the other faults until :meth:`heal`."""
        ha, hb = self._host(a), self._host(b)
        self._drop("-s", ha.address, "-d", hb.address)
        if both_ways:
            self._drop("-s", hb.address, "-d", ha.address)

    def isolate(self, host: str | Host) -> None:
        """Drop every packet to or from ``host``: cut off from every other host and from the
        root namespace (its own loopback still works)."""
        h = self._host(host)
        self._drop("-s", h.address)
        self._drop("-d", h.address)

    def delay(self, host: str | Host, ms: float) -> None:
        """Delay every packet leaving ``host`` by ``ms`` and every packet sent to it by
        ``ms`` (a round trip with any other host gains ``2 * ms``), with ``tc netem``.
        Replaces an earlier delay of that host; :meth:`heal` removes it."""
        h = self._host(host)
        spec = ("root", "netem", "delay", f"{ms:g}ms")
        for netns, dev in ((h.netns, "eth0"), (self.bridge_netns, h.port)):
            done = _run("ip", "netns", "exec", netns, "tc", "qdisc", "replace", "dev", dev,
                        *spec, check=False)
            if done.returncode != 0:
                error = " ".join(done.stderr.split())
                if "unknown" in error.lower() or "not supported" in error.lower():
                    raise NetnsError("tc netem is not available in this kernel "
                                     f"(sch_netem; modprobe sch_netem): {error}")
                raise NetnsError(f"tc qdisc replace dev {dev} netem failed: {error}")
            self._delayed.add(h.name)

    def heal(self) -> None:
        """Remove every partition, isolation and delay: the network is whole again."""
        if self._destroyed:
            return
        _in(self.bridge_netns, "iptables", "-w", "5", "-F", "FORWARD")
        for name in sorted(self._delayed):
            h = self.hosts[name]
            _in(h.netns, "tc", "qdisc", "del", "dev", "eth0", "root", check=False)
            _in(self.bridge_netns, "tc", "qdisc", "del", "dev", h.port, "root", check=False)
        self._delayed.clear()

    def rules(self) -> str:
        """The bridge's current ``FORWARD`` rules with packet counts (for diagnostics)."""
        return _in(self.bridge_netns, "iptables", "-w", "5", "-L", "FORWARD", "-v", "-n").stdout

    # -------------------------------------------------------------------------- teardown

    def destroy(self) -> None:
        """Kill whatever still runs in the hosts, delete every namespace (the bridge, veths
        and rules go with them) and the root namespace's veth.  Idempotent; never raises."""
        if self._destroyed:
            return
        self._destroyed = True
        atexit.unregister(self.destroy)
        spaces = [h.netns for h in self.hosts.values()] + [self.bridge_netns]
        existing = set(_namespaces())
        for netns in spaces:
            if netns in existing:
                _kill_inside(netns)
        for netns in spaces:
            if netns in existing:
                _run("ip", "netns", "del", netns, check=False)
        if self.root_link is not None:
            _run("ip", "link", "del", self.root_link, check=False)  # gone with its peer

    def __enter__(self) -> VirtualNetwork:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.destroy()


def _check_bridge_filtering(bridge_netns: str) -> None:
    """Make sure bridged IPv4 passes the bridge namespace's iptables (``br_netfilter``)."""
    knob = "/proc/sys/net/bridge/bridge-nf-call-iptables"
    state = _in(bridge_netns, "cat", knob, check=False)
    if state.returncode != 0 and shutil.which("modprobe"):
        _run("modprobe", "br_netfilter", check=False)
        state = _in(bridge_netns, "cat", knob, check=False)
    if state.returncode != 0:
        raise NetnsError("bridged packets bypass iptables: the kernel's br_netfilter is not "
                         "loaded (modprobe br_netfilter)")
    if state.stdout.strip() != "1":  # per namespace since Linux 5.3
        _in(bridge_netns, "sysctl", "-q", "-w", "net.bridge.bridge-nf-call-iptables=1")


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    """Serialise subnet choice and creation between processes on this machine."""
    _LOCK.parent.mkdir(parents=True, exist_ok=True)
    with open(_LOCK, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _free_subnet(pid: int) -> ipaddress.IPv4Network:
    """A ``10.203.X.0/24`` that no address or route of the root namespace overlaps."""
    used: list[ipaddress.IPv4Network] = []
    for argv in (("ip", "-4", "-o", "addr", "show"), ("ip", "-4", "route", "show", "table", "all")):
        for token in _run(*argv, check=False).stdout.split():
            with contextlib.suppress(ValueError):
                if token[0].isdigit():
                    used.append(ipaddress.IPv4Network(token, strict=False))
    for step in range(254):
        x = (pid + step) % 254 + 1
        candidate = ipaddress.IPv4Network(f"{_SUBNETS}.{x}.0/24")
        if not any(candidate.overlaps(u) and u.prefixlen > 8 for u in used):
            return candidate
    raise NetnsError(f"every {_SUBNETS}.X.0/24 subnet is in use in the root namespace")
