"""TLS for the applications' own data links (broker client and replication links, Katta
query links), configured the way the ZooKeeper TLS is (:mod:`framework.zk.acl`).

Each application reads its settings from variables with its own prefix (``BROKER``,
``KATTA``):

=========================  =====================================================================
``<P>_TLS``                ``1`` to use TLS (implied by ``<P>_TLS_CA`` or ``<P>_TLS_CERT``)
``<P>_TLS_CA``             PEM file of the CA that signed the servers' (and clients') certificates
``<P>_TLS_CERT``           this process's certificate (PEM): required on servers; on clients when
                           the servers require one (mutual TLS)
``<P>_TLS_KEY``            its private key (PEM)
``<P>_TLS_MUTUAL``         ``1`` on servers: refuse a client without a certificate the CA signed
``<P>_TLS_VERIFY``         ``0`` to skip verifying the server's certificate (testing only)
=========================  =====================================================================

Guarantees: TLS 1.2 or later; a client verifies the server's certificate against the CA and
the name or IP it connected to (the *advertised* address must be in the certificate's
subjectAltName); with ``mutual`` a server completes a handshake only with a client that
presents a certificate the CA signed, and every other connection ends in the handshake
(the client sees :class:`trio.BrokenResourceError` in its handshake or, with TLS 1.3, on its
first read).  A setting that cannot work (a file
that is not there, a certificate without its key, a server without a certificate) is a
one-line :class:`~framework.errors.ConfigurationError` when the settings are read.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping

import attrs
import trio

from framework.envflags import env_flag
from framework.errors import ConfigurationError

__all__ = ["LinkTls", "tls_client_stream", "tls_server_stream"]




@attrs.frozen
class LinkTls:
    """TLS settings of one application's links (see the module doc)."""

    ca: str | None = None
    cert: str | None = None
    key: str | None = None
    mutual: bool = False
    verify: bool = True
    prefix: str = "TLS"  # the variables' prefix, for errors

    def __attrs_post_init__(self) -> None:
        for name in ("ca", "cert", "key"):
            path = getattr(self, name)
            if path is not None and not os.path.isfile(path):
                raise ConfigurationError(
                    f"{self.prefix}_TLS_{name.upper()}: {path!r} is not a readable file")
        if (self.cert is None) != (self.key is None):
            raise ConfigurationError(
                f"{self.prefix}_TLS_CERT and {self.prefix}_TLS_KEY go together")
        if self.mutual and self.ca is None:
            raise ConfigurationError(
                f"{self.prefix}_TLS_MUTUAL needs {self.prefix}_TLS_CA (to verify clients)")

    @classmethod
    def from_env(cls, prefix: str, environ: Mapping[str, str] | None = None) -> LinkTls | None:
        """The settings the ``<prefix>_TLS*`` variables ask for, or ``None`` (plain TCP)."""
        env = os.environ if environ is None else environ
        ca = env.get(f"{prefix}_TLS_CA") or None
        cert = env.get(f"{prefix}_TLS_CERT") or None
        if not env_flag(env, f"{prefix}_TLS", default=ca is not None or cert is not None):
            return None
        return cls(ca=ca, cert=cert, key=env.get(f"{prefix}_TLS_KEY") or None,
                   mutual=env_flag(env, f"{prefix}_TLS_MUTUAL", default=False),
                   verify=env_flag(env, f"{prefix}_TLS_VERIFY", default=True), prefix=prefix)

    def server_context(self) -> ssl.SSLContext:
        """The context a server wraps accepted connections in; a server needs a certificate
        (:class:`ConfigurationError` without one)."""
        if self.cert is None:
            raise ConfigurationError(
                f"a TLS server needs {self.prefix}_TLS_CERT and {self.prefix}_TLS_KEY")
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(self.cert, self.key)
        if self.mutual:
            assert self.ca is not None
            context.load_verify_locations(self.ca)
            context.verify_mode = ssl.CERT_REQUIRED
        return context

    def client_context(self) -> ssl.SSLContext:
        """The context a client (or a server's outgoing replication link) connects with:
        verifies the server (name or IP included) and presents our certificate if any."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        if self.verify:
            if self.ca is not None:
                context.load_verify_locations(self.ca)
            else:
                context.load_default_certs(ssl.Purpose.SERVER_AUTH)
        else:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        if self.cert is not None:
            context.load_cert_chain(self.cert, self.key)
        return context


def tls_server_stream(stream: trio.abc.Stream, context: ssl.SSLContext | None) -> trio.abc.Stream:
    """``stream`` as accepted, or wrapped in TLS (the handshake happens on first use)."""
    if context is None:
        return stream
    return trio.SSLStream(stream, context, server_side=True)


async def tls_client_stream(stream: trio.abc.Stream, context: ssl.SSLContext | None,
                        host: str) -> trio.abc.Stream:
    """``stream`` as connected, or wrapped in TLS with the handshake done (the server's
    certificate checked against ``host``); a refused handshake raises
    :class:`trio.BrokenResourceError`."""
    if context is None:
        return stream
    wrapped = trio.SSLStream(stream, context, server_hostname=host.strip("[]"))
    await wrapped.do_handshake()
    return wrapped
