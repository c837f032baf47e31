"""The README's recipes tour runs as printed, twice in a row on the same ZooKeeper."""

from __future__ import annotations

import re
from pathlib import Path

import trio

from framework import Session

README = Path(__file__).parent.parent / "README.md"


def tour_source() -> str:
    """The ``tour`` snippet of README.md's "The recipes" section, verbatim."""
    section = README.read_text().split("## The recipes", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match is not None and "async def tour" in match.group(1)
    return match.group(1)


async def test_the_recipes_tour_runs_twice_as_printed(zk_hosts: str, chroot: str,
                                                     capsys) -> None:
    namespace: dict[str, object] = {}
    exec(compile(tour_source(), str(README), "exec"), namespace)  # the README's own code
    with trio.fail_after(60):
        for _ in range(2):
            async with Session(zk_hosts, chroot=chroot) as zk:
                await namespace["tour"](zk)  # type: ignore[operator]
    printed = capsys.readouterr().out.splitlines()
    # the queue keeps what the first run left: the second run takes job-2, in order
    assert [line for line in printed if line.startswith("b'")] == ["b'job-1'", "b'job-2'"]
    assert sum("ABORTED" in line for line in printed) == 2, printed
