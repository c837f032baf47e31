"""Two-phase commit (seed recipe), with crash detection through ephemeral nodes.

Layout of one transaction, all under ``<path>/<txid>`` (whose data is the payload)::

    site-<name>    created by the coordinator, one per site; its data is the site's
                   :class:`SiteState`: b"" -> b"joined" -> b"commit"|b"abort"
    alive-<name>   ephemeral, created by the site when it joins: its session's liveness
    decision       a :class:`Decision` record: created once, by whoever decides first

Guarantees:

* Every participant (coordinator and sites) applies the same rule to what it watches: any
  ``abort`` vote, a site that joined and whose ``alive`` node vanished before it voted, or a
  timeout means abort; all ``commit`` votes mean commit.
* One outcome: the first participant to conclude creates ``decision`` (a create is atomic),
  and everyone adopts that one, even if two of them raced with different views.
* A site's vote is written in a transaction that checks its own ``alive`` node, so a site
  whose session expired cannot vote after it was declared crashed.
* The sites decide without the coordinator if it crashes.  The transaction's nodes are kept
  after the decision, so a restarted site learns the outcome;
  :meth:`TwoPhaseCoordinator.forget` removes them.
* A ``decision`` or site node that is not a record of this recipe raises
  :class:`~framework.records.CorruptRecord`.
"""

from __future__ import annotations

import enum
import inspect
from typing import Awaitable, Callable

import attrs
import trio

from framework import errors, records
from framework.errors import ConfigurationError, TwoPhaseTimeout
from framework.logs import get_logger
from framework.zk import Session, cleanup_scope, validate_name, validate_path, wait_exists

log = get_logger("framework.primitives.two_phase")

VoteFn = Callable[[bytes], "bool | Awaitable[bool]"]


class SiteState(enum.Enum):
    """A site's node data: where the site stands in one transaction."""

    INVITED = b""  # created by the coordinator; the site has not joined
    JOINED = b"joined"  # joined (its ``alive`` node exists), not voted yet
    COMMIT = b"commit"  # voted commit
    ABORT = b"abort"  # voted abort


class TwoPhaseOutcome(enum.Enum):
    """The decision of one transaction (named apart from the runtime's task
    :class:`~framework.runtime.tasks.Outcome`)."""

    COMMITTED = "commit"
    ABORTED = "abort"


#: The earlier name of :class:`TwoPhaseOutcome` (``framework.primitives`` still exports it).
Outcome = TwoPhaseOutcome


@attrs.frozen
class Decision:
    """The ``decision`` node's record: the outcome, why, and who decided it."""

    outcome: TwoPhaseOutcome
    reason: str
    by: str


def _state_of(data: bytes) -> SiteState:
    try:
        return SiteState(data)
    except ValueError:
        raise records.CorruptRecord(f"not a two-phase site state: {data!r}") from None


@attrs.frozen
class _View:
    votes: dict[str, SiteState]
    alive: frozenset[str]
    decision: Decision | None


@attrs.frozen
class _Verdict:
    """What the rule concludes: an outcome, why, and whether it rests on a crash (which
    must be confirmed before it is proposed)."""

    outcome: TwoPhaseOutcome
    reason: str
    crash: bool = False


def _verdict(view: _View) -> _Verdict | None:
    """The rule every participant applies (see module doc)."""
    for site, vote in view.votes.items():
        if vote is SiteState.ABORT:
            return _Verdict(TwoPhaseOutcome.ABORTED, f"site {site} voted abort")
    for site, vote in view.votes.items():
        if vote is SiteState.JOINED and site not in view.alive:
            return _Verdict(TwoPhaseOutcome.ABORTED, f"site {site} crashed before voting",
                            crash=True)
    if all(v is SiteState.COMMIT for v in view.votes.values()):
        return _Verdict(TwoPhaseOutcome.COMMITTED, "every site voted commit")
    return None


