"""Measure the memory and CPU of each kind of process a command starts (for sizing).

    python deploy/measure.py [--also 'CMD ...'] -- COMMAND [ARG...]

Runs ``COMMAND`` (a demo, a benchmark) and, every half second until it exits, reads
``/proc`` for it and every process it started (and for the ``--also`` commands, started
alongside and stopped at the end, e.g. a dashboard polled meanwhile).  Prints one line per
kind of process (``framework run MODULE:CLASS`` by its class, ``framework dashboard``,
ZooKeeper, others by their module or program): how many there were, the peak resident
set (VmHWM) of the largest, and its CPU: seconds in all and the mean share of one core over
its life.  Linux only; nothing is sent anywhere.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field

TICKS = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


@dataclass
class Seen:
    """What was last read of one process."""

    kind: str
    start: float  # seconds since boot
    cpu: float = 0.0  # user + system seconds
    hwm_kb: int = 0
    last: float = 0.0  # seconds since boot, at the last reading


@dataclass
class Kind:
    count: int = 0
    hwm_kb: list[int] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    share: list[float] = field(default_factory=list)


def uptime() -> float:
    with open("/proc/uptime") as f:
        return float(f.read().split()[0])


def kind_of(argv: list[str]) -> str:
    """A short name for the kind of process ``argv`` is."""
    if not argv:
        return "?"
    if "org.apache.zookeeper.server.quorum.QuorumPeerMain" in argv:
        return "zookeeper (java)"
    if "framework" in argv and "run" in argv:
        for arg in argv[argv.index("run") + 1:]:
            if ":" in arg and not arg.startswith("-"):
                return f"framework run {arg.rpartition(':')[2]}"
    if "dashboard" in argv:
        return "framework dashboard"
    if "-m" in argv and argv.index("-m") + 1 < len(argv):
        return f"python -m {argv[argv.index('-m') + 1]}"
    return os.path.basename(argv[1] if len(argv) > 1 and "python" in argv[0] else argv[0])


def children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rpartition(")")[2].split()[1])
            except OSError:
                continue
            tree.setdefault(ppid, []).append(int(entry))
    return tree


def descendants(roots: list[int]) -> list[int]:
    tree = children()
    found, todo = [], list(roots)
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(tree.get(pid, []))
    return found


def read(pid: int, seen: dict[int, Seen]) -> None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
        with open(f"/proc/{pid}/status") as f:
            hwm = next((int(line.split()[1]) for line in f if line.startswith("VmHWM:")), 0)
    except (OSError, StopIteration):
        return
    now = uptime()
    if pid not in seen:
        seen[pid] = Seen(kind_of(argv), int(fields[19]) / TICKS)
    s = seen[pid]
    s.cpu = (int(fields[11]) + int(fields[12])) / TICKS
    s.hwm_kb = max(s.hwm_kb, hwm)
    s.last = now


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--also", action="append", default=[],
                        help="a command to run alongside (stopped at the end)")
    parser.add_argument("--interval", type=float, default=0.5)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to measure after --")
    seen: dict[int, Seen] = {}
    main_proc = subprocess.Popen(command)
    also = [subprocess.Popen(shlex.split(c)) for c in args.also]
    started = time.monotonic()
    try:
        while main_proc.poll() is None:
            for pid in descendants([main_proc.pid, *(p.pid for p in also)]):
                read(pid, seen)
            time.sleep(args.interval)
    finally:
        for p in also:
            p.terminate()
            p.wait()
    kinds: dict[str, Kind] = {}
    for s in seen.values():
        k = kinds.setdefault(s.kind, Kind())
        k.count += 1
        k.hwm_kb.append(s.hwm_kb)
        k.cpu.append(s.cpu)
        k.share.append(s.cpu / max(s.last - s.start, 1e-3))
    print(f"# {shlex.join(command)}: exit {main_proc.returncode}, "
          f"{time.monotonic() - started:.0f} s")
    print(f"{'kind':44} {'n':>3} {'peak RSS MiB':>13} {'CPU s':>7} {'mean cores':>11}")
    for name, k in sorted(kinds.items(), key=lambda item: -max(item[1].hwm_kb)):
        print(f"{name[:44]:44} {k.count:3} {max(k.hwm_kb) / 1024:13.0f} "
              f"{max(k.cpu):7.1f} {max(k.share):11.2f}")
    return main_proc.returncode or 0


if __name__ == "__main__":
    sys.exit(main())
