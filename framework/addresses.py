"""Where a server listens and what it publishes: one rule for every server of the framework.

Every server (broker server, Katta node, dashboard, metrics endpoint, the demo sites) has two
addresses:

* the **listen** address: the local address (and port) its socket is bound to;
* the **advertised** address: what it publishes (in its ZooKeeper records, in URLs), i.e.
  what *other hosts* connect to.

The rule (:func:`choose_endpoint`):

=====================================  ==========================================================
given                                  result
=====================================  ==========================================================
nothing                                listen on the *route address*, advertise it
listen ``HOST`` (not a wildcard)       listen there, advertise ``HOST``
listen ``0.0.0.0`` / ``::``            listen on every interface, advertise the route address
advertise ``NAME[:PORT]``              publish that (behind NAT, a DNS name); listen as above
=====================================  ==========================================================

The **route address** (:func:`route_address`) is the local address of the interface that
routes to ZooKeeper (the first member of the connect string that resolves: the kernel's
source address for it, found with a connected UDP socket, which sends nothing).  It is
``127.0.0.1`` only when ZooKeeper itself is on loopback, or when no connect string is known
(neither given nor in ``$FRAMEWORK_ZK_HOSTS``): a single-machine setup stays on loopback.

A port given in the listen address wins over the server's own port setting; the advertised
port is the bound one (so port 0, "any free port", publishes the real port) unless the
advertised address names one.  An address that cannot be bound is a one-line
:class:`~framework.errors.ConfigurationError` naming the setting (:func:`open_listeners`,
:func:`check_bindable`): a process refuses to start rather than publish an address nobody
can reach.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from collections.abc import Mapping

import attrs
import trio

from framework.errors import ConfigurationError

__all__ = ["Endpoint", "check_bindable", "choose_endpoint", "format_address", "open_listeners",
           "parse_address", "route_address"]

ENV_ZK_HOSTS = "FRAMEWORK_ZK_HOSTS"
LOOPBACK = "127.0.0.1"
_WILDCARDS = {"0.0.0.0", "::", ""}


@attrs.frozen
class Endpoint:
    """The outcome of :func:`choose_endpoint`: bind ``listen_host:port``, publish
    ``advertise_host`` with ``advertise_port`` (``None``: the port actually bound)."""

    listen_host: str
    port: int
    advertise_host: str
    advertise_port: int | None = None

    def advertised(self, bound_port: int) -> str:
        """``host:port`` to publish, given the port the socket got."""
        port = self.advertise_port if self.advertise_port is not None else bound_port
        return format_address(self.advertise_host, port)

    @property
    def listen(self) -> str:
        return format_address(self.listen_host, self.port)


def format_address(host: str, port: int) -> str:
    """``host:port`` (``[v6]:port`` for an IPv6 literal)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def parse_address(value: str, *, what: str = "address") -> tuple[str | None, int | None]:
    """``HOST``, ``HOST:PORT``, ``:PORT``, ``[V6]`` or ``[V6]:PORT`` as ``(host, port)``
    (``None`` for a part not given); a malformed value is a one-line
    :class:`ConfigurationError` naming ``what``."""
    text = value.strip()
    if not text:
        return None, None
    host: str | None
    port_text: str | None = None
    if text.startswith("["):
        end = text.find("]")
        if end < 0 or (end + 1 < len(text) and text[end + 1] != ":"):
            raise ConfigurationError(f"{what}: {value!r} is not HOST, HOST:PORT or [V6]:PORT")
        host = text[1:end]
        port_text = text[end + 2:] if end + 1 < len(text) else None
    elif text.count(":") > 1:  # a bare IPv6 literal
        host = text
    elif ":" in text:
        host, port_text = text.rsplit(":", 1)
    else:
        host = text
    port: int | None = None
    if port_text is not None:
        if not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
            raise ConfigurationError(f"{what}: port in {value!r} must be 0-65535")
        port = int(port_text)
    return (host or None), port


