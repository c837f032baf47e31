"""Where the runtime's time goes: py-spy on one worker and on the master under load.

Run: ``.venv/bin/python -m bench.profile [--out DIR] [--tasks N] [--workload W]`` (or
``make profile``; ``--help``).

``--workload runtime`` (the default) runs :mod:`bench.runtime`'s throughput workload - a
fresh ZooKeeper, 4 worker processes of 4 slots each, a master submitting ``--tasks`` trivial
tasks (``submit_many``, 500 a call) and waiting until all are done - while ``py-spy record``
samples worker ``w0`` (from before the master starts) and the master (from its start; the
samples of its start-up imports are left out), until the master prints its elapsed time.

``--workload submit-many``: the master alone submitting ``--tasks`` (default 100,000)
tasks, 5,000 a call (the benchmark's backlog row), sampled from its start until it prints
``SUBMITTED``; also the ZooKeeper requests it cost per task.

For each process it prints the busy share (active samples over the samples a fully busy
thread would give in the same wall time: threads add up, so above 100% means two threads
were busy at once) and the top frames by function, self time (the frame was running) and
total time (the frame was on the stack), as shares of the process's active samples; py-spy
leaves idle threads out (a thread waiting in ``epoll`` or on a lock is not counted).  It
writes, under ``--out`` (default ``/tmp/framework-profile``): ``<process>.txt`` (py-spy's
collapsed stacks, one ``frame;frame;... count`` a line), ``<process>.svg`` (a flame graph of
them) and ``top.txt`` (what it printed).

py-spy reads the target's memory (``process_vm_readv``) and, without ``--nonblocking``,
stops it with ``ptrace``: it needs root, ``CAP_SYS_PTRACE``, or
``kernel.yama.ptrace_scope = 0`` for a child of the same user.  Samples are taken with
``--nonblocking`` (the target never paused: the numbers are not skewed by the profiler,
an occasional stack may be torn).  py-spy counts a thread as active when the kernel has it
running or runnable: on a loaded machine a thread woken in ``poll`` and waiting for a core
counts there, so each profile also gives the CPU seconds the process used (``/proc``).  A
py-spy that cannot attach stops the run with its error and this hint.
"""

from __future__ import annotations

import argparse
import colorsys
import hashlib
import html
import signal
import subprocess
import sys
import time
from collections import Counter
from contextlib import AsyncExitStack
from pathlib import Path

import attrs
import trio

from bench.common import zookeeper
from bench.runtime import (
    LOGS,
    cpu_seconds,
    framework_run,
    lines,
    server_counters,
    start_workers,
)
from framework import configure_logging
from framework.testing import Child, spawn

PY_SPY = Path(sys.executable).parent / "py-spy"
DEFAULT_OUT = Path("/tmp/framework-profile")
RATE = 100  # samples per second
TOP = 15
RUNTIME_TASKS = 12_000  # about 15 s of the 4 x 4 workload on 2 shared cores
SUBMIT_TASKS = 100_000
IMPORT_FRAME = "_find_and_load ("  # a stack through it is the process importing modules
PERMISSION_HINT = (
    "py-spy needs to read the target's memory: run as root, or give py-spy CAP_SYS_PTRACE "
    "(setcap cap_sys_ptrace+ep .venv/bin/py-spy), or set kernel.yama.ptrace_scope to 0")


@attrs.frozen
class Frame:
    """One function's share of a profile: ``own`` samples it was running, ``total`` samples
    it was on the stack (counted once per sample, even when recursive)."""

    name: str
    own: int
    total: int


