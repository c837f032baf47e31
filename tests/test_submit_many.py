"""put_many across buckets (the first batch into a bucket opens it) and submit_many under a
crash: nothing acknowledged is lost, order holds, a bucket never holds more than its size."""

from __future__ import annotations

import sys
from typing import Any, Sequence

import pytest
import trio

from framework import Session
from framework.primitives.queue import WorkQueue
from framework.primitives.queue import producer as queue_producer
from framework.primitives.queue.view import bucket_index, is_bucket, parse_item
from framework.runtime import App
from framework.runtime.results import result_index
from framework.runtime.submission import Submitter
from framework.runtime.tasks import Task
from framework.testing import spawn
from framework.zk import Transaction, gather, watch_children
from tests.test_queue import Interfere, is_put

BUCKET = 50
PER_CALL = 600

SUBMITTER = f"""
import sys, trio
from framework import Session
from framework.primitives.queue import WorkQueue
from framework.runtime import App
from framework.runtime.results import result_index
from framework.runtime.submission import Submitter

async def main(hosts, chroot):
    async with Session(hosts, chroot=chroot, session_timeout=2.0) as s:
        app = App("crash")
        submitter = Submitter(s, app, WorkQueue(s, app.tasks, bucket_size={BUCKET}))
        for call in range(1000):
            payloads = [{{"call": call, "n": n}} for n in range({PER_CALL})]
            tasks = await submitter.submit_many("handle", payloads)
            print("ACK", call, " ".join(t.id for t in tasks), flush=True)

trio.run(main, sys.argv[1], sys.argv[2])
"""


async def queued(session: Session, items_root: str) -> list[tuple[str, bytes]]:
    """(bucket, data) of every queued item of lane 0, in the order consumers take them."""
    names: list[tuple[str, str]] = []
    buckets = sorted((b for b in await session.children(items_root) if is_bucket(b)),
                     key=bucket_index)
    for bucket in buckets:
        entries = [parse_item(bucket, n) for n in await session.children(f"{items_root}/{bucket}")]
        names += [(bucket, e.node) for e in sorted(entries, key=lambda e: e.seq)
                  if e is not None]
    data: dict[int, bytes] = {}

    async def read(k: int) -> None:
        data[k] = (await session.get(f"{items_root}/{names[k][0]}/{names[k][1]}"))[0]

    for chunk in range(0, len(names), 200):
        await gather(*[lambda k=k: read(k)
                       for k in range(chunk, min(chunk + 200, len(names)))])
    return [(bucket, data[k]) for k, (bucket, _name) in enumerate(names)]


