"""A loopback TCP proxy that can freeze or cut a client's connection to ZooKeeper.

Freezing stops every byte (and every close) in both directions while keeping sockets open,
which is what a network partition looks like to both sides: the client's reads time out
(SUSPENDED) and, if the freeze lasts longer than the session timeout, the server expires the
session (LOST on reconnect).  Cutting closes every connection at once (SUSPENDED at once, the
session survives if the client reconnects in time).  Runs on plain threads so it works the
same from sync fixtures, trio tests and subprocesses.
"""

from __future__ import annotations

import socket
import threading

from framework.errors import ConfigurationError


class TcpProxy:
    """Forward ``127.0.0.1:<port>`` to one upstream ``(host, port)``."""

    def __init__(self, upstream: tuple[str, int] | str, *, listen_port: int = 0) -> None:
        if isinstance(upstream, str):
            first = upstream.split(",")[0]
            host, _, port = first.rpartition(":")
            if not host or not port.isdigit():
                raise ConfigurationError(f"bad upstream address {upstream!r}")
            upstream = (host, int(port))
        self.upstream = upstream
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", listen_port))
        self._listener.listen(64)
        self.port = self._listener.getsockname()[1]
        self._open = threading.Event()
        self._open.set()
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._stopped = False
        self.connections_accepted = 0
        self._thread = threading.Thread(target=self._accept_loop, daemon=True,
                                        name=f"proxy-{self.port}")
        self._thread.start()

    @property
    def address(self) -> str:
        """Connect string of the proxy (``127.0.0.1:port``)."""
        return f"127.0.0.1:{self.port}"

    def freeze(self) -> None:
        """Stop forwarding anything, in both directions, until :meth:`unfreeze`."""
        self._open.clear()

    def unfreeze(self) -> None:
        self._open.set()

    @property
    def frozen(self) -> bool:
        return not self._open.is_set()

    def cut(self) -> None:
        """Close every open connection now (new ones are still accepted)."""
        with self._lock:
            sockets = list(self._sockets)
            self._sockets.clear()
        for s in sockets:
            _close(s)

    def stop(self) -> None:
        self._stopped = True
        self._open.set()
        _close(self._listener)
        self.cut()

    def __enter__(self) -> TcpProxy:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # ---------------------------------------------------------------- internals

    def _accept_loop(self) -> None:
        while not self._stopped:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            self.connections_accepted += 1
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        self._track(client)
        self._open.wait()
        try:
            upstream = socket.create_connection(self.upstream, timeout=5)
            upstream.settimeout(None)
        except OSError:
            self._untrack(client)
            return
        self._track(upstream)
        threading.Thread(target=self._pump, args=(upstream, client), daemon=True).start()
        self._pump(client, upstream)

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                data = b""
            self._open.wait()
            if not data:
                break
            try:
                dst.sendall(data)
            except OSError:
                break
        self._untrack(src)
        self._untrack(dst)

    def _track(self, s: socket.socket) -> None:
        with self._lock:
            self._sockets.add(s)

    def _untrack(self, s: socket.socket) -> None:
        with self._lock:
            self._sockets.discard(s)
        _close(s)


def _close(s: socket.socket) -> None:
    try:
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    try:
        s.close()
    except OSError:
        pass
