"""The process harness itself (:mod:`framework.testing.processes`): piped lines both ways,
kill -9 and the exit code, the log file, the child's environment, and a child that dies with
its parent."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest
import trio

from framework.testing import python_argv, spawn

ROOT = Path(__file__).parent.parent

ECHO = """
import sys
for line in sys.stdin:
    print(line.strip().upper(), flush=True)
sys.stdout.write("tail")
"""

PARENT = """
import trio
from framework.testing import python_argv, spawn

async def main():
    async with spawn(python_argv("-c", "import time; time.sleep(600)")) as child:
        print(child.pid, flush=True)
        await trio.sleep_forever()

trio.run(main)
"""


async def test_lines_through_stdin_and_stdout_until_the_end() -> None:
    """``rest`` reads every line up to the end of the output, a last one without its
    newline included; ``seen`` keeps every line read."""
    async with spawn(python_argv("-c", ECHO), pipe_stdin=True, pipe_stdout=True) as child:
        assert child.stdin is not None and child.lines is not None
        with trio.fail_after(20):
            await child.stdin.send_all(b"one\n")
            assert await child.lines.next() == "ONE"
            await child.stdin.send_all(b"two\nthree\n")
            await child.stdin.aclose()
            assert await child.lines.rest() == ["TWO", "THREE", "tail"]
            assert await child.wait() == 0
            assert await child.lines.rest() == []
    assert child.lines.seen == ["ONE", "TWO", "THREE", "tail"]


async def test_kill_9_and_the_log_file(tmp_path: Path) -> None:
    """stdout and stderr go to ``<log_dir>/<name>.log``; kill -9 ends a child with
    -SIGKILL; the end of the block kills and reaps a child still running."""
    script = "import sys; print('out', flush=True); print('err', file=sys.stderr)"
    async with spawn(python_argv("-c", script), name="c1", log_dir=tmp_path) as child:
        with trio.fail_after(20):
            assert await child.wait() == 0
    assert child.log_path == tmp_path / "c1.log" and child.log().split() == ["out", "err"]
    async with spawn(python_argv("-c", "import time; time.sleep(600)"), name="c2") as child:
        with trio.fail_after(20):
            assert child.running
            child.kill()
            assert await child.wait() == -signal.SIGKILL
    async with spawn(python_argv("-c", "import time; time.sleep(600)"), name="c3") as left:
        pass
    assert left.returncode == -signal.SIGKILL and not left.running


async def test_env_adds_to_and_removes_from_the_environment(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``env`` is added to this process's environment; a ``None`` value removes a variable
    the child would otherwise inherit."""
    monkeypatch.setenv("HARNESS_KEPT", "kept")
    monkeypatch.setenv("HARNESS_GONE", "here")
    script = ("import os; print([os.environ.get(k) for k in "
              "('HARNESS_KEPT', 'HARNESS_GONE', 'HARNESS_NEW')])")
    async with spawn(python_argv("-c", script), pipe_stdout=True,
                     env={"HARNESS_GONE": None, "HARNESS_NEW": "new"}) as child:
        assert child.lines is not None
        with trio.fail_after(20):
            assert await child.lines.rest() == ["['kept', None, 'new']"]
            assert await child.wait() == 0


@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="pidfd_open: Linux 5.3+")
async def test_a_child_dies_with_its_parent() -> None:
    """kill -9 of a process that started a child through the harness: the kernel kills the
    child too (nobody is left to reap or kill it)."""
    async with spawn([sys.executable, "-c", PARENT], pipe_stdout=True, cwd=ROOT,
                     env={"PYTHONPATH": str(ROOT)}) as parent:
        assert parent.lines is not None
        with trio.fail_after(20):
            grandchild = int(await parent.lines.next())
            pidfd = os.pidfd_open(grandchild)
            try:
                parent.kill()
                await parent.wait()
                await trio.lowlevel.wait_readable(pidfd)  # readable once the process ended
            finally:
                os.close(pidfd)
