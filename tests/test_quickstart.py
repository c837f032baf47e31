"""README's quick start, run as printed.

The master/worker snippet and its commands are read out of README.md itself (the blocks
after the ``<!-- quickstart: ... -->`` markers), the snippet is saved where its first line
says, ZooKeeper is started with the README's ``framework zk`` line and the commands are run
from that directory, each line as a shell would (``export``, ``&``).  The one liberty taken:
port 2181 becomes a free port, as other servers may hold 2181 on a shared machine.

Run a second time with ``FRAMEWORK_ZK_AUTH``/``FRAMEWORK_ZK_ACL=creator-read`` set for the
masters and workers only: the same commands work unchanged, a viewer without credentials
still follows the job, and cannot change what the application created.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from pathlib import Path

import pytest
import trio

from framework import errors
from framework.runtime import App
from framework.testing import Child, spawn
from framework.zk import Session
from framework.zkserver import free_ports

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent  # the venv's bin: `source .venv/bin/activate`


def readme_block(marker: str) -> str:
    """The fenced block right after ``<!-- quickstart: marker -->`` in README.md."""
    text = (ROOT / "README.md").read_text()
    found = re.search(
        rf"<!-- quickstart: {re.escape(marker)} -->\s*```\w*\n(.*?)\n```", text, re.S
    )
    assert found, f"README.md has no block marked <!-- quickstart: {marker} -->"
    return found.group(1)


def commands(block: str, port: int) -> list[tuple[list[str], bool]]:
    """Each line of a shell block as ``(argv, in_background)``, 2181 replaced by ``port``."""
    lines = []
    for line in block.replace("2181", str(port)).splitlines():
        argv = shlex.split(line, comments=True)
        if not argv:
            continue
        background = argv[-1] == "&"
        lines.append((argv[:-1] if background else argv, background))
    return lines


def test_readme_blocks_are_found() -> None:
    snippet = readme_block("myapp/jobs.py")
    assert snippet.splitlines()[0] == "# myapp/jobs.py"
    zk = [argv for argv, _ in commands(readme_block("zookeeper"), 1) if argv[:2] == [
        "framework", "zk"]]
    assert len(zk) == 1
    runs = [argv for argv, bg in commands(readme_block("commands"), 1) if bg]
    assert sum(argv[:2] == ["framework", "run"] for argv in runs) >= 2


@pytest.mark.parametrize("acl", ["open", "creator-read"])
async def test_quickstart_runs_as_printed(tmp_path: Path, acl: str) -> None:
    snippet = readme_block("myapp/jobs.py")
    target = tmp_path / snippet.splitlines()[0].removeprefix("# ")
    target.parent.mkdir(parents=True)
    target.write_text(snippet + "\n")
    port = free_ports(1)[0]
    # added to this process's environment; None: not inherited (nothing of the test
    # session's own setup leaks in)
    env: dict[str, str | None] = {"PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
                                  "FRAMEWORK_LOG_LEVEL": "warning"}
    for name in os.environ:
        if name.startswith("FRAMEWORK_ZK_") or name == "PYTHONPATH":
            env[name] = None
    viewer_env = dict(env)  # `framework status` runs without credentials
    if acl != "open":
        env |= {"FRAMEWORK_ZK_AUTH": "thumbs:s3cret", "FRAMEWORK_ZK_ACL": acl}
    logs = tmp_path / "logs"

    def run(argv: list[str], name: str, environ: dict[str, str | None],
            **kwargs: bool) -> AbstractAsyncContextManager[Child]:
        """``argv`` as the README's shell runs it, from its directory; its output in
        ``logs/<name>.log`` (stdout piped with ``pipe_stdout``)."""
        return spawn(argv, name=name, log_dir=logs, cwd=tmp_path, env=environ, **kwargs)

    with trio.fail_after(120):
        async with AsyncExitStack() as procs:
            # ZooKeeper "in a terminal of its own", as the README starts it
            [zk_argv] = [argv for argv, _ in commands(readme_block("zookeeper"), port)
                         if argv[:2] == ["framework", "zk"]]
            zk = await procs.enter_async_context(run(zk_argv, "zk", env, pipe_stdout=True))
            assert zk.lines is not None
            await zk.lines.until(lambda line: "serving at" in line)

            background: list[tuple[list[str], Child]] = []
            for n, (argv, in_background) in enumerate(commands(readme_block("commands"), port)):
                if argv[0] == "export":
                    for assignment in argv[1:]:
                        name, _, value = assignment.partition("=")
                        env[name] = viewer_env[name] = value
                    continue
                assert argv[0] == "framework", f"the test does not know how to run {argv}"
                if in_background:
                    background.append((argv, await procs.enter_async_context(
                        run(argv, str(n), env))))
                else:
                    async with run(argv, str(n), viewer_env) as once:
                        returncode = await once.wait()
                    output = once.log()  # stdout and stderr
                    assert returncode in (0, 1), output  # 1: the app is not there yet
                    assert "Traceback" not in output, output

            # the job finishes: watch its status (ZooKeeper watches) until the master
            # records it
            app = "thumbnails"
            status: dict = {}
            async with run(["framework", "status", app, "--watch", "--json", "--interval",
                            "0.1"], "watch", viewer_env, pipe_stdout=True) as watch:
                assert watch.lines is not None
                while status.get("state") != "done":
                    line = await watch.lines.next()  # EOFError: it exited
                    if line.strip():
                        status = json.loads(line)
            assert status["results"] >= 1001  # the resizes, the delayed final report and
            # the periodic reports the leader fired meanwhile
            async with Session(f"127.0.0.1:{port}", auth=None) as viewer:
                final = await viewer.get(App(app).result_path("final-report"))
                fired = await viewer.children(f"/apps/{app}/schedules")
            assert b'"outcome":"succeeded"' in final[0] and fired == ["report-every-2s"]
            assert status["failures"] == [] and status["dead_letters"] == 0
            if acl != "open":
                async with Session(f"127.0.0.1:{port}", auth=None) as anonymous:
                    with pytest.raises(errors.NoAuthError):
                        await anonymous.delete(f"/apps/{app}/done")
                    with pytest.raises(errors.NoAuthError):
                        await anonymous.set(f"/apps/{app}", b"")

            # both masters exit once the job is recorded; workers stop on SIGTERM
            masters = [p for argv, p in background if argv[-1].endswith(":Boss")]
            workers = [p for argv, p in background if p not in masters]
            assert len(masters) == 2 and workers
            for proc in masters:
                assert await proc.wait() == 0
            for proc in workers:
                proc.terminate()
            for proc in workers:
                assert await proc.wait() == 0
            zk.terminate()
            assert await zk.wait() == 0