@attrs.frozen
class Profile:
    """The collapsed stacks py-spy recorded of one process over ``seconds`` of wall time."""

    process: str
    stacks: dict[tuple[str, ...], int]
    seconds: float
    rate: int
    imports: int = 0  # samples left out: the process importing its modules as it started
    cpu: float | None = None  # CPU seconds the process used meanwhile (/proc), if known

    @property
    def samples(self) -> int:
        return sum(self.stacks.values())

    @property
    def busy(self) -> float:
        """Active samples over those of one thread busy the whole time (threads add up)."""
        return self.samples / max(1.0, self.seconds * self.rate)

    def top(self, count: int, *, by: str = "own") -> list[Frame]:
        """The ``count`` functions with the most ``own`` (or ``total``) samples; by total,
        the process's entry frames (ENTRY_FRAMES: on every stack of their thread) are left
        out."""
        own: Counter[str] = Counter()
        total: Counter[str] = Counter()
        for stack, n in self.stacks.items():
            own[stack[-1]] += n
            for name in set(stack):
                total[name] += n
        ranked = own if by == "own" else Counter(
            {name: n for name, n in total.items() if not is_entry(name)})
        return [Frame(name, own[name], total[name]) for name, _ in ranked.most_common(count)]

    def threads(self) -> dict[str, int]:
        """Samples of the main thread (trio's) and of the other threads (kazoo's connection
        thread, trio's worker threads)."""
        split: Counter[str] = Counter()
        for stack, n in self.stacks.items():
            split["other threads" if stack[0].startswith("Thread._bootstrap ") else "main"] += n
        return dict(split)

    def areas(self) -> list[tuple[str, int]]:
        """Self samples by where the code lives (:func:`area_of`), most first."""
        by: Counter[str] = Counter()
        for stack, n in self.stacks.items():
            by[area_of(stack[-1])] += n
        return by.most_common()


#: Entry frames, on every stack of their thread: left out of the ranking by total time.
ENTRY_FRAMES = ("<frozen runpy>", "(threading.py:", "(framework/cli/", "(framework/__main__.py:",
                "run_component (framework/runtime/launch/runner.py:", "(kazoo/retry.py:")


def is_entry(frame: str) -> bool:
    return any(mark in frame for mark in ENTRY_FRAMES)


def area_of(frame: str) -> str:
    """Where a frame's code lives: ``framework/<package>``, ``bench``, or the top-level
    module or package of a library (``kazoo``, ``trio``, ``json``, ``threading``...)."""
    file = frame.rpartition(" (")[2].rsplit(":", 1)[0]
    parts = file.split("/")
    if parts[0] == "framework" and len(parts) > 2:
        return "/".join(parts[:2])
    if file.startswith("<attrs generated") or file.startswith("<cattrs generated"):
        return "attrs/cattrs (generated)"
    return parts[0].removesuffix(".py")


def parse_collapsed(text: str) -> tuple[dict[tuple[str, ...], int], int]:
    """py-spy's ``--format raw`` output (``frame;frame;... count`` per line, root first):
    the stacks, and the samples left out for being imports (the process starting)."""
    stacks: Counter[tuple[str, ...]] = Counter()
    imports = 0
    for line in text.splitlines():
        stack, _, count = line.rstrip().rpartition(" ")
        if not stack or not count.isdigit():
            continue
        if IMPORT_FRAME in stack:
            imports += int(count)
        else:
            stacks[tuple(stack.split(";"))] += int(count)
    return dict(stacks), imports


@attrs.define(eq=False)
class _Node:
    name: str
    count: int = 0
    children: dict[str, _Node] = attrs.Factory(dict)


def flame_svg(profile: Profile, width: int = 1400, row: int = 17) -> str:
    """A static flame graph of ``profile`` (root at the bottom; hover for the counts)."""
    root = _Node(f"all ({profile.process})")
    depth = 0
    for stack, n in profile.stacks.items():
        node = root
        node.count += n
        for name in stack:
            node = node.children.setdefault(name, _Node(name))
            node.count += n
        depth = max(depth, len(stack))
    height = (depth + 2) * row + 30
    scale = (width - 20) / max(1, root.count)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="monospace" font-size="11">',
           f'<text x="10" y="18" font-size="14">{html.escape(_title(profile))}</text>']

    def draw(node: _Node, x: float, level: int) -> None:
        w = node.count * scale
        if w < 0.3:
            return
        y = height - (level + 1) * row
        share = 100 * node.count / max(1, root.count)
        label = html.escape(f"{node.name}: {node.count} samples, {share:.1f}%")
        text = html.escape(_fit(node.name, w))
        out.append(f'<g><title>{label}</title><rect x="{x:.1f}" y="{y}" width="{w:.1f}" '
                   f'height="{row - 1}" fill="{_colour(node.name)}"/>'
                   + (f'<text x="{x + 3:.1f}" y="{y + row - 5}">{text}</text>' if text else "")
                   + "</g>")
        for child in sorted(node.children.values(), key=lambda c: c.name):
            draw(child, x, level + 1)
            x += child.count * scale

    draw(root, 10.0, 0)
    out.append("</svg>")
    return "\n".join(out)


