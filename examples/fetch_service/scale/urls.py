"""Canonical URLs (w3lib) and the partition that owns a URL's host.

:func:`canonical` is the de-duplication key of the partitioned crawl: w3lib's
``canonicalize_url`` (scheme and host lower-cased, ``.``/``..`` removed, escapes normalised,
the fragment dropped, query arguments sorted) plus two rules w3lib leaves out: the default
port (80/443) is dropped and only absolute ``http``/``https`` URLs with a host are accepted.
Everything else raises :class:`InvalidUrlError` with the reason.

:func:`partition_of` maps a ``host[:port]`` to one of ``P`` partitions with a stable hash
(blake2b), so every process routes a link to the same partition without asking anyone.
"""

from __future__ import annotations

import hashlib
from urllib.parse import urljoin, urlsplit, urlunsplit

from w3lib.url import canonicalize_url

from examples.fetch_service.links import InvalidUrlError

__all__ = ["InvalidUrlError", "canonical", "host_of", "partition_name", "partition_of"]

_DEFAULT_PORTS = {"http": 80, "https": 443}


def canonical(url: str, base: str | None = None) -> str:
    """The canonical absolute form of ``url`` (resolved against ``base`` when given)."""
    if not isinstance(url, str):
        raise InvalidUrlError(f"URL must be a string, got {type(url).__name__}")
    text = url.strip()
    try:
        if base is not None:
            text = urljoin(base, text)
        parts = urlsplit(text)
        scheme = parts.scheme.lower()
        if scheme not in _DEFAULT_PORTS:
            why = "not absolute (no scheme)" if not scheme else f"scheme {scheme!r} is not http(s)"
            raise InvalidUrlError(f"invalid URL {url!r}: {why}")
        if not parts.hostname:
            raise InvalidUrlError(f"invalid URL {url!r}: no host")
        port = parts.port
        result = urlsplit(canonicalize_url(text))
    except ValueError as exc:
        if isinstance(exc, InvalidUrlError):
            raise
        raise InvalidUrlError(f"invalid URL {url!r}: {exc}") from None
    host = (result.hostname or "").rstrip(".")
    if ":" in host:
        host = f"[{host}]"
    netloc = host if port in (None, _DEFAULT_PORTS[scheme]) else f"{host}:{port}"
    return urlunsplit((scheme, netloc, result.path or "/", result.query, ""))


def try_canonical(url: str, base: str | None = None) -> str | None:
    """Like :func:`canonical`, ``None`` instead of an error."""
    try:
        return canonical(url, base)
    except InvalidUrlError:
        return None


def host_of(url: str) -> str:
    """``host[:port]`` of a canonical URL: the unit of politeness and of partitioning."""
    return urlsplit(url).netloc.rpartition("@")[2]


def partition_of(host: str, partitions: int) -> int:
    """The partition (``0 .. partitions-1``) that owns ``host``; stable across processes."""
    digest = hashlib.blake2b(host.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % partitions


def partition_name(index: int) -> str:
    """The shard name of partition ``index`` (``p000``...)."""
    return f"p{index:03d}"
