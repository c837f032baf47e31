"""Shared helpers for the benchmarks: a server to run on, and a results table with ratios."""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
from collections.abc import Iterator
from typing import Any

import attrs
from rich.console import Console
from rich.table import Table

from framework.zkserver import ZooKeeperEnsemble

#: Set for a bench run with ``--quick`` and inherited by the processes it starts.
QUICK_ENV = "FRAMEWORK_BENCH_QUICK"


def quick() -> bool:
    """Whether this is a smoke run (``--quick`` on the command line, or a parent bench's):
    every size shrinks to seconds of work, so ``make test`` can run each bench and none can
    rot; the numbers of such a run mean nothing.  Read at import, before the sizes."""
    if "--quick" in sys.argv:
        os.environ[QUICK_ENV] = "1"
    return os.environ.get(QUICK_ENV) == "1"


def sized(full: int | float, small: int | float) -> Any:
    """``full``, or ``small`` in a smoke run (:func:`quick`)."""
    return small if quick() else full


@contextlib.contextmanager
def zookeeper() -> Iterator[str]:
    """``FRAMEWORK_ZK_HOSTS`` if set, else a fresh standalone server for this run."""
    hosts = os.environ.get("FRAMEWORK_ZK_HOSTS")
    if hosts:
        yield hosts
        return
    with ZooKeeperEnsemble(1) as server:
        yield server.connect_string


@attrs.frozen
class Result:
    """One workload measured both ways.  ``higher_is_better`` says how to read the ratio."""

    workload: str
    unit: str
    kazoo: float | None
    ours: float | None
    higher_is_better: bool = True
    note: str = ""

    @property
    def ratio(self) -> float | None:
        """ours / kazoo, so for throughput >1 is better; for latency <1 is better."""
        if not self.kazoo or self.ours is None:
            return None
        return self.ours / self.kazoo


def median(samples: list[float]) -> float:
    return statistics.median(samples)


def print_results(title: str, results: list[Result]) -> None:
    table = Table(title=title)
    for column in ("workload", "unit", "kazoo", "ours", "ours/kazoo", "note"):
        table.add_column(column, justify="left" if column in ("workload", "note") else "right")
    for r in results:
        ratio = r.ratio
        better = "" if ratio is None else (
            " (better)" if (ratio >= 1) == r.higher_is_better else " (worse)"
        )
        table.add_row(
            r.workload,
            r.unit,
            "-" if r.kazoo is None else f"{r.kazoo:,.1f}",
            "-" if r.ours is None else f"{r.ours:,.1f}",
            "-" if ratio is None else f"{ratio:.2f}x{better}",
            r.note,
        )
    Console(width=160).print(table)