def _title(profile: Profile) -> str:
    return (f"{profile.process}: {profile.samples} active samples over {profile.seconds:.1f} s "
            f"at {profile.rate} Hz (busy {100 * profile.busy:.0f}% of one thread; "
            f"{profile.imports} samples of start-up imports left out)"
            + ("" if profile.cpu is None else
               f"; {profile.cpu:.1f} CPU s ({100 * profile.cpu / profile.seconds:.0f}% of a core)"))


def _fit(name: str, width: float) -> str:
    chars = int(width / 6.6) - 1
    if chars < 3:
        return ""
    return name if len(name) <= chars else name[:chars - 2] + ".."


def _colour(name: str) -> str:
    digest = hashlib.md5(name.encode()).digest()
    hue = 0.0 + 0.12 * digest[0] / 255  # reds to yellows, like flamegraph.pl
    r, g, b = colorsys.hls_to_rgb(hue, 0.6 + 0.15 * digest[1] / 255, 0.8)
    return f"rgb({int(255 * r)},{int(255 * g)},{int(255 * b)})"


def report(profile: Profile, count: int) -> str:
    """The threads' and areas' shares, and the top ``count`` functions by self time and by
    total time (entry frames left out), as text: shares of the active samples."""
    n = max(1, profile.samples)
    threads = ", ".join(f"{name} {100 * k / n:.0f}%" for name, k in profile.threads().items())
    areas = ", ".join(f"{name} {100 * k / n:.0f}%" for name, k in profile.areas()[:10])
    rows = [_title(profile), f"  threads: {threads}", f"  self time by area: {areas}"]
    for by, what in (("own", "self time"), ("total", "total time (entry frames left out)")):
        rows += [f"  top {count} by {what}:", "   self%  total%  function"]
        rows += [f"  {100 * f.own / n:6.1f}  {100 * f.total / n:6.1f}  {f.name}"
                 for f in profile.top(count, by=by)]
    return "\n".join(rows)


async def check_py_spy(out: Path) -> None:
    """``py-spy dump`` of a Python child started for it: SystemExit with py-spy's error and
    the hint if py-spy cannot read it."""
    if not PY_SPY.exists():
        raise SystemExit(f"{PY_SPY} is missing: .venv/bin/python -m pip install py-spy")
    async with spawn([sys.executable, "-c", "import time; print('ready', flush=True); "
                      "time.sleep(60)"], name="py-spy-check", log_dir=out,
                     pipe_stdout=True) as target:
        assert target.lines is not None
        with trio.fail_after(30):
            await target.lines.next()
        done = await trio.to_thread.run_sync(lambda: subprocess.run(
            [str(PY_SPY), "dump", "--pid", str(target.pid), "--nonblocking"],
            capture_output=True, text=True, timeout=30))
    if done.returncode != 0:
        first = (done.stderr or done.stdout).strip().splitlines()[:1]
        raise SystemExit(f"py-spy could not read a Python process: {first}\n{PERMISSION_HINT}")


@attrs.define(eq=False)
class Recorder:
    """One ``py-spy record`` of a process, until :meth:`stop` (or the process's exit)."""

    process: str
    child: Child
    path: Path
    rate: int
    pid: int
    started: float
    cpu: float | None
    used: float | None = None  # CPU seconds from start to mark_end
    seconds: float = 0.0  # wall time from start to mark_end

    @classmethod
    async def start(cls, stack: AsyncExitStack, process: str, pid: int, out: Path,
                    rate: int) -> Recorder:
        path = out / f"{process}.txt"
        path.unlink(missing_ok=True)
        child = await stack.enter_async_context(spawn(
            [PY_SPY, "record", "--pid", str(pid), "--format", "raw", "--function",
             "--nonblocking", "--rate", str(rate), "--output", path],
            name=f"py-spy-{process}", log_dir=out))
        return cls(process, child, path, rate, pid, time.monotonic(), cpu_seconds(pid))

    def mark_end(self) -> None:
        """The end of the window (the CPU the process used until now, while it still lives)."""
        now = cpu_seconds(self.pid)
        if self.cpu is not None and now is not None:
            self.used = now - self.cpu
        self.seconds = time.monotonic() - self.started

    async def stop(self) -> Profile:
        """SIGINT (py-spy writes what it has and exits), then the profile it wrote."""
        if not self.seconds:
            self.mark_end()
        seconds = self.seconds
        if self.child.running:
            self.child.process.send_signal(signal.SIGINT)
        with trio.fail_after(30):
            code = await self.child.wait()
        if not self.path.exists():
            raise SystemExit(f"py-spy of {self.process} wrote nothing (exit {code}): "
                             f"{self.child.log()[-2000:]}")
        stacks, imports = parse_collapsed(self.path.read_text())
        return Profile(self.process, stacks, seconds, self.rate, imports, self.used)


