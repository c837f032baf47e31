"""Znode path and payload validation, done before a request leaves the process."""

from __future__ import annotations

import functools
import posixpath
import re

from framework.errors import ConfigurationError, DataTooLargeError, InvalidPathError

#: ZooKeeper's default ``jute.maxbuffer`` is 0xfffff bytes for a whole packet; leave room for
#: the path and the packet header so a payload that passes here is accepted by the server.
MAX_DATA_BYTES = 0xFFFFF - 8 * 1024
#: Largest request we send (the server's jute.maxbuffer, 0xFFFFF, less a safety margin):
#: a multi's operations together must fit, or the server drops the connection.
MAX_REQUEST_BYTES = 0xFFFFF - 1024


def validate_path(path: str, *, allow_root: bool = True) -> str:
    """Return ``path`` if ZooKeeper would accept it, else raise :class:`InvalidPathError`."""
    if isinstance(path, str) and path != "/":
        return _validate_cached(path)
    return _validate(path, allow_root)


@functools.lru_cache(maxsize=8192)
def _validate_cached(path: str) -> str:
    return _validate(path, True)


def _validate(path: str, allow_root: bool) -> str:
    if not isinstance(path, str):
        raise InvalidPathError(f"znode path must be a str, got {type(path).__name__}")
    if not path.startswith("/"):
        raise InvalidPathError(f"znode path must be absolute (start with '/'): {path!r}")
    if path == "/":
        if allow_root:
            return path
        raise InvalidPathError("the root '/' is not allowed here")
    if path.endswith("/"):
        raise InvalidPathError(f"znode path must not end with '/': {path!r}")
    for part in path[1:].split("/"):
        problem = _component_problem(part)
        if problem:
            raise InvalidPathError(f"znode path has {problem}: {path!r}")
    return path


#: What ZooKeeper refuses in a path: NUL and the surrogate/private-use range it reserves.
_FORBIDDEN = re.compile("[\x00\ud800-\uf8ff]")


def _component_problem(part: str) -> str | None:
    """What makes ``part`` unusable as one znode name, or None: ZooKeeper's own rules."""
    if part == "":
        return "an empty component"
    if part in (".", ".."):
        return f"a relative component {part!r}"
    if _FORBIDDEN.search(part):
        return "a forbidden character"
    return None


def validate_component(kind: str, value: object) -> str:
    """Any single znode name ZooKeeper accepts (no ``/``, not ``.``/``..``, no NUL or
    reserved characters), for names users choose freely (group members, configuration
    fields); :class:`ConfigurationError` naming ``kind`` otherwise.  Names the framework
    builds paths from use the stricter :func:`validate_name`."""
    if not isinstance(value, str):
        raise ConfigurationError(f"invalid {kind} {value!r}: a name must be a str")
    problem = "a '/'" if "/" in value else _component_problem(value)
    if problem:
        raise ConfigurationError(f"invalid {kind} {value!r}: it has {problem}")
    return value


def validate_data(data: bytes, *, limit: int = MAX_DATA_BYTES) -> bytes:
    """Return ``data`` if it is bytes within ``limit``, else raise a clear error."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise DataTooLargeError(
            f"znode data must be bytes, got {type(data).__name__} (encode it first)"
        )
    if len(data) > limit:
        raise DataTooLargeError(
            f"znode data is {len(data):,} bytes; ZooKeeper accepts at most {limit:,} "
            "(keep payloads small and store large blobs elsewhere)"
        )
    return bytes(data)


def join(*parts: str) -> str:
    """Join path components: ``join('/app', 'tasks', 'x') == '/app/tasks/x'``."""
    return posixpath.join(*parts)


def basename(path: str) -> str:
    """The last component of ``path``."""
    return path.rsplit("/", 1)[-1]


def parent(path: str) -> str:
    """The parent of ``path`` (``'/'`` for a top-level node)."""
    head = path.rsplit("/", 1)[0]
    return head or "/"


_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")
_NAME_NO_DASH = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.]{0,99}")


def validate_name(kind: str, value: object, *, dashes: bool = True) -> str:
    """A name that becomes (part of) one znode name: 1-100 letters, digits, ``_``, ``.``
    (and ``-`` unless ``dashes=False``, for names embedded between ``-`` separators),
    starting with a letter or digit; :class:`ConfigurationError` naming ``kind`` otherwise.
    The one name validator of the framework."""
    pattern = _NAME if dashes else _NAME_NO_DASH
    if not isinstance(value, str) or not pattern.fullmatch(value):
        allowed = "letters, digits, '_', '.'" + (" or '-'" if dashes else "")
        raise ConfigurationError(
            f"invalid {kind} {value!r}: use 1-100 {allowed}, starting with a letter or digit"
        )
    return value
