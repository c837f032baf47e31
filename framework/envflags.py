"""Boolean settings from the environment, read one way everywhere (ZooKeeper's TLS, the
applications' link TLS): ``1/true/yes/on`` or ``0/false/no/off`` (empty), anything else a
one-line :class:`~framework.errors.ConfigurationError` naming the variable."""

from __future__ import annotations

from collections.abc import Mapping

from framework.errors import ConfigurationError

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")


def env_flag(env: Mapping[str, str], name: str, default: bool) -> bool:
    """The boolean ``env[name]``, or ``default`` when it is not set."""
    value = env.get(name)
    if value is None:
        return default
    if value.strip().lower() in _TRUE:
        return True
    if value.strip().lower() in _FALSE:
        return False
    raise ConfigurationError(f"{name}={value!r}: expected 1 or 0")