def bucket_counts(items: list[tuple[str, bytes]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for bucket, _data in items:
        counts[bucket] = counts.get(bucket, 0) + 1
    return counts


async def test_a_crash_mid_submit_many_loses_nothing_acknowledged(
    zk_hosts: str, chroot: str, session: Session, tmp_path: Any
) -> None:
    """A submitter killed with kill -9 in the middle of a submit_many (a new bucket of that
    call seen, its other batches in flight): every task of the calls that returned is queued
    once, in order; of the interrupted call a prefix at most; its chain node goes with its
    session; a new submitter goes on after them; no bucket holds more than its size."""
    app = App("crash")
    items_root = f"{app.tasks}/items"
    acked: list[str] = []
    async with spawn([sys.executable, "-c", SUBMITTER, zk_hosts, chroot], name="submitter",
                     log_dir=tmp_path, pipe_stdout=True) as child:
        assert child.lines is not None
        with trio.fail_after(60):
            for call in range(3):
                _ack, number, *ids = (await child.lines.next()).split()
                assert int(number) == call and len(ids) == PER_CALL
                acked += ids
            # the fourth call under way: a bucket past the acknowledged ones is there
            async for snap in watch_children(session, items_root):
                if len(snap.children) > 3 * PER_CALL // BUCKET + 1:
                    break
        child.kill()
        await child.wait()

    with trio.fail_after(30):  # the chain node is ephemeral: gone with the session
        async for snap in watch_children(session, f"{app.tasks}/puts"):
            if not snap.children:
                break
    items = await queued(session, items_root)
    tasks = [Task.decode(data) for _bucket, data in items]
    ids = [t.id for t in tasks]
    assert ids[:len(acked)] == acked  # every acknowledged task, once, in order
    rest = [(t.payload["call"], t.payload["n"]) for t in tasks[len(acked):]]
    assert rest == [(3, n) for n in range(len(rest))]  # the interrupted call: a prefix
    assert len(set(ids)) == len(ids)
    assert max(bucket_counts(items).values()) <= BUCKET

    submitter = Submitter(session, app, WorkQueue(session, app.tasks, bucket_size=BUCKET))
    more = await submitter.submit_many("handle", [{"call": 9, "n": n} for n in range(120)])
    after = await queued(session, items_root)
    assert [Task.decode(d).id for _b, d in after] == ids + [t.id for t in more]
    assert max(bucket_counts(after).values()) <= BUCKET


async def test_put_many_opens_the_buckets_it_needs_in_its_batches(
    session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    """95 items into buckets of 10: one multi per bucket (each opening its bucket), no
    other write, no listing; consumers take them in order."""
    requests: list[str] = []
    commit, children = Transaction.commit, Session.children

    async def counted_commit(txn: Transaction) -> list[Any]:
        requests.append("multi")
        return await commit(txn)

    async def counted_children(s: Session, path: str, **kwargs: Any) -> list[str]:
        requests.append(f"children {path}")
        return await children(s, path, **kwargs)

    q = WorkQueue(session, "/q", bucket_size=10)
    await q.put(b"first")  # the queue set up, its first bucket known
    monkeypatch.setattr(Transaction, "commit", counted_commit)
    monkeypatch.setattr(Session, "children", counted_children)
    payloads = [b"%02d" % i for i in range(95)]
    names = await q.put_many(payloads)
    monkeypatch.undo()
    assert requests == ["multi"] * 10  # 9 items into the first bucket, then 9 buckets
    items = await queued(session, "/q/items")
    assert [d for _b, d in items] == [b"first", *payloads]
    assert list(bucket_counts(items).values()) == [10] * 9 + [6]
    assert [n.split("/")[0] for n in names] == [b for b, _d in items[1:]]


async def test_a_bucket_another_producer_opened_first(session: Session) -> None:
    """A producer that would open a bucket another producer opened meanwhile goes on in
    the newest bucket: nothing lost or doubled, each producer's items in order, no bucket
    over its size."""
    a = WorkQueue(session, "/q", bucket_size=5)
    b = WorkQueue(session, "/q", bucket_size=5)
    await a.put_many([b"a0", b"a1", b"a2"])
    await b.put_many([b"b%d" % i for i in range(10)])  # fills b-0, opens b-1 and b-2
    mine = [b"x%d" % i for i in range(12)]
    await a.put_many(mine)  # a still takes b-0 to have room, and b-1 to be unopened
    items = [d for _b, d in await queued(session, "/q/items")]
    assert sorted(items) == sorted([b"a0", b"a1", b"a2", *(b"b%d" % i for i in range(10)),
                                    *mine])
    assert [d for d in items if d.startswith(b"x")] == mine
    assert [d for d in items if d.startswith(b"b")] == [b"b%d" % i for i in range(10)]
    assert max(bucket_counts(await queued(session, "/q/items")).values()) <= 5


def opens_bucket(ops: Sequence[Any]) -> bool:
    """A put whose multi opens a bucket (a plain create of ``items/b-...``)."""
    return is_put(ops) and any(op[0] == "create" and not op[2].get("sequence")
                               and "/items/b-" in op[1][0] for op in ops)


@pytest.mark.parametrize("action", ["lost", "reply lost"])
async def test_a_lost_batch_that_opens_a_bucket(
    session: Session, monkeypatch: pytest.MonkeyPatch, action: str
) -> None:
    """The request (or the reply) of a batch that opens a bucket is lost while the batches
    after it are in flight: nothing doubled or lost, order and names hold."""
    monkeypatch.setattr(queue_producer, "_BATCH_OPS", 3)
    interfere = Interfere(monkeypatch)
    q = WorkQueue(session, "/q", bucket_size=4)
    interfere.arm(opens_bucket, action, skip=1)  # the second bucket opened
    payloads = [b"m%02d" % i for i in range(14)]
    names = await q.put_many(payloads)
    assert all(rule.left == 0 for rule in interfere.rules)
    items = await queued(session, "/q/items")
    assert [d for _b, d in items] == payloads
    assert max(bucket_counts(items).values()) <= 4
    assert [n.split("/")[0] for n in names] == [b for b, _d in items]
    assert await session.children("/q/puts") == []


async def test_keyed_submit_many_marks_every_key(
    session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fresh keys get their pending markers in multis (one refused for a missing
    ``pending/<hh>`` is sent again once those exist); keys submitted again are appended to
    in multis: each marker names both items, both queued."""
    app = App("keys")
    submitter = Submitter(session, app, WorkQueue(session, app.tasks))
    one_by_one: list[str] = []
    in_multis: list[str] = []
    append, append_many = result_index._append, result_index._append_many

    async def counted(s: Session, a: App, key: str, name: str, **kwargs: Any) -> None:
        one_by_one.append(key)
        await append(s, a, key, name, **kwargs)

    async def counted_many(s: Session, a: App, marks: list[tuple[str, str]]
                           ) -> list[tuple[str, str]]:
        in_multis.extend(key for key, _name in marks)
        return await append_many(s, a, marks)

    monkeypatch.setattr(result_index, "_append", counted)
    monkeypatch.setattr(result_index, "_append_many", counted_many)
    keys = [f"k{n}" for n in range(450)]
    await submitter.submit_many("handle", [{"n": n} for n in range(450)], keys=keys)
    assert one_by_one == in_multis == []  # every marker created in a multi
    await submitter.submit_many("handle", [{"n": n} for n in range(450)], keys=keys)
    assert one_by_one == [] and sorted(in_multis) == sorted(keys)
    marks: dict[str, tuple[str, ...]] = {}

    async def read(key: str) -> None:
        path = app.pending_path(key)
        marks[key] = result_index.read_mark((await session.get(path))[0], path).items

    await gather(*[lambda k=k: read(k) for k in keys])
    assert all(len(items) == 2 for items in marks.values())
    named = {name for items in marks.values() for name in items}
    assert len(named) == 900
    assert set(await result_index.still_queued(session, app, sorted(named))) == named


async def test_put_many_of_large_items_stays_under_the_request_limit(
    session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Items near the queue's limit go a few to a multi (data and operations within the
    byte budget): none of the requests is refused as too large."""
    sizes: list[int] = []
    commit = Transaction.commit

    async def measured(txn: Transaction) -> list[Any]:
        sizes.append(sum(len(op[1][1]) for op in txn.operations if op[0] == "create"))
        return await commit(txn)

    monkeypatch.setattr(Transaction, "commit", measured)
    q = WorkQueue(session, "/q", bucket_size=100)
    payloads = [b"%02d" % i + b"x" * 60_000 for i in range(30)]
    await q.put_many(payloads)
    assert len(sizes) >= 4 and max(sizes) <= queue_producer._BATCH_BYTES
    assert [d for _b, d in await queued(session, "/q/items")] == payloads
