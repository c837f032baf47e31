"""Herd-effect audits for tests: who watches what on the server, and whose watches fire.

A recipe is herd-free when a change wakes only the one client that must act on it.  Tests
prove it with two kinds of evidence: the server's own table of data/exists watches (the
``wchp`` four-letter command, which must be whitelisted -
:class:`framework.zkserver.ZooKeeperEnsemble` does) and a count of the watch callbacks that
actually fire in each session.  ``wchp`` does not list *children* watches (checked on
ZooKeeper 3.8), so only the fire count catches a herd of children watches.
"""

from __future__ import annotations

from typing import Any

import trio

from framework.zk import Session


def count_watch_fires(session: Session, fired: list[int], index: int) -> None:
    """From now on, add one to ``fired[index]`` whenever a watch of ``session`` fires."""
    make = session.waker

    def counting_waker(event: trio.Event) -> Any:
        wake = make(event)

        def fire(*args: object) -> None:
            fired[index] += 1
            wake(*args)

        return fire

    session.waker = counting_waker  # type: ignore[method-assign]


def watchers_by_path(wchp: str, prefix: str) -> dict[str, set[str]]:
    """Parse ``wchp`` output into ``{watched path: {session ids}}`` for paths under
    ``prefix``."""
    table: dict[str, set[str]] = {}
    current = None
    for line in wchp.splitlines():
        if line.startswith("\t"):
            if current is not None:
                table[current].add(line.strip())
        elif line.strip():
            current = line.strip() if line.strip().startswith(prefix) else None
            if current is not None:
                table.setdefault(current, set())
    return table
