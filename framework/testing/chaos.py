"""The long fault run (``make chaos``): a queue and a lock under a schedule of faults.

A 3-node ZooKeeper ensemble, worker processes that take items and contend for a lock while
recording their history (``tests/helpers/history_worker.py``), a producer at a steady rate,
and every ``--every`` seconds the next fault of the schedule: kill -9 of a worker (a
replacement joins), kill -9 of the ZooKeeper leader, of a follower (each restarted after
``--down`` seconds).  At the end the queue is drained, the history checked
(:mod:`framework.testing.history`) and a timeline drawn: acknowledgements per 0.25 s with
the fault moments marked, the way the ZooKeeper paper's Figure 8 shows failures.

Run: ``python -m framework.testing.chaos [--duration 120] [--out out/chaos]``; exit status
0 only when the checker finds no violation.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import trio

from framework.testing.history import (
    ROOT,
    Event,
    HistoryWorkers,
    Recorder,
    Report,
    check,
    load,
    now_ns,
    put_recorded,
    wait_drained,
)

SCHEDULE = ("kill -9 worker", "kill ZooKeeper leader", "kill ZooKeeper follower")


async def run(duration: float, every: float, down: float, rate: float, workers: int,
              out: Path) -> Report:
    from framework import Session, WorkQueue, ZooKeeperEnsemble

    history_dir = out / "history"
    for old in history_dir.glob("*.jsonl"):
        old.unlink()
    history = Recorder(history_dir, "driver")
    started = now_ns()
    with ZooKeeperEnsemble(3) as ensemble:
        hosts = ensemble.connect_string
        try:
            async with HistoryWorkers(hosts, "/chaos", history_dir, history) as procs:
                for i in range(workers):
                    await procs.start(f"w{i}")
                async with Session(hosts, chroot="/chaos") as session:
                    queue = WorkQueue(session, "/q")
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(_faults, ensemble, history, procs, duration, every,
                                           down)
                        await _produce(session, queue, history, duration, rate)
                        nursery.cancel_scope.cancel()
                    print("producer done; draining the queue", flush=True)
                    await wait_drained(queue)
                    remaining = [item.data.decode() for item in await queue.dead_letters()]
        finally:
            history.close()
    events = load(history_dir)
    report = check(events, remaining=remaining)
    _plot(events, started, out / "timeline.png")
    (out / "summary.json").write_text(json.dumps({
        "put": report.put, "acked": report.acked, "deliveries": report.deliveries,
        "duplicates": report.duplicates, "acked_twice": len(report.acked_twice),
        "lost": len(report.lost), "lock_overlaps": len(report.overlaps),
        "faults": report.faults, "ok": report.ok,
    }, indent=2))
    return report


async def _produce(session: object, queue: object, history: Recorder, duration: float,
                   rate: float) -> None:
    from framework import WorkQueue

    assert isinstance(queue, WorkQueue)
    deadline = trio.current_time() + duration
    n = 0
    next_at = trio.current_time()
    while trio.current_time() < deadline:
        await put_recorded(queue, history, f"item-{n}")
        n += 1
        next_at += 1.0 / rate
        await trio.sleep_until(next_at)  # the producer's rate, not synchronisation


async def _faults(ensemble: object, history: Recorder, procs: HistoryWorkers,
                  duration: float, every: float, down: float) -> None:
    from framework import ZooKeeperEnsemble

    assert isinstance(ensemble, ZooKeeperEnsemble)
    deadline = trio.current_time() + duration - every / 2
    step = 0
    while True:
        await trio.sleep(every)  # the fault schedule's pace
        if trio.current_time() > deadline:
            return
        kind = SCHEDULE[step % len(SCHEDULE)]
        step += 1
        if kind == "kill -9 worker":
            victim = procs.running()[0]
            await procs.kill(victim)
            print(f"fault: kill -9 {victim}", flush=True)
            await procs.start(f"w{len(procs.children)}")
            continue
        leader = ensemble.leader()
        if leader is None:
            continue
        sid = leader if kind == "kill ZooKeeper leader" else next(
            s for s in ensemble.modes() if s != leader)
        history.record("fault", f"zk{sid}-{'leader' if sid == leader else 'follower'}")
        await trio.to_thread.run_sync(ensemble.kill, sid)
        print(f"fault: {kind} (server {sid}), back in {down:g}s", flush=True)
        await trio.sleep(down)
        await trio.to_thread.run_sync(ensemble.restart, sid)


def _plot(events: list[Event], started: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bin_ns = 250_000_000
    acks = [e.at for e in events if e.kind == "ack"]
    locks = [e.at for e in events if e.kind == "acquire"]
    end = max(acks + locks + [started + bin_ns])
    bins = int((end - started) // bin_ns) + 1
    ack_rate = [0.0] * bins
    lock_rate = [0.0] * bins
    for at in acks:
        ack_rate[(at - started) // bin_ns] += 4  # per second
    for at in locks:
        lock_rate[(at - started) // bin_ns] += 4
    xs = [i * 0.25 for i in range(bins)]
    fig, ax = plt.subplots(figsize=(11, 4.5), dpi=110)
    ax.plot(xs, ack_rate, label="queue acks/s", color="#1f77b4", linewidth=1.2)
    ax.plot(xs, lock_rate, label="lock acquisitions/s", color="#2ca02c", linewidth=1.0)
    for e in events:
        if e.kind != "fault" or e.process != "driver":
            continue
        x = (e.at - started) / 1e9
        if x > xs[-1] - 1:
            continue  # the final clean-up kills
        label = e.key if e.key.startswith("zk") else f"kill -9 {e.key}"
        ax.axvline(x, color="#d62728", linestyle="--", linewidth=0.9)
        ax.text(x, ax.get_ylim()[1] * 0.97, label, rotation=90, va="top", ha="right",
                fontsize=8, color="#d62728")
    ax.set_xlabel("seconds since start")
    ax.set_ylabel("operations per second (0.25 s bins)")
    ax.set_title("Work queue and lock under faults (3-node ZooKeeper, worker processes)")
    ax.legend(loc="lower right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text!r}")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m framework.testing.chaos",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=_positive, default=120.0, help="seconds of load")
    parser.add_argument("--every", type=_positive, default=12.0, help="seconds between faults")
    parser.add_argument("--down", type=_positive, default=3.0,
                        help="seconds a killed ZooKeeper member stays down")
    parser.add_argument("--rate", type=_positive, default=150.0, help="items put per second")
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "out" / "chaos")
    args = parser.parse_args(argv)
    if args.workers < 1:
        parser.error("--workers must be at least 1")
    print(f"chaos: {args.duration:g}s of load, a fault every {args.every:g}s "
          f"({', '.join(SCHEDULE)}), {args.workers} workers", flush=True)
    report = trio.run(run, args.duration, args.every, args.down, args.rate, args.workers,
                      args.out)
    print(report.summary())
    print(f"timeline: {args.out / 'timeline.png'}; summary: {args.out / 'summary.json'}")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
