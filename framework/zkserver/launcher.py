"""Start a real ZooKeeper (standalone or an N-node ensemble on loopback) from its jars.

The jars come from ``ZOOKEEPER_HOME`` (an Apache tarball layout) or from Debian's
``zookeeper`` package (``/usr/share/java/zookeeper.jar``, whose manifest names its
dependencies).  Each member gets free 127.0.0.1 ports and its own data directory; the JVM is
killed with SIGKILL if the process that started it dies, so tests never leave servers behind
(start members from the main thread: Linux ties that signal to the starting thread).

With ``placement``, each member instead runs inside a given network namespace, bound to an
address of its own (client port and quorum ports on that address; the connect string names
those addresses): the multi-host mode of the fault tests (:mod:`framework.testing.netns`).

With ``tls=True``, each member also serves a TLS client port (``secureClientPort``, Netty),
with a self-signed certificate made by the JDK's ``keytool`` in the ensemble's directory;
:attr:`ZooKeeperEnsemble.tls_connect_string` names those ports and
:attr:`ZooKeeperEnsemble.tls_ca` is the certificate (PEM) a client verifies them with.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Iterator, Sequence

import attrs

from framework.errors import ConfigurationError, FrameworkError
from framework.logs import get_logger

log = get_logger("framework.zkserver")

DEBIAN_JARS = (Path("/usr/share/java/zookeeper.jar"), Path("/usr/share/java/slf4j-simple.jar"))
#: Debian's zookeeper.jar manifest leaves out netty-codec, which the Netty connection
#: factory (TLS) needs.
DEBIAN_EXTRA_JARS = (Path("/usr/share/java/netty-codec.jar"),)
MAIN_CLASS = "org.apache.zookeeper.server.quorum.QuorumPeerMain"
NETTY_FACTORY = "org.apache.zookeeper.server.NettyServerCnxnFactory"
#: The password of the generated keystore (it only guards a throwaway test key).
KEYSTORE_PASSWORD = "framework-test"


class ServerStartError(FrameworkError):
    """A ZooKeeper member did not come up; the message includes the end of its log."""


def _port_free(host: str, port: int) -> bool:
    """Whether a server could listen on ``host:port`` now."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


@attrs.frozen
class Placement:
    """Where one member runs: the IPv4 ``address`` it binds its client and quorum ports to
    (clients and the other members use it), and the network namespace ``netns`` whose
    ``ip netns exec`` it runs under (``None``: the starting process's own).  The process
    starting the ensemble must be able to reach ``address`` (it asks each member ``srvr``)."""

    address: str
    netns: str | None = None


def find_classpath() -> str:
    """The classpath of an installed ZooKeeper, or a clear error saying how to get one."""
    home = os.environ.get("ZOOKEEPER_HOME")
    if home:
        jars = sorted(Path(home).glob("*.jar")) + sorted(Path(home, "lib").glob("*.jar"))
        if not jars:
            raise ConfigurationError(f"ZOOKEEPER_HOME={home} holds no ZooKeeper jars")
        return os.pathsep.join(str(j) for j in jars)
    if all(j.exists() for j in DEBIAN_JARS):
        jars = [*DEBIAN_JARS, *(j for j in DEBIAN_EXTRA_JARS if j.exists())]
        return os.pathsep.join(str(j) for j in jars)
    raise ConfigurationError(
        "ZooKeeper is not installed: run `apt-get install zookeeper` (Debian/Ubuntu), or set "
        "ZOOKEEPER_HOME to an unpacked Apache ZooKeeper, or point FRAMEWORK_ZK_HOSTS at a "
        "running ensemble"
    )


def jit_flags() -> list[str]:
    """The JVM's JIT flags from ``FRAMEWORK_ZK_JIT``: ``c1`` (the default: C1 only, a fast
    start) or ``full`` (the JVM's own tiered C1 + C2, a deployment's choice)."""
    jit = os.environ.get("FRAMEWORK_ZK_JIT", "c1")
    if jit == "full":
        return []
    if jit != "c1":
        raise ConfigurationError(f"FRAMEWORK_ZK_JIT must be c1 or full, not {jit!r}")
    return ["-XX:TieredStopAtLevel=1"]


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports that are free on 127.0.0.1 right now."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def four_letter(port: int, command: str, *, host: str = "127.0.0.1", timeout: float = 1.0) -> str:
    """Send a four-letter-word command (``srvr``, ``ruok``, ``mntr``...) and return the reply."""
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.sendall(command.encode())
        chunks = []
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
    return b"".join(chunks).decode(errors="replace")


