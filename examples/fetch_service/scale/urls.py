"""The partition that owns a URL's host.

:func:`partition_of` maps a ``host[:port]`` (:func:`examples.fetch_service.links.host_key`
of a canonical URL) to one of ``P`` partitions with a stable hash (blake2b), so every process
routes a link to the same partition without asking anyone.
"""

from __future__ import annotations

import hashlib

__all__ = ["partition_name", "partition_of"]


def partition_of(host: str, partitions: int) -> int:
    """The partition (``0 .. partitions-1``) that owns ``host``; stable across processes."""
    digest = hashlib.blake2b(host.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % partitions


def partition_name(index: int) -> str:
    """The shard name of partition ``index`` (``p000``...)."""
    return f"p{index:03d}"
