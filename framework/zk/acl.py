"""Security settings of a :class:`~framework.zk.Session`: who it is, what it creates, how it
connects.

* **Credentials** (``user:password``): sent as ZooKeeper ``digest`` authentication on every
  connection of the session, before any request of ours.
* **ACL policy** of every znode the session creates (``Session.create``, ``ensure_path``,
  transactions, the chroot itself):

  - ``"open"``: ``world:anyone`` may do everything (ZooKeeper's ``OPEN_ACL_UNSAFE``; the
    default without credentials).
  - ``"creator"``: only the credentials' ``digest`` identity may read, write, create, delete
    and change ACLs (the default with credentials).
  - ``"creator-read"``: the same, plus ``world:anyone`` may read (read-only viewers such as a
    dashboard or ``framework status`` need no credentials).

* **TLS**: connect to the servers' secure client port, verifying them with a CA bundle.

Each setting is a keyword argument of ``Session``; left out, it comes from the environment, so
every framework process (the CLI, masters, workers, the dashboard) picks it up unchanged:

=============================  ====================================================
``FRAMEWORK_ZK_AUTH``          ``user:password`` (digest credentials)
``FRAMEWORK_ZK_ACL``           ``open``, ``creator`` or ``creator-read``
``FRAMEWORK_ZK_TLS``           ``1`` to connect with TLS (implied by ``..._TLS_CA``)
``FRAMEWORK_ZK_TLS_CA``        PEM file of the CA (or self-signed certificate) to trust
``FRAMEWORK_ZK_TLS_CERT``      client certificate (PEM), for servers that require one
``FRAMEWORK_ZK_TLS_KEY``       its private key (PEM)
``FRAMEWORK_ZK_TLS_VERIFY``    ``0`` to skip verifying the server (testing only)
=============================  ====================================================
"""

from __future__ import annotations

import os
import ssl
from typing import Any, Mapping

import attrs
from kazoo.security import (
    ACL,
    OPEN_ACL_UNSAFE,
    Id,
    Permissions,
    make_digest_acl_credential,
)

from framework.envflags import env_flag
from framework.errors import ConfigurationError

ACL_POLICIES = ("open", "creator", "creator-read")

ENV_AUTH = "FRAMEWORK_ZK_AUTH"
ENV_ACL = "FRAMEWORK_ZK_ACL"
ENV_TLS = "FRAMEWORK_ZK_TLS"
ENV_TLS_CA = "FRAMEWORK_ZK_TLS_CA"
ENV_TLS_CERT = "FRAMEWORK_ZK_TLS_CERT"
ENV_TLS_KEY = "FRAMEWORK_ZK_TLS_KEY"
ENV_TLS_VERIFY = "FRAMEWORK_ZK_TLS_VERIFY"


class _FromEnv:
    """The default of a security keyword: take the setting from the environment."""

    def __repr__(self) -> str:
        return "FROM_ENV"


FROM_ENV: Any = _FromEnv()