class _Transaction:
    """Watching and deciding one transaction (shared by coordinator and sites)."""

    def __init__(self, session: Session, root: str, who: str) -> None:
        self.session = session
        self.root = root
        self.who = who
        self._sites: list[str] | None = None

    async def _read(self, fired: trio.Event) -> _View:
        """Votes first, then liveness: a site seen ``joined`` and then without its ``alive``
        node has died (``alive`` exists from the moment a site joins)."""
        session = self.session
        if self._sites is None:
            names = await session.children(self.root)
            self._sites = sorted(n[5:] for n in names if n.startswith("site-"))
        votes: dict[str, SiteState] = {}
        for site in self._sites:
            data, _stat = await session.get(f"{self.root}/site-{site}", watch=session.waker(fired))
            votes[site] = _state_of(data)
        names = await session.children(self.root, watch=session.waker(fired))
        alive = frozenset(n[6:] for n in names if n.startswith("alive-"))
        decision = None
        if "decision" in names:
            data, _stat = await session.get(f"{self.root}/decision")
            decision = records.decode(data, Decision)
        return _View(votes, alive, decision)

    async def _confirm_crash(self, view: _View) -> bool:
        """A site that joined and lost its ``alive`` node may have voted just before dying:
        it crashed before voting only if its node still says ``joined`` now (it can never
        vote again: its vote is fenced on the vanished ``alive`` node)."""
        for site, vote in view.votes.items():
            if vote is SiteState.JOINED and site not in view.alive:
                data, _stat = await self.session.get(f"{self.root}/site-{site}")
                if _state_of(data) is not SiteState.JOINED:
                    return False
        return True

    async def decide(self, outcome: TwoPhaseOutcome, reason: str) -> None:
        """Propose ``outcome``; the first proposal wins."""
        try:
            record = records.encode(Decision(outcome, reason, self.who))
            await self.session.create(f"{self.root}/decision", record)
            log.info("two_phase.decided", tx=self.root, outcome=outcome.value, reason=reason,
                     by=self.who)
        except errors.NodeExistsError:
            pass

    async def outcome(self, deadline: float = float("inf")) -> TwoPhaseOutcome:
        """Watch until there is a decision (proposing one as soon as the rule gives one, or
        ABORT at ``deadline``); return it."""
        while True:
            fired = trio.Event()
            try:
                view = await self._read(fired)
                if view.decision is not None:
                    return view.decision.outcome
                verdict = _verdict(view)
                if verdict is not None:
                    if not verdict.crash or await self._confirm_crash(view):
                        await self.decide(verdict.outcome, verdict.reason)
                    continue
            except (errors.ConnectionLossError, errors.SessionExpiredError):
                await self.session.wait_connected()
                continue
            with trio.move_on_at(deadline):
                await fired.wait()
            if trio.current_time() >= deadline:
                try:
                    await self.decide(TwoPhaseOutcome.ABORTED, "timeout")
                except (errors.ConnectionLossError, errors.SessionExpiredError):
                    await self.session.wait_connected()  # re-read: the decision may be there


class TwoPhaseCoordinator:
    """Runs transactions over the named ``sites`` under ``path`` (bad names, an empty or
    duplicated site list: :class:`ConfigurationError`).

    SUSPENDED: the coordinator keeps watching and re-reads after reconnection.  LOST: it holds
    no ephemeral node; it continues in the new session.  If the coordinator crashes after
    creating a transaction, the sites still reach a decision by themselves (all commit, or an
    abort vote, crash, or a site's own timeout).
    """

    def __init__(self, session: Session, path: str, sites: list[str]) -> None:
        validate_path(path, allow_root=False)
        if isinstance(sites, (str, bytes)) or not all(isinstance(s, str) for s in sites):
            raise ConfigurationError(f"sites must be a list of site names, got {sites!r}")
        sites = list(sites)
        if not sites:
            raise ConfigurationError("a two-phase commit needs at least one site")
        if len(set(sites)) != len(sites):
            raise ConfigurationError(f"duplicate site names: {sites}")
        self.session = session
        self.path = path
        self.sites = [validate_name("site name", s) for s in sites]

    async def run(self, txid: str, payload: bytes, timeout: float) -> TwoPhaseOutcome:
        """Create transaction ``txid`` and wait for its outcome; abort after ``timeout``.
        A ``txid`` that exists already raises :class:`ConfigurationError`."""
        root = f"{self.path}/{validate_name('txid', txid)}"
        deadline = trio.current_time() + _check_timeout(timeout, allow_none=False)
        await self.session.ensure_path(self.path)
        txn = self.session.transaction().create(root, payload)
        for site in self.sites:
            txn.create(f"{root}/site-{site}")
        try:
            await txn.commit()
        except errors.TransactionFailedError as exc:
            if isinstance(exc.cause, errors.NodeExistsError):
                raise ConfigurationError(f"transaction {txid!r} already exists") from None
            raise
        except errors.ConnectionLossError:
            await self.session.wait_connected()
            if await self.session.exists(root) is None:
                raise
        log.info("two_phase.started", tx=root, sites=self.sites)
        return await _Transaction(self.session, root, "coordinator").outcome(deadline)

    async def decision(self, txid: str) -> TwoPhaseOutcome | None:
        """The outcome of ``txid`` if decided (``None`` otherwise)."""
        try:
            data, _stat = await self.session.get(f"{self.path}/{txid}/decision")
        except errors.NoNodeError:
            return None
        return records.decode(data, Decision).outcome

    async def forget(self, txid: str) -> None:
        """Remove a finished transaction's nodes."""
        await self.session.delete_tree(f"{self.path}/{validate_name('txid', txid)}")


