"""Every benchmark in ``bench/`` run at a toy size (``--quick``, ``--smoke`` or small
arguments), so that a bench cannot rot between the runs of ``make bench``: each must exit 0
and print its table.  Nothing is measured here (the numbers of such runs mean nothing).

Each bench is a real process starting its own ZooKeeper (and its own workers, masters and
sites); they run a few at a time, since most of their time is spent waiting (sessions
expiring after a kill -9, processes starting), the longest first.  The peers of
``bench/runtime.py`` (Dramatiq, Celery, RQ) need the optional ``bench`` extra: without it
the bench says in one line that it skips them (``tests/test_bench_peers.py`` runs them when
installed); with it, its own rows (``--no-peers``) and the peers' rows (``--peers``) run as
two processes at once, the way a user can run them, since together they are the longest
bench.  ``bench/profile.py`` needs py-spy.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import trio

from bench import peers

ROOT = Path(__file__).resolve().parent.parent

#: (name, arguments after ``bench/<name>.py``, a text its output must hold), the longest
#: first (the order they start in)
BENCHES: list[tuple[str, list[str], str]] = [
    *([("runtime", ["--quick"], "master/worker runtime vs kazoo recipes")]
      if peers.missing() is not None else
      [("runtime", ["--quick", "--peers"], "ours vs Dramatiq, Celery and RQ"),
       ("runtime", ["--quick", "--no-peers"], "master/worker runtime vs kazoo recipes")]),
    ("primitives", ["--quick"], "semaphore and counter"),
    ("scale", ["--quick"], "master_rss_growth_between"),
    ("crawl", ["--smoke"], "ZooKeeper writes per 1,000 pages"),
    ("bridge", ["--quick"], "Session vs plain kazoo"),
    ("katta", ["--docs", "300", "--queries", "20", "--rounds", "1"], "master kill -9"),
    ("broker", ["--messages", "300"], "failover after kill -9 of a primary"),
    ("profile", ["--tasks", "200"], "flame graphs"),
]

#: Benches run at once (most of their time is waiting, on 2 cores).
AT_ONCE = 3


def test_every_bench_is_covered() -> None:
    """A new bench (a script with a ``main``) is added to :data:`BENCHES`."""
    scripts = {p.stem for p in (ROOT / "bench").glob("*.py")
               if "def main(" in p.read_text() and not p.stem.startswith("primitives_")}
    assert scripts == {name for name, _args, _text in BENCHES}


async def test_every_bench_runs_at_a_small_size(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "FRAMEWORK_ZK_HOSTS"}
    env["PYTHONPATH"] = str(ROOT)
    have_py_spy = (Path(sys.executable).parent / "py-spy").exists() or shutil.which("py-spy")
    failed: list[str] = []
    limit = trio.CapacityLimiter(AT_ONCE)

    async def run(name: str, args: list[str], text: str) -> None:
        if name == "profile" and not have_py_spy:
            return
        if name == "profile":
            args = [*args, "--out", str(tmp_path / "profile")]
        if name == "crawl":
            args = [*args, "--out", str(tmp_path / "crawl")]
        async with limit:
            done = await trio.run_process(
                [sys.executable, str(ROOT / "bench" / f"{name}.py"), *args], cwd=ROOT,
                env=env, capture_stdout=True, capture_stderr=True, check=False)
        out, err = done.stdout.decode(errors="replace"), done.stderr.decode(errors="replace")
        if name == "runtime" and peers.missing() is not None and (
                "the rows against Dramatiq, Celery and RQ are skipped: " not in err):
            failed.append("bench/runtime.py did not say that it skips its peers")
        if done.returncode != 0 or text not in out:
            failed.append(f"bench/{name}.py {' '.join(args)}: exit {done.returncode}, "
                          f"{text!r} {'in' if text in out else 'not in'} its output\n"
                          f"{out[-2000:]}\n{err[-3000:]}")

    with trio.fail_after(600):  # a hang guard only
        async with trio.open_nursery() as nursery:
            for name, args, text in BENCHES:
                nursery.start_soon(run, name, args, text)
    assert not failed, "\n\n".join(failed)
