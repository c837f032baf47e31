"""A topic's primary term: appends, the replication high watermark, the in-sync set.

One :class:`PrimaryTopic` lives exactly as long as the server provably holds the topic's
``primary`` znode (the server's topic scope creates it and closes it in ``finally``).

Guarantees:

* A produce is acknowledged only when every record of its batch is at or below the high
  watermark ``hw``: on this log *and* on every backup in the in-sync set (their fetch asked
  for an offset past it), or - ``one_copy`` mode only - after the primary has written an
  in-sync set of just itself to ZooKeeper with a conditional set.
* Right before an acknowledgement the session that owns the primary znode must still be
  trusted (``Session.ensure_trusted``, synchronous): a connection SUSPENDED past the trust
  deadline, a LOST session or a pause of this process ends the term instead
  (``broker.primary_untrusted``).  After :meth:`PrimaryTopic.close` nothing is acknowledged
  or delivered: every waiter gets ``not_primary``.
* A fetch carries the epoch its backup follows (the ``czxid`` of the primary znode); another
  epoch is refused (``stale_epoch``).  One claiming a *newer* epoch ends the term only if
  ZooKeeper (a ``sync`` and a read) says the znode is gone or another node
  (``broker.deposed_by_fetch``); otherwise nothing changes (``broker.newer_epoch_refused``;
  one check at a time, at most one per second per term).
* A fetch names the backup's *copy* of the log.  A new copy from a server supersedes its
  earlier one at once: the server leaves the in-sync set (in ZooKeeper first) and must catch
  up again; fetches of a superseded copy are refused (``stale_copy``).
* A term starts with ``hw`` at the offset known to be on every in-sync replica
  (``committed``), not at its own log end; a backup joins the in-sync set (in ZooKeeper
  first) only once its fetch reached both ``hw`` and the log end this term started with
  (``start_end``).  So a backup counted in sync holds every acknowledged record of every
  term.  ``hw`` only grows.
* Lag limit: a counted backup that has not been caught up (its fetch at the log end, or at
  the end it was shown at its previous fetch) for ``lag_limit`` seconds is removed from the
  in-sync set, in ZooKeeper first; so a hung backup holds acknowledgements back for at most
  ``lag_limit``.  Time this process itself did not run is not counted against the backups.
  A backup no longer in the topic's placement is removed too, and its fetches are refused
  (``not_placed``).  Placed backups that were dropped, or are silent and behind for half the
  limit, are listed in :attr:`PrimaryTopic.dropped` (the server reports them; the controller
  places a replacement).
* A change of the in-sync set is a conditional set of ``isr`` with the version this term
  holds: if another term wrote it (a takeover), or it cannot be read as a record, the term
  ends (``not_primary``); if ZooKeeper cannot be reached, ``hw`` stands still until the
  write succeeds.

Raises :class:`RequestError` (sent back as an error reply), never anything else for a
request's content.  Why these rules (Kafka's leader-epoch start offset and
``replica.lag.time.max.ms``, the double failure they prevent) is in docs/architecture.md,
"Message broker".
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable
from typing import NamedTuple

import attrs
import trio

from examples.message_broker.layout import Isr, Mode, decode, decode_replicas
from examples.message_broker.log import Record, TopicLog
from examples.message_broker.protocol import ErrorCode, Fetch, Fetched
from framework import errors, records
from framework.logs import get_logger
from framework.zk import Session, watch_data

log = get_logger("examples.message_broker.primary")


class RequestError(Exception):
    """A request refused with a protocol error ``code`` (sent back as an ``ErrorReply``)."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code


class DropReason(enum.Enum):
    """Why a backup is in :attr:`PrimaryTopic.dropped` (or left the in-sync set)."""

    #: its link closed, or its copy was superseded by a new one
    LINK = "link"
    #: behind the log end for longer than the lag limit
    LAG = "lag"
    #: still counted, but silent and behind for half the lag limit (reported, not dropped)
    SLOW = "slow"
    #: no longer in the topic's placement (never reported: the controller moved it)
    UNPLACED = "unplaced"


class FetchMark(NamedTuple):
    """A backup's last fetch: the log end it was shown, and when (trio time)."""

    end: int
    at: float