async def profile_runtime(hosts: str, tasks: int, out: Path, rate: int) -> list[Profile]:
    """The 4 x 4 throughput workload; profiles of worker ``w0`` and of the master."""
    chroot = f"/bench-prof-{time.time_ns()}"
    async with AsyncExitStack() as stack:
        workers = await start_workers(stack, hosts, chroot, 4)
        worker = await Recorder.start(stack, "worker", workers[0].pid, out, rate)
        master = await framework_run(stack, hosts, chroot, "BenchMaster", "m",
                                     BENCH_TASKS=str(tasks))
        # from its first instruction: it submits as soon as it is elected
        recorders = [worker, await Recorder.start(stack, "master", master.pid, out, rate)]
        with trio.fail_after(600):
            elapsed = await lines(master).until(lambda line: line.startswith("ELAPSED"))
        for recorder in recorders:
            recorder.mark_end()
        print(f"{tasks:,} tasks, 4 workers x 4 slots: {elapsed[-1].split()[1]} s "
              f"({tasks / float(elapsed[-1].split()[1]):,.0f} tasks/s while profiled)")
        return [await r.stop() for r in recorders]


async def profile_submit_many(hosts: str, tasks: int, out: Path, rate: int) -> list[Profile]:
    """The master alone submitting ``tasks`` (5,000 a call); its profile."""
    chroot = f"/bench-prof-sm-{time.time_ns()}"
    async with AsyncExitStack() as stack:
        before = server_counters(hosts)
        master = await framework_run(stack, hosts, chroot, "BenchMaster", "m",
                                     BENCH_TASKS=str(tasks), BENCH_MODE="backlog")
        recorder = await Recorder.start(stack, "master", master.pid, out, rate)
        with trio.fail_after(600):
            line = await lines(master).until(lambda line: line.startswith("SUBMITTED"))
        recorder.mark_end()
        seconds = float(line[-1].split()[1])
        requests, writes = (a - b for a, b in zip(server_counters(hosts), before, strict=True))
        print(f"submit_many of {tasks:,}: {seconds:.2f} s ({tasks / seconds:,.0f} tasks/s); "
              f"{requests / tasks:.4f} requests and {writes / tasks:.4f} write transactions a "
              "task (the whole master, its start included)")
        return [await recorder.stop()]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Profile one worker and the master under the runtime benchmark's load "
                    "with py-spy (see the module's docstring).")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT,
                        help=f"where the stacks and flame graphs go (default {DEFAULT_OUT})")
    parser.add_argument("--workload", choices=("runtime", "submit-many"), default="runtime",
                        help="runtime: 4 workers x 4 slots and the master (default); "
                             "submit-many: the master submitting alone")
    parser.add_argument("--tasks", type=int, default=None,
                        help=f"tasks to run (default {RUNTIME_TASKS:,}; submit-many "
                             f"{SUBMIT_TASKS:,})")
    parser.add_argument("--rate", type=int, default=RATE, help="samples per second")
    parser.add_argument("--top", type=int, default=TOP, help="functions listed per ranking")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    configure_logging(level="warning")
    for old in [*LOGS.glob("*.log"), *args.out.glob("py-spy-*.log")]:  # this run's only
        old.unlink()
    trio.run(check_py_spy, args.out)
    with zookeeper() as hosts:
        if args.workload == "runtime":
            profiles = trio.run(profile_runtime, hosts, args.tasks or RUNTIME_TASKS, args.out,
                                args.rate)
        else:
            profiles = trio.run(profile_submit_many, hosts, args.tasks or SUBMIT_TASKS,
                                args.out, args.rate)
    text = "\n\n".join(report(p, args.top) for p in profiles)
    for profile in profiles:
        (args.out / f"{profile.process}.svg").write_text(flame_svg(profile))
    (args.out / "top.txt").write_text(text + "\n")
    print(text)
    print(f"\nstacks, flame graphs and top.txt in {args.out}")


if __name__ == "__main__":
    main()