@attrs.frozen
class TlsConfig:
    """How to connect with TLS.  ``ca``: PEM file of the certificate authority (or the
    server's self-signed certificate) to verify servers with (``None``: the system's CAs);
    ``certfile``/``keyfile``: a client certificate, for servers with ``ssl.clientAuth=need``;
    ``verify=False`` accepts any server certificate (testing only);
    ``check_hostname`` also checks the server's name against its certificate."""

    ca: str | None = None
    certfile: str | None = None
    keyfile: str | None = None
    verify: bool = True
    check_hostname: bool = False

    def __attrs_post_init__(self) -> None:
        for name in ("ca", "certfile", "keyfile"):
            path = getattr(self, name)
            if path is not None and not os.path.isfile(path):
                raise ConfigurationError(f"TLS {name} {path!r} is not a readable file")
        if (self.certfile is None) != (self.keyfile is None):
            raise ConfigurationError("a TLS client certificate needs both certfile and keyfile")
        if self.check_hostname and not self.verify:
            raise ConfigurationError("check_hostname needs verify=True")

    def ssl_context(self) -> ssl.SSLContext:
        """The client context of these settings (TLS 1.2 or later)."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_default_certs(ssl.Purpose.SERVER_AUTH)
        context.check_hostname = self.check_hostname
        context.verify_mode = ssl.CERT_REQUIRED if self.verify else ssl.CERT_NONE
        if self.ca is not None:
            context.load_verify_locations(self.ca)
        if self.certfile is not None:
            context.load_cert_chain(self.certfile, self.keyfile)
        return context


@attrs.frozen
class Security:
    """The resolved security settings of one session (see the module's doc)."""

    credentials: tuple[str, str] | None = None
    policy: str = "open"
    tls: TlsConfig | None = None

    def __attrs_post_init__(self) -> None:
        if self.policy not in ACL_POLICIES:
            raise ConfigurationError(
                f"unknown ACL policy {self.policy!r}: expected one of {', '.join(ACL_POLICIES)}"
            )
        if self.policy != "open" and self.credentials is None:
            raise ConfigurationError(
                f"ACL policy {self.policy!r} needs credentials: pass auth='user:password' or "
                f"set {ENV_AUTH}"
            )

    @property
    def user(self) -> str | None:
        return None if self.credentials is None else self.credentials[0]

    def acl(self) -> list[ACL]:
        """The ACL every znode this session creates gets."""
        if self.policy == "open" or self.credentials is None:
            return list(OPEN_ACL_UNSAFE)
        user, password = self.credentials
        acl = [ACL(Permissions.ALL, Id("digest", make_digest_acl_credential(user, password)))]
        if self.policy == "creator-read":
            acl.append(ACL(Permissions.READ, Id("world", "anyone")))
        return acl

    def auth_data(self) -> list[tuple[str, str]]:
        """``(scheme, credential)`` pairs sent on every (re)connection before any request."""
        if self.credentials is None:
            return []
        return [("digest", ":".join(self.credentials))]

    def describe(self) -> dict[str, Any]:
        """For logs: never the password."""
        return {"user": self.user, "acl": self.policy, "tls": self.tls is not None}


def parse_credentials(text: str | tuple[str, str]) -> tuple[str, str]:
    """``"user:password"`` (or a ``(user, password)`` pair) checked and split."""
    if isinstance(text, tuple):
        if len(text) != 2 or not all(isinstance(part, str) for part in text):
            raise ConfigurationError("credentials must be a (user, password) pair of strings")
        user, password = text
    elif isinstance(text, str):
        user, sep, password = text.partition(":")
        if not sep:
            raise ConfigurationError(
                "ZooKeeper credentials must be 'user:password' (no ':' found)"
            )
    else:
        raise ConfigurationError(f"credentials must be 'user:password', got {type(text).__name__}")
    if not user or not password:
        raise ConfigurationError("ZooKeeper credentials need a non-empty user and password")
    if ":" in user:
        raise ConfigurationError("a ZooKeeper digest user name cannot contain ':'")
    return user, password



def tls_from_env(environ: Mapping[str, str] | None = None) -> TlsConfig | None:
    """The TLS settings the ``FRAMEWORK_ZK_TLS*`` variables ask for, or ``None``."""
    env = os.environ if environ is None else environ
    ca = env.get(ENV_TLS_CA) or None
    if not env_flag(env, ENV_TLS, default=ca is not None):
        return None
    return TlsConfig(
        ca=ca,
        certfile=env.get(ENV_TLS_CERT) or None,
        keyfile=env.get(ENV_TLS_KEY) or None,
        verify=env_flag(env, ENV_TLS_VERIFY, default=True),
    )


def resolve_security(
    auth: Any = FROM_ENV,
    acl: Any = FROM_ENV,
    tls: Any = FROM_ENV,
    environ: Mapping[str, str] | None = None,
) -> Security:
    """Settings from the keywords, each left at :data:`FROM_ENV` taken from the environment.

    ``auth``: ``"user:password"``, a pair, or ``None`` (no credentials).  ``acl``: one of
    :data:`ACL_POLICIES`, or ``None`` (``"creator"`` with credentials, else ``"open"``).
    ``tls``: a :class:`TlsConfig`, ``True`` (system CAs), or ``None``/``False`` (plain TCP).
    """
    env = os.environ if environ is None else environ
    if auth is FROM_ENV:
        auth = env.get(ENV_AUTH) or None
    credentials = None if auth is None else parse_credentials(auth)
    if acl is FROM_ENV:
        acl = (env.get(ENV_ACL) or "").strip().lower() or None
    if acl is None:
        acl = "creator" if credentials is not None else "open"
    if tls is FROM_ENV:
        tls = tls_from_env(env)
    elif tls is True:
        tls = TlsConfig()
    elif tls is False:
        tls = None
    if tls is not None and not isinstance(tls, TlsConfig):
        raise ConfigurationError(f"tls must be a TlsConfig, True or None, got {tls!r}")
    return Security(credentials=credentials, policy=acl, tls=tls)