@attrs.define(eq=False)
class PrimaryTopic:
    """State of one primary term (see the module doc)."""

    name: str
    server: str
    log: TopicLog
    epoch: int
    mode: Mode
    session: Session
    isr_path: str
    isr: Isr
    isr_version: int
    #: offset every in-sync replica is known to hold when the term starts (see module doc)
    committed: int = 0
    hw: int = 0
    #: backup server -> offset its current copy asked for (it holds everything before it)
    followers: dict[str, int] = attrs.field(factory=dict)
    #: backup server -> token of its current copy; superseded tokens per server
    copies: dict[str, str] = attrs.field(factory=dict)
    retired: set[tuple[str, str]] = attrs.field(factory=set)
    synced: set[str] = attrs.field(factory=set)
    closed: bool = False
    handing_over: bool = False
    closed_at: float | None = None
    isr_dirty: bool = False
    #: the log end when this term started (see the module doc)
    start_end: int = 0
    deposed: trio.Event = attrs.field(factory=trio.Event)
    _changed: trio.Event = attrs.field(factory=trio.Event)
    _isr_lock: trio.Lock = attrs.field(factory=trio.Lock)
    #: seconds a counted backup may stay behind (module doc); ``None``: no limit
    lag_limit: float | None = None
    #: the ZooKeeper session id this term's primary znode belongs to (checked before an ack)
    owner_session: int | None = None
    #: the topic's placed replicas, once read (``None`` before: nobody refused for it)
    placement: frozenset[str] | None = None
    #: backup -> trio time it was last caught up; backup -> (log end, time) at its last fetch
    caught_up: dict[str, float] = attrs.field(factory=dict)
    last_fetch: dict[str, FetchMark] = attrs.field(factory=dict)
    #: placed backups dropped from the in-sync set (``LAG``, ``LINK``), or still counted but
    #: silent and behind for half the lag limit (``SLOW``): the controller places a
    #: replacement for each, so one is catching up by the time a hung backup drops
    dropped: dict[str, DropReason] = attrs.field(factory=dict)
    _appended: trio.Event = attrs.field(factory=trio.Event)
    #: called when :attr:`dropped` gains a backup (the server reports it at once)
    on_dropped: Callable[[], None] | None = None
    #: the topic's ``primary`` znode (a fetch claiming a newer epoch is checked there)
    primary_path: str = ""
    _epoch_checked_at: float = -math.inf
    _epoch_checking: bool = False

    def __attrs_post_init__(self) -> None:
        # only what the previous term acknowledged is known to be on every in-sync replica;
        # our own records beyond it wait for a backup of this term (module doc)
        self.hw = min(self.committed, self.log.end)
        self.start_end = self.log.end

    # ------------------------------------------------------------ helpers

    def _wake(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def close(self) -> None:
        """End the term: from now on nothing is acknowledged or delivered."""
        if not self.closed:
            self.closed_at = trio.current_time()
        self.closed = True
        self._wake()

    def _check_open(self) -> None:
        if self.closed:
            raise RequestError(ErrorCode.NOT_PRIMARY,
                               f"this server is no longer primary for {self.name}")

    def _ensure_owner(self) -> None:
        """Right before an acknowledgement: the term is open and the session that owns the
        primary znode is still trusted (synchronous, pause-safe); otherwise end the term."""
        self._check_open()
        try:
            self.session.ensure_trusted(self.owner_session)
        except errors.SessionInterrupted as exc:
            log.warning("broker.primary_untrusted", topic=self.name, epoch=self.epoch,
                        reason=exc.reason)
            self.close()
            raise RequestError(ErrorCode.NOT_PRIMARY,
                               "this server's session is no longer trusted") from None

    def _advance(self) -> None:
        """Move ``hw`` to what every counted backup holds (never while the in-sync set is
        being rewritten, nor while ZooKeeper's copy of it may miss a server we dropped)."""
        if self.synced and not self.isr_dirty and not self._isr_lock.locked():
            new = min(self.followers.get(s, 0) for s in self.synced)
            if new > self.hw:
                self.hw = min(new, self.log.end)
                self._wake()

    async def _set_isr(self, in_sync: tuple[str, ...]) -> None:
        """Conditionally replace the in-sync set (caller holds the lock).  A takeover
        meanwhile makes it fail: this term is closed and ``not_primary`` raised."""
        self._check_open()
        copies = {s: self.copies[s] for s in in_sync if s in self.copies}
        if self.isr.in_sync == in_sync and self.isr.copies == copies and not self.isr_dirty:
            return
        new = Isr(in_sync, self.server, self.isr.term,
                  {s: self.copies[s] for s in in_sync if s in self.copies}, hw=self.hw)
        try:
            try:
                stat = await self.session.set(self.isr_path, records.encode(new),
                                              version=self.isr_version)
            except errors.BadVersionError:
                # our own earlier write may have landed with its reply lost (a ZooKeeper
                # leader change): only another term (a takeover bumps it) deposes us
                data, seen = await self.session.get(self.isr_path)
                record = decode(data, Isr)
                if record.term != self.isr.term or record.leader != self.server:
                    self.deposed.set()
                    self.close()
                    raise RequestError(ErrorCode.NOT_PRIMARY,
                                       "a newer primary took over") from None
                log.info("broker.isr_reread", topic=self.name, version=seen.version,
                         in_sync=list(record.in_sync), epoch=self.epoch)
                stat = await self.session.set(self.isr_path, records.encode(new),
                                              version=seen.version)
        except (errors.BadVersionError, records.CorruptRecord) as exc:
            # another term's record, or one nobody can read: our term cannot be proven
            log.warning("broker.isr_lost", topic=self.name, epoch=self.epoch, error=str(exc))
            self.deposed.set()
            self.close()
            raise RequestError(ErrorCode.NOT_PRIMARY, "a newer primary took over") from None
        except errors.ZooKeeperError as exc:
            self.isr_dirty = True
            raise RequestError(ErrorCode.NO_IN_SYNC_BACKUP,
                               f"cannot record the in-sync set: {exc}") from None
        self._check_open()
        self.isr, self.isr_version, self.isr_dirty = new, stat.version, False
        log.info("broker.isr_changed", topic=self.name, in_sync=list(in_sync),
                 epoch=self.epoch)

    # ------------------------------------------------------------ produce

    async def produce(self, producer: str, seq: int, payloads: list[bytes]) -> int:
        """Append and wait until acknowledged (module doc); returns the log end."""
        self._check_open()
        if self.handing_over:
            raise RequestError(ErrorCode.SHUTTING_DOWN,
                               f"primary for {self.name} is handing over")
        async with self._isr_lock:
            self._check_open()
            if not self.synced:
                if self.mode is Mode.REFUSE:
                    log.info("broker.produce_refused", topic=self.name,
                             code=ErrorCode.NO_IN_SYNC_BACKUP.value, epoch=self.epoch)
                    raise RequestError(ErrorCode.NO_IN_SYNC_BACKUP,
                                       f"topic {self.name} has no in-sync backup (mode refuse)")
                # one_copy: ZooKeeper must say "only the primary" before a one-copy ack
                await self._set_isr((self.server,))
                self.log.append(self.log.new_records(producer, seq, payloads))
                self.hw = max(self.hw, self.log.end)
                self._wake()
                self._ensure_owner()
                return self.hw
            self.log.append(self.log.new_records(producer, seq, payloads))
            target = self.log.end
            self._appended.set()
        while True:
            self._check_open()
            if self.hw >= target:
                self._ensure_owner()
                return target
            await self._changed.wait()

    # ------------------------------------------------------------ replication

    async def fetch(self, request: Fetch, wait: float) -> Fetched:
        """A backup pulls from ``request.offset`` (which also acknowledges everything before
        it); waits up to ``wait`` seconds for records beyond it.

        A backup counts as in sync once it holds everything acknowledged (``offset >= hw``)
        and ZooKeeper's in-sync set names it; ``hw`` stands still meanwhile.  ``copy`` names
        the backup's copy of the log (module doc).  Raises :class:`RequestError`:
        ``stale_epoch``, ``bad_request`` (an offset beyond the log end), ``not_placed``,
        ``stale_copy``, ``not_primary``."""
        follower, epoch, offset, copy = request.server, request.epoch, request.offset, \
            request.copy
        self._check_open()
        if epoch != self.epoch:
            if epoch > self.epoch:
                await self._check_newer_epoch(epoch)
            raise RequestError(ErrorCode.STALE_EPOCH, f"epoch {epoch} is not {self.epoch}")
        if not 0 <= offset <= self.log.end:
            raise RequestError(ErrorCode.BAD_REQUEST,
                               f"offset {offset} outside the log (end {self.log.end})")
        if self.placement is not None and follower not in self.placement:
            if follower in self.synced:
                await self._drop(follower, DropReason.UNPLACED)
            raise RequestError(ErrorCode.NOT_PLACED, f"{follower} is not placed for {self.name}")
        if (follower, copy) in self.retired:
            raise RequestError(ErrorCode.STALE_COPY,
                               f"copy {copy!r} of {follower} was superseded")
        current = self.copies.get(follower)
        if current == copy:
            self.followers[follower] = max(offset, self.followers.get(follower, 0))
        else:
            self.copies[follower] = copy
            self.followers[follower] = offset
            if current is not None:  # a new copy: the old one (and its offset) counts no more
                self.retired.add((follower, current))
                log.warning("broker.backup_new_copy", topic=self.name, backup=follower,
                            offset=offset)
                await self._drop(follower)
        self._note_fetch(follower, offset)
        admit = max(self.hw, self.start_end)
        if (follower not in self.synced and offset >= admit) or self.isr_dirty:
            async with self._isr_lock:
                if follower not in self.synced and \
                        self.followers.get(follower, -1) >= max(self.hw, self.start_end):
                    await self._set_isr((self.server, *sorted(self.synced | {follower})))
                    self.synced.add(follower)
                    self.caught_up[follower] = trio.current_time()
                    self._wake()  # a hand-over may be waiting for an in-sync backup
                    self.dropped.pop(follower, None)
                    log.info("broker.backup_in_sync", topic=self.name, backup=follower,
                             offset=offset)
                elif self.isr_dirty:
                    await self._set_isr((self.server, *sorted(self.synced)))
        self._advance()
        with trio.move_on_after(wait):
            await self.log.wait_beyond(offset)
        self._check_open()
        in_sync = follower in self.synced and self.copies.get(follower) == copy
        return Fetched(request.id, offset, self.log.read(offset, 2000), self.log.end,
                       self.epoch, self.hw, in_sync)

    async def follower_gone(self, follower: str, copy: str = "") -> None:
        """The link of ``follower``'s ``copy`` closed: drop it from the in-sync set (in
        ZooKeeper first: the watermark does not move without it until that write
        succeeded).  The close of a superseded copy's link changes nothing."""
        if self.copies.get(follower) != copy:
            return
        self.followers.pop(follower, None)
        self.copies.pop(follower, None)
        await self._drop(follower)

    async def _check_newer_epoch(self, claimed: int) -> None:
        """A fetch claims epoch ``claimed`` > ours: end the term only if ZooKeeper says the
        primary znode is no longer ours (module doc)."""
        now = trio.current_time()
        if self._epoch_checking or now - self._epoch_checked_at < 1.0 or not self.primary_path:
            return
        self._epoch_checking = True
        try:
            await self.session.sync(self.primary_path)
            stat = await self.session.exists(self.primary_path)
        except errors.ZooKeeperError:
            return  # cannot tell: the znode watch and the trust deadline still guard us
        finally:
            self._epoch_checking = False
            self._epoch_checked_at = trio.current_time()
        if stat is None or stat.czxid != self.epoch:
            log.warning("broker.deposed_by_fetch", topic=self.name, epoch=self.epoch,
                        newer=claimed)
            self.deposed.set()
            self.close()
        else:
            log.warning("broker.newer_epoch_refused", topic=self.name, epoch=self.epoch,
                        claimed=claimed)

    def _note_fetch(self, follower: str, offset: int) -> None:
        """Kafka's rule: a fetch at the current log end, or at the end this backup was shown
        at its previous fetch, proves it was caught up (now, or at that previous fetch)."""
        now = trio.current_time()
        previous = self.last_fetch.get(follower)
        if offset >= self.log.end:
            self.caught_up[follower] = now
        elif previous is not None and offset >= previous.end:
            self.caught_up[follower] = max(self.caught_up.get(follower, previous.at),
                                           previous.at)
        self.last_fetch[follower] = FetchMark(self.log.end, now)

    async def watch_lag(self) -> None:
        """Run for the term: drop a counted backup that stayed behind the log end for longer
        than ``lag_limit`` (module doc).  Sleeps until the earliest such deadline (waking at
        least every quarter of the limit meanwhile), or until the next append while every
        counted backup holds the whole log (no polling).

        Time this process did not run (a pause of the primary itself: SIGSTOP, a VM stall,
        CPU starvation) is not counted against the backups: a wake-up later than planned by
        more than a quarter of the limit moves every catch-up time forward by the delay, and
        a backup that held the whole log when the watchdog went idle counts as caught up
        until the append that woke it."""
        if self.lag_limit is None:
            return
        limit = self.lag_limit
        while not self.closed:
            self._appended = trio.Event()
            now = trio.current_time()
            deadline = math.inf
            for backup in sorted(self.synced):
                deadline = min(deadline, await self._check_backup(backup, now, limit))
            if math.isinf(deadline):
                await self._idle_until_append()
            else:
                await self._sleep_uncounting_pauses(min(deadline, now + limit / 4), limit / 4)

    async def _check_backup(self, backup: str, now: float, limit: float) -> float:
        """One counted backup at ``now``: report it slow (silent and behind for half the
        limit), or drop it (not caught up for the whole limit).  Returns when it must next
        be caught up by (``inf``: it holds the whole log, or was dropped)."""
        if self.followers.get(backup, 0) >= self.log.end:
            if self.dropped.get(backup) is DropReason.SLOW:  # caught up after all
                self._report(backup, None)
            return math.inf  # holds everything: not behind
        since = self.caught_up.get(backup, now)
        mark = self.last_fetch.get(backup)
        silent = now - (now if mark is None else mark.at)
        if since + limit / 2 <= now and silent >= limit / 2 and backup not in self.dropped:
            log.info("broker.backup_slow", topic=self.name, backup=backup,
                     silent=round(silent, 3), lag_limit=limit)
            self._report(backup, DropReason.SLOW)
        if since + limit <= now:
            log.warning("broker.backup_lagging", topic=self.name, backup=backup,
                        behind=self.log.end - self.followers.get(backup, 0),
                        seconds=round(now - since, 3), lag_limit=limit)
            await self._drop(backup, DropReason.LAG)
            return math.inf
        return since + limit

    async def _idle_until_append(self) -> None:
        """Every counted backup holds the whole log: wait for the next append; the backups
        that held the log end of now count as caught up until then."""
        end = self.log.end
        await self._appended.wait()
        now = trio.current_time()
        for backup in self.synced:
            if self.followers.get(backup, 0) >= end:
                self.caught_up[backup] = max(self.caught_up.get(backup, now), now)

    async def _sleep_uncounting_pauses(self, wake: float, tick: float) -> None:
        """Sleep until ``wake``; a wake-up later than that by more than ``tick`` means this
        process did not run (not the backups' lag): every catch-up and fetch time moves
        forward by the delay."""
        await trio.sleep_until(wake)
        late = trio.current_time() - wake
        if late > tick:
            log.info("broker.lag_clock_credit", topic=self.name, seconds=round(late, 3))
            for backup in self.caught_up:
                self.caught_up[backup] += late
            for backup, mark in self.last_fetch.items():
                self.last_fetch[backup] = FetchMark(mark.end, mark.at + late)

    def _report(self, backup: str, reason: DropReason | None) -> None:
        """Set or clear ``backup``'s entry in :attr:`dropped` and tell the server."""
        if reason is None:
            self.dropped.pop(backup, None)
        else:
            self.dropped[backup] = reason
        if self.on_dropped is not None:
            self.on_dropped()

    async def follow_placement(self, path: str) -> None:
        """Run for the term: keep :attr:`placement` from the topic's placement (``plan/<t>``, a
        data watch; a connection-state event re-reads and changes nothing) and drop counted
        backups that are no longer placed.  A placement that is not a list of names is
        logged (``broker.record_corrupt``) and changes nothing."""
        async for snap in watch_data(self.session, path):
            try:
                replicas = frozenset(decode_replicas(snap.data))
            except records.CorruptRecord as exc:
                log.error("broker.record_corrupt", path=path, error=str(exc))
                continue
            self.placement = replicas
            for backup in sorted(self.synced - replicas):
                await self._drop(backup, DropReason.UNPLACED)
            for backup in set(self.dropped) - replicas:
                self.dropped.pop(backup, None)

    async def _drop(self, follower: str, reason: DropReason = DropReason.LINK) -> None:
        if follower not in self.synced or self.closed:
            return
        log.warning("broker.backup_lost", topic=self.name, backup=follower,
                    reason=reason.value)
        if reason is not DropReason.UNPLACED:
            self.dropped[follower] = reason
            if self.on_dropped is not None:
                self.on_dropped()
        async with self._isr_lock:
            self.synced.discard(follower)
            self.isr_dirty = True
            self._wake()
            try:
                await self._set_isr((self.server, *sorted(self.synced)))
            except RequestError:
                pass
        self._advance()

    def lag(self) -> int | None:
        if not self.synced:
            return None
        return self.log.end - min(self.followers.get(s, 0) for s in self.synced)

    # ------------------------------------------------------------ subscribers

    async def deliverable(self, offset: int, limit: int = 500) -> list[Record]:
        """Records from ``offset`` up to the high watermark, waiting for at least one."""
        while True:
            self._check_open()
            if self.hw > offset:
                return self.log.read(offset, min(limit, self.hw - offset))
            await self._changed.wait()

    async def drained(self) -> bool:
        """Wait until an in-sync backup holds the whole log (hand-over); False once the term
        is closed.  With no backup in sync it keeps waiting: the controller places a
        replacement, which catches up (the caller bounds the wait)."""
        while True:
            if self.closed:
                return False
            if self.synced and self.hw >= self.log.end:
                return True
            await self._changed.wait()