def _zk_members(connect: str) -> list[tuple[str, int]]:
    members: list[tuple[str, int]] = []
    for part in connect.split("/", 1)[0].split(","):
        host, port = parse_address(part, what="ZooKeeper connect string")
        if host:
            members.append((host, port or 2181))
    return members


def route_address(zk_hosts: str | None = None,
                  environ: Mapping[str, str] | None = None) -> str:
    """The local address of the interface that routes to ZooKeeper (see the module doc).

    ``zk_hosts``: a connect string (default ``$FRAMEWORK_ZK_HOSTS``); loopback when it is
    on loopback, unknown, or no member resolves (nothing else could reach us either)."""
    env = os.environ if environ is None else environ
    connect = zk_hosts if zk_hosts else env.get(ENV_ZK_HOSTS, "")
    for host, port in _zk_members(connect):
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)
        except OSError:
            continue
        for family, _type, _proto, _name, sockaddr in infos:
            if ipaddress.ip_address(sockaddr[0].split("%")[0]).is_loopback:
                return LOOPBACK
            try:
                with socket.socket(family, socket.SOCK_DGRAM) as probe:
                    probe.connect(sockaddr)  # picks the route; sends nothing
                    return str(probe.getsockname()[0])
            except OSError:
                continue
    return LOOPBACK


def choose_endpoint(listen: str | None = None, advertise: str | None = None, *,
           zk_hosts: str | None = None, port: int = 0, what: str = "listen address",
           environ: Mapping[str, str] | None = None) -> Endpoint:
    """The :class:`Endpoint` for the given settings (see the module doc's table).

    ``listen``/``advertise``: the settings as given (flag or environment variable; empty or
    ``None``: not given); ``port``: the server's own port setting, used when ``listen``
    names none; ``what``: the setting's name, for errors."""
    listen_host, listen_port = parse_address(listen or "", what=what)
    adv_host, adv_port = parse_address(advertise or "", what=f"advertised {what}")
    if listen_host is None or listen_host in _WILDCARDS:
        route = None
        if adv_host is None:
            route = route_address(zk_hosts, environ)
            adv_host = route
        if listen_host is None:
            listen_host = route or route_address(zk_hosts, environ)
    elif adv_host is None:
        adv_host = listen_host
    bind_port = listen_port if listen_port is not None else port
    if not 0 <= bind_port <= 65535:
        raise ConfigurationError(f"{what}: port must be 0-65535, got {bind_port}")
    return Endpoint(listen_host, bind_port, adv_host, adv_port)


def _cannot_bind(endpoint: Endpoint, what: str, exc: OSError) -> ConfigurationError:
    return ConfigurationError(
        f"cannot listen on {endpoint.listen} ({what}): {exc.strerror or exc}; "
        "use an address of this host, 0.0.0.0 for every interface, or a free port")


def check_bindable(endpoint: Endpoint, *, what: str = "listen address") -> None:
    """Raise a one-line :class:`ConfigurationError` now if ``endpoint`` cannot be bound
    (not an address of this host, or the port is taken): for servers that bind later."""
    try:
        infos = socket.getaddrinfo(endpoint.listen_host or None, endpoint.port,
                                   type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, _type, _proto, _name, sockaddr = infos[0]
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(sockaddr)
    except OSError as exc:
        raise _cannot_bind(endpoint, what, exc) from None


async def open_listeners(endpoint: Endpoint, *, what: str = "listen address"
                         ) -> tuple[list[trio.SocketListener], str]:
    """Bind ``endpoint`` (trio listeners) and return them with the address to publish; an
    address that cannot be bound is a one-line :class:`ConfigurationError`."""
    try:
        listeners = await trio.open_tcp_listeners(endpoint.port,
                                                  host=endpoint.listen_host or None)
    except OSError as exc:
        raise _cannot_bind(endpoint, what, exc) from None
    bound = listeners[0].socket.getsockname()[1]
    return listeners, endpoint.advertised(int(bound))