def watched_paths(hosts: str, session_id: int, *, timeout: float = 10.0) -> int:
    """On how many paths the first server of ``hosts`` holds watches for ``session_id``
    (4lw ``wchc``; a persistent recursive watch is one path, a node with a data and a
    child watch too)."""
    host, port = hosts.split(",")[0].rsplit(":", 1)
    count, current = 0, None
    for line in four_letter(int(port), "wchc", host=host, timeout=timeout).splitlines():
        if line.startswith("0x"):
            current = int(line.strip(), 16)
        elif line.strip() and current == session_id:
            count += 1
    return count


def _die_with_parent() -> None:  # runs in the child between fork and exec
    """Ask the kernel to kill the server when its parent dies (no orphan servers after a
    crash).  Linux ties this to the *thread* that forked, so it is only used when the server
    is started from the main thread: a worker thread (``trio.to_thread``) may exit long
    before the process does, and would take the server with it."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


@attrs.define
class Member:
    """One ZooKeeper server process of an ensemble."""

    sid: int
    client_port: int
    quorum_port: int
    election_port: int
    data_dir: Path
    process: subprocess.Popen | None = None
    host: str = "127.0.0.1"  # the address clients and the other members reach it at
    netns: str | None = None  # the network namespace it runs in (None: ours)
    secure_port: int | None = None  # the TLS client port, when the ensemble has TLS

    @property
    def address(self) -> str:
        return f"{self.host}:{self.client_port}"

    @property
    def secure_address(self) -> str | None:
        return None if self.secure_port is None else f"{self.host}:{self.secure_port}"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def mode(self) -> str | None:
        """``"standalone"``, ``"leader"`` or ``"follower"`` once serving, else ``None``."""
        if not self.running:
            return None
        try:
            reply = four_letter(self.client_port, "srvr", host=self.host, timeout=0.5)
        except OSError:
            return None
        for line in reply.splitlines():
            if line.startswith("Mode:"):
                return line.split(":", 1)[1].strip()
        return None


class ZooKeeperEnsemble:
    """A real ZooKeeper of ``size`` members on loopback (``size == 1``: standalone).

    Use as a context manager (or call :meth:`start` / :meth:`stop`).  ``tick_ms`` and the
    session-timeout bounds are set low so tests can expire sessions in about a second.
    ``placement`` (one :class:`Placement` per member) runs each member in a network namespace
    of its own, on that namespace's address (``client_address`` is then not used).
    ``tls=True`` adds a TLS client port to each member (see the module's doc); the plain
    port stays open (for ``srvr`` and for clients without TLS).
    ``extended_types`` (on by default) enables TTL nodes (``extendedTypesEnabled=true``);
    the server then reaps expired TTL nodes (and empty containers) every
    ``container_check_ms`` milliseconds (ZooKeeper's own default is a minute).
    The JVM runs its C1 compiler only (``-XX:TieredStopAtLevel=1``: about a second less to
    start, what tests want); ``FRAMEWORK_ZK_JIT=full`` in the environment gives it the full
    tiered JIT (C1 and C2), as a deployed server runs - benchmarks measure with it.
    """

    def __init__(
        self,
        size: int = 1,
        *,
        tick_ms: int = 200,
        min_session_timeout_ms: int = 400,
        max_session_timeout_ms: int = 60_000,
        base_dir: str | os.PathLike[str] | None = None,
        client_port: int | None = None,
        java: str | None = None,
        heap_mb: int = 256,
        client_address: str = "127.0.0.1",
        placement: Sequence[Placement] | None = None,
        tls: bool = False,
        extended_types: bool = True,
        container_check_ms: int = 500,
    ) -> None:
        if size < 1:
            raise ConfigurationError("an ensemble needs at least one member")
        if client_port is not None and size != 1:
            raise ConfigurationError("a fixed client port only makes sense for a standalone server")
        if placement is not None and len(placement) != size:
            raise ConfigurationError(
                f"placement names {len(placement)} places for {size} member(s)"
            )
        self.size = size
        self.tick_ms = tick_ms
        self.min_session_timeout_ms = min_session_timeout_ms
        self.max_session_timeout_ms = max_session_timeout_ms
        self.java = java or shutil.which("java") or "java"
        self.heap_mb = heap_mb
        #: where members accept clients ("0.0.0.0": also from network namespaces)
        self.client_address = client_address
        self.classpath = find_classpath()
        self._own_dir = base_dir is None
        self.base_dir = Path(base_dir) if base_dir else Path(tempfile.mkdtemp(prefix="zk-"))
        self.tls = tls
        self.extended_types = extended_types
        self.container_check_ms = container_check_ms
        per = 4 if tls else 3
        ports = free_ports(per * size)
        if client_port is not None:
            ports[0] = client_port
        self.members = [
            Member(
                sid=i + 1,
                client_port=ports[per * i],
                quorum_port=ports[per * i + 1],
                election_port=ports[per * i + 2],
                data_dir=self.base_dir / f"member{i + 1}",
                secure_port=ports[per * i + 3] if tls else None,
            )
            for i in range(size)
        ]
        self.placed = placement is not None
        for member, place in zip(self.members, placement or (), strict=False):
            member.host, member.netns = place.address, place.netns

    # ---------------------------------------------------------------- configuration

    @property
    def connect_string(self) -> str:
        """The kazoo/Java connect string naming every member."""
        return ",".join(m.address for m in self.members)

    @property
    def tls_connect_string(self) -> str:
        """The connect string naming every member's TLS client port."""
        if not self.tls:
            raise ConfigurationError("this ensemble was started without tls=True")
        return ",".join(m.secure_address for m in self.members if m.secure_address)

    @property
    def tls_dir(self) -> Path:
        return self.base_dir / "tls"

    @property
    def tls_ca(self) -> Path:
        """The servers' self-signed certificate (PEM): the CA a TLS client trusts."""
        return self.tls_dir / "ca.pem"

    @property
    def keystore(self) -> Path:
        return self.tls_dir / "keystore.p12"

    def _make_keystore(self) -> None:
        """A PKCS12 keystore with a self-signed key for 127.0.0.1/localhost and every
        member's address, and its certificate as PEM (made once; kept on restarts)."""
        if self.keystore.exists():
            return
        keytool = Path(self.java).resolve().parent / "keytool"
        tool = str(keytool) if keytool.exists() else shutil.which("keytool")
        if tool is None:
            raise ConfigurationError("TLS needs the JDK's keytool next to java or on PATH")
        self.tls_dir.mkdir(parents=True, exist_ok=True)
        hosts = sorted({"127.0.0.1", *(m.host for m in self.members)})
        san = ",".join(["DNS:localhost", *(f"IP:{h}" for h in hosts)])
        common = ["-keystore", str(self.keystore), "-storetype", "PKCS12",
                  "-storepass", KEYSTORE_PASSWORD, "-alias", "zookeeper"]
        for args in (
            ["-genkeypair", "-keyalg", "RSA", "-keysize", "2048", "-validity", "30",
             "-dname", "CN=localhost", "-ext", f"SAN={san}", "-keypass", KEYSTORE_PASSWORD,
             "-noprompt", *common],
            ["-exportcert", "-rfc", "-file", str(self.tls_ca), *common],
        ):
            done = subprocess.run([tool, *args], capture_output=True, text=True)
            if done.returncode != 0:
                raise ServerStartError(f"keytool {args[0]} failed:\n{done.stdout}{done.stderr}")

    def _tls_config(self, member: Member) -> list[str]:
        if member.secure_port is None:
            return []
        return [
            f"serverCnxnFactory={NETTY_FACTORY}",
            f"secureClientPort={member.secure_port}",
            f"secureClientPortAddress={member.host if self.placed else self.client_address}",
            f"ssl.keyStore.location={self.keystore}",
            f"ssl.keyStore.password={KEYSTORE_PASSWORD}",
            "ssl.keyStore.type=PKCS12",
            f"ssl.trustStore.location={self.tls_ca}",  # whom it trusts with clientAuth
            "ssl.trustStore.type=PEM",
            "ssl.clientAuth=none",  # "need": clients must show a certificate it trusts
        ]

    def _config(self, member: Member) -> str:
        lines = [
            f"tickTime={self.tick_ms}",
            f"dataDir={member.data_dir}",
            f"clientPort={member.client_port}",
            f"clientPortAddress={member.host if self.placed else self.client_address}",
            "admin.enableServer=false",
            "4lw.commands.whitelist=*",
            f"minSessionTimeout={self.min_session_timeout_ms}",
            f"maxSessionTimeout={self.max_session_timeout_ms}",
            "maxClientCnxns=0",
            "initLimit=20",
            "syncLimit=10",
            "autopurge.purgeInterval=0",
            *self._tls_config(member),
        ]
        if self.extended_types:  # becomes the system property zookeeper.extendedTypesEnabled
            lines.append("extendedTypesEnabled=true")
        if self.size > 1:
            lines.append("reconfigEnabled=false")
            lines.append("standaloneEnabled=false")
            for m in self.members:
                lines.append(f"server.{m.sid}={m.host}:{m.quorum_port}:{m.election_port}")
        return "\n".join(lines) + "\n"

    # ---------------------------------------------------------------- processes

    def _launch(self, member: Member) -> None:
        member.data_dir.mkdir(parents=True, exist_ok=True)
        (member.data_dir / "myid").write_text(f"{member.sid}\n")
        cfg = member.data_dir / "zoo.cfg"
        if self.tls:
            self._make_keystore()
        cfg.write_text(self._config(member))
        logfile = open(member.data_dir / "server.log", "ab")  # noqa: SIM115 - owned by child
        cmd = [
            self.java,
            f"-Xmx{self.heap_mb}m",
            "-XX:+UseSerialGC",
            *jit_flags(),
            "-Xshare:auto",
            "-Dzookeeper.admin.enableServer=false",
            "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
            f"-Dznode.container.checkIntervalMs={self.container_check_ms}",
            "-cp",
            self.classpath,
            MAIN_CLASS,
            str(cfg),
        ]
        if member.netns is not None:  # `ip netns exec` execs java in place: same pid
            cmd = ["ip", "netns", "exec", member.netns, *cmd]
        member.process = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=logfile,
            stderr=subprocess.STDOUT,
            preexec_fn=(
                _die_with_parent
                if threading.current_thread() is threading.main_thread()
                else None
            ),
        )
        logfile.close()

    def _wait_serving(self, members: list[Member], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        pending = list(members)
        while pending:
            for m in list(pending):
                if not m.running:
                    raise ServerStartError(
                        f"ZooKeeper member {m.sid} exited:\n{self.log_tail(m)}"
                    )
                if m.mode() is not None:
                    pending.remove(m)
            if pending:
                if time.monotonic() > deadline:
                    raise ServerStartError(
                        f"ZooKeeper member(s) {[m.sid for m in pending]} not serving after "
                        f"{timeout:g}s:\n{self.log_tail(pending[0])}"
                    )
                time.sleep(0.05)  # an external JVM gives us no event to wait on

    def log_tail(self, member: Member, lines: int = 20) -> str:
        try:
            text = (member.data_dir / "server.log").read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def start(self, timeout: float = 60.0) -> ZooKeeperEnsemble:
        """Start every member and wait until each one answers ``srvr`` with a mode.  A client
        port already taken (another server on a fixed ``client_port``) is refused first:
        the ``srvr`` answer would otherwise come from that other server."""
        for m in self.members:
            if m.netns is None:
                for port in (m.client_port, m.secure_port):
                    if port is not None and not _port_free(m.host, port):
                        raise ServerStartError(
                            f"port {port} on {m.host} is already in use (another ZooKeeper?): "
                            "stop it, or choose another port"
                        )
        for m in self.members:
            self._launch(m)
        try:
            self._wait_serving(self.members, timeout)
        except BaseException:
            self.stop()
            raise
        log.info("zkserver.started", connect=self.connect_string, size=self.size,
                 base_dir=str(self.base_dir),
                 tls_connect=self.tls_connect_string if self.tls else None)
        return self

    def stop(self) -> None:
        """Stop every member (SIGTERM, then SIGKILL) and remove temporary data."""
        for m in self.members:
            self._terminate(m)
        if self._own_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    def _terminate(self, member: Member) -> None:
        proc = member.process
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        member.process = None

    def member(self, sid: int) -> Member:
        for m in self.members:
            if m.sid == sid:
                return m
        raise ConfigurationError(f"no member with id {sid}")

    def kill(self, sid: int) -> None:
        """kill -9 one member (its data stays, so it can be restarted)."""
        m = self.member(sid)
        if m.process is not None:
            m.process.kill()
            m.process.wait()
            m.process = None
        log.info("zkserver.killed", sid=sid)

    def restart(self, sid: int, timeout: float = 60.0) -> None:
        """Start a killed member again with its old data and ports; wait until it serves."""
        m = self.member(sid)
        if m.running:
            self.kill(sid)
        self._launch(m)
        self._wait_serving([m], timeout)
        log.info("zkserver.restarted", sid=sid)

    def leader(self) -> int | None:
        """The id of the member that is leader (or standalone) now, if any."""
        for m in self.members:
            if m.mode() in ("leader", "standalone"):
                return m.sid
        return None

    def modes(self) -> dict[int, str | None]:
        return {m.sid: m.mode() for m in self.members}

    def running_members(self) -> Iterator[Member]:
        return (m for m in self.members if m.running)

    def __enter__(self) -> ZooKeeperEnsemble:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
