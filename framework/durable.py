"""Files that survive a machine crash: the one place the framework and its applications
write them.

:func:`write_durably` writes a whole file so that after a crash the target holds either its
old content or the new one, never a mix (write a temporary file beside it, fsync it, rename
it over the target, fsync the directory).  :func:`fsync_dir` makes a directory's entries
(a rename, a new or deleted file) durable.
"""

from __future__ import annotations

import os
from pathlib import Path


def fsync_dir(directory: str | os.PathLike[str]) -> None:
    """Flush ``directory``'s entries to disk (raises :class:`OSError` as ``os.fsync``)."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_durably(target: str | os.PathLike[str], data: bytes) -> None:
    """Replace ``target`` with ``data`` atomically and durably (see the module doc)."""
    target = Path(target)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(target.parent)
