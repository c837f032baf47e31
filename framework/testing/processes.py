"""Child processes for tests, demos and benchmarks: the framework's one process harness.

:func:`spawn` starts a command and yields a :class:`Child`: waiting is async (a hang ends
with the caller's ``trio.fail_after``), kill -9, SIGSTOP and SIGCONT are one call each, and
when the block ends a child still running is killed with SIGKILL and reaped.  Every child
dies with its parent (``PR_SET_PDEATHSIG`` on Linux: a crashed test run leaves no orphan),
and its output goes to a log file of its own (``log_dir/<name>.log``), or to a pipe read
line by line (:class:`Lines`).

Why not :func:`trio.lowlevel.open_process`: it forks in a worker thread, and Linux ties
``PR_SET_PDEATHSIG`` to the thread that forked, so every child would be killed when trio's
thread cache retires that thread (about ten seconds later).  The child is forked here, in
trio's own thread (a few milliseconds), and waited for through a pidfd (Linux 5.3+) with
:func:`trio.lowlevel.wait_readable`; elsewhere, by a thread that waits for it.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import IO

import attrs
import trio


def die_with_parent() -> None:
    """In the child between fork and exec: ask the kernel for SIGKILL when the parent dies.

    Linux ties this to the *thread* that forked: start children from trio's thread (the
    main thread), never from a worker thread that may end before the process does."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class Lines:
    """A child's piped output, read one decoded line at a time."""

    def __init__(self, stream: trio.abc.ReceiveStream) -> None:
        self._stream = stream
        self._buffer = b""
        self.seen: list[str] = []

    async def next(self) -> str:
        """The next line (without its newline); :class:`EOFError` once the child closed
        its output."""
        while b"\n" not in self._buffer:
            chunk = await self._stream.receive_some(65536)
            if not chunk:
                raise EOFError(f"the child's output ended; its last lines: {self.seen[-5:]}")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        text = line.decode(errors="replace")
        self.seen.append(text)
        return text

    async def until(self, done: Callable[[str], bool]) -> list[str]:
        """Read until ``done(line)``; return every line read, that one included."""
        read = []
        while True:
            line = await self.next()
            read.append(line)
            if done(line):
                return read

    async def rest(self) -> list[str]:
        """Every line until the child closes its output (its exit, usually); a last line
        without a newline is included."""
        read = []
        while True:
            try:
                read.append(await self.next())
            except EOFError:
                break
        if self._buffer:
            read.append(self._buffer.decode(errors="replace"))
            self.seen.append(read[-1])
            self._buffer = b""
        return read


@attrs.define(eq=False)
class Child:
    """One running child process (see :func:`spawn`)."""

    name: str
    process: subprocess.Popen[bytes]
    log_path: Path | None = None
    lines: Lines | None = None
    _pidfd: int | None = None
    #: the child's stdin (``pipe_stdin``) and stdout (``pipe_stdout``) as trio streams
    stdin: trio.lowlevel.FdStream | None = None
    stdout: trio.lowlevel.FdStream | None = None

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def returncode(self) -> int | None:
        return self.process.returncode

    @property
    def running(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        """kill -9 (nothing if it has exited already)."""
        self._signal(signal.SIGKILL)

    def terminate(self) -> None:
        self._signal(signal.SIGTERM)

    def pause(self) -> None:
        """SIGSTOP: every thread of the child stops where it is (a GC pause, a migration)."""
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal(signal.SIGCONT)

    async def wait(self) -> int:
        """Wait for the child to exit (cancellable); its exit code."""
        while self.process.poll() is None:
            if self._pidfd is not None:
                await trio.lowlevel.wait_readable(self._pidfd)
            else:
                await trio.to_thread.run_sync(self.process.wait, abandon_on_cancel=True)
        assert self.process.returncode is not None
        return self.process.returncode

    def log(self) -> str:
        """What the child wrote to its log so far ('' without a log file)."""
        if self.log_path is None or not self.log_path.exists():
            return ""
        return self.log_path.read_text(errors="replace")

    def _signal(self, signum: int) -> None:
        if self.running:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signum)

    def _close(self) -> None:
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None


@asynccontextmanager
async def spawn(
    argv: Sequence[str | os.PathLike[str]],
    *,
    name: str | None = None,
    log_dir: str | os.PathLike[str] | None = None,
    pipe_stdout: bool = False,
    pipe_stdin: bool = False,
    env: Mapping[str, str | None] | None = None,
    cwd: str | os.PathLike[str] | None = None,
) -> AsyncIterator[Child]:
    """Run ``argv`` for the duration of the block; kill -9 and reap it at the end.

    Output: with ``pipe_stdout`` the child's stdout is read through ``child.lines`` (or
    ``child.stdout``; stderr goes to the log file, or is inherited); with ``log_dir`` stdout
    and stderr go to ``log_dir/<name>.log``; otherwise both are inherited.  ``pipe_stdin``:
    write to the child through ``child.stdin``.  ``env`` is added to this
    process's environment; a ``None`` value removes that variable (the child does not
    inherit it).  Call it from trio's thread (see the module doc)."""
    name = name or Path(str(argv[0])).name
    log_path: Path | None = None
    log_file: IO[bytes] | None = None
    if log_dir is not None:
        Path(log_dir).mkdir(parents=True, exist_ok=True)
        log_path = Path(log_dir) / f"{name}.log"
        log_file = log_path.open("ab")
    environ = {k: v for k, v in {**os.environ, **(env or {})}.items() if v is not None}
    linux = sys.platform.startswith("linux")
    try:
        process = subprocess.Popen(
            [str(a) for a in argv], env=environ, cwd=cwd,
            stdin=subprocess.PIPE if pipe_stdin else None,
            stdout=subprocess.PIPE if pipe_stdout else log_file, stderr=log_file,
            preexec_fn=die_with_parent if linux else None)
    finally:
        if log_file is not None:
            log_file.close()  # the child holds its own descriptor
    pidfd: int | None = None
    if hasattr(os, "pidfd_open"):
        with contextlib.suppress(OSError):
            pidfd = os.pidfd_open(process.pid)
    child = Child(name, process, log_path, None, pidfd)
    if process.stdout is not None:
        child.stdout = trio.lowlevel.FdStream(os.dup(process.stdout.fileno()))
        process.stdout.close()
        child.lines = Lines(child.stdout)
    if process.stdin is not None:
        child.stdin = trio.lowlevel.FdStream(os.dup(process.stdin.fileno()))
        process.stdin.close()
    try:
        yield child
    finally:
        child.kill()
        with trio.CancelScope(shield=True):
            await child.wait()
            for stream in (child.stdin, child.stdout):
                if stream is not None:
                    await stream.aclose()
        child._close()


def python_argv(script: str | os.PathLike[str], *args: object) -> list[str]:
    """``[python, script, *args]`` with this interpreter."""
    return [sys.executable, str(script), *(str(a) for a in args)]