class TwoPhaseSite:
    """One site of the transactions under ``path``.

    SUSPENDED: waiting continues after reconnection; the site's ``alive`` node survives if the
    session does.  LOST: the ``alive`` node vanished, so if the site had not voted the others
    abort, and its own vote (fenced on that node) can no longer be written; ``participate``
    still returns the outcome the others reached.
    """

    def __init__(self, session: Session, path: str, site: str) -> None:
        validate_path(path, allow_root=False)
        self.session = session
        self.path = path
        self.site = validate_name("site name", site)

    async def participate(
        self, txid: str, vote_fn: VoteFn, *, timeout: float | None = None
    ) -> TwoPhaseOutcome:
        """Wait for transaction ``txid``, vote with ``vote_fn(payload)`` (true: commit; an
        exception votes abort) and return the outcome.  After ``timeout`` (if given) the site
        proposes ABORT itself, which wins unless a decision was already made.

        Raises :class:`TwoPhaseTimeout` if the transaction does not appear within
        ``timeout``, :class:`ConfigurationError` if this site is not one of its sites."""
        session = self.session
        root = f"{self.path}/{validate_name('txid', txid)}"
        deadline = trio.current_time() + _check_timeout(timeout, allow_none=True)
        mine = f"{root}/site-{self.site}"
        alive = f"{root}/alive-{self.site}"
        tx = _Transaction(session, root, self.site)
        with trio.move_on_at(deadline):
            await wait_exists(session, root)
        if trio.current_time() >= deadline:
            raise TwoPhaseTimeout(f"transaction {txid!r} did not appear within {timeout}s")
        payload, _stat = await session.get(root)
        try:
            status, stat = await session.get(mine)
        except errors.NoNodeError:
            raise ConfigurationError(f"site {self.site!r} is not part of {txid!r}") from None
        try:
            if stat.version == 0 and await session.exists(f"{root}/decision") is None:
                await self._join_and_vote(root, mine, alive, payload, vote_fn)
            else:
                log.info("two_phase.rejoined", tx=root, site=self.site,
                         status=_state_of(status).name.lower())
            outcome = await tx.outcome(deadline)
        finally:
            with cleanup_scope(session) as scope:
                try:
                    await session.delete(alive, missing_ok=True)
                except errors.ZooKeeperError:
                    pass
            if scope.cancelled_caught:
                session.delete_later(alive)
        log.info("two_phase.outcome", tx=root, site=self.site, outcome=outcome.value)
        return outcome

    async def _join_and_vote(
        self, root: str, mine: str, alive: str, payload: bytes, vote_fn: VoteFn
    ) -> None:
        """Join (create ``alive``, mark ``joined``), vote, write the vote fenced on ``alive``.

        A lost reply (connection loss) is resolved by reading ``mine`` back: the server's
        state, not the error, says whether the join or the vote happened.  If the session
        was lost meanwhile, ``alive`` is gone and the others treat us as crashed; we then
        only await the outcome.
        """
        session = self.session
        session_id = await session.wait_connected()
        while True:
            try:
                await session.transaction().create(alive, ephemeral=True).set(
                    mine, SiteState.JOINED.value, version=0
                ).commit()
                break
            except errors.TransactionFailedError:
                return  # someone decided for us (or we joined already): await the outcome
            except (errors.ConnectionLossError, errors.SessionExpiredError):
                joined = await self._applied(mine, alive, session_id, SiteState.JOINED)
                if joined is None:
                    continue  # the join did not happen: try again
                if not joined:
                    return
                break
        log.info("two_phase.joined", tx=root, site=self.site)
        # vote_fn runs outside any lock: a crash (or expiry) here is seen through `alive`
        try:
            result = vote_fn(payload)
            commit = await result if inspect.isawaitable(result) else result
            vote = SiteState.COMMIT if commit else SiteState.ABORT
        except Exception as exc:  # the site cannot do its part: vote abort
            log.warning("two_phase.vote_failed", tx=root, site=self.site, error=repr(exc))
            vote = SiteState.ABORT
        while True:
            try:
                await session.transaction().check(alive, -1).set(
                    mine, vote.value, version=1).commit()
                break
            except errors.TransactionFailedError:
                log.warning("two_phase.vote_rejected", tx=root, site=self.site)
                return
            except (errors.ConnectionLossError, errors.SessionExpiredError):
                voted = await self._applied(mine, alive, session_id, vote)
                if voted is None:
                    continue
                if not voted:
                    log.warning("two_phase.vote_rejected", tx=root, site=self.site)
                    return
                break
        log.info("two_phase.voted", tx=root, site=self.site, vote=vote.value.decode())

    async def _applied(
        self, mine: str, alive: str, session_id: int, wanted: SiteState
    ) -> bool | None:
        """After a lost reply: ``True`` if ``mine`` holds ``wanted`` (our write happened),
        ``False`` if it cannot happen any more (our session, and so ``alive``, is gone, or
        the node moved on), ``None`` if it did not happen and may be retried."""
        while True:
            try:
                current = await self.session.wait_connected()
                data, _stat = await self.session.get(mine)
                state = _state_of(data)
                if state is wanted:
                    return True
                if current != session_id:
                    return False
                stat = await self.session.exists(alive)
                if wanted is SiteState.JOINED:
                    return None if state is SiteState.INVITED else False
                if stat is None or stat.ephemeralOwner != session_id:
                    return False
                return None if state is SiteState.JOINED else False
            except (errors.ConnectionLossError, errors.SessionExpiredError):
                continue


def _check_timeout(timeout: float | None, *, allow_none: bool) -> float:
    if timeout is None and allow_none:
        return float("inf")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout < 0:
        raise ConfigurationError(f"timeout must be a number of seconds >= 0, got {timeout!r}")
    return float(timeout)
