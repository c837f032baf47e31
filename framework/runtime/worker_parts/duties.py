"""The app's duties in worker-only deployments: delayed tasks, schedules and retention.

A master's leader moves delayed tasks into the queue (:mod:`~framework.runtime.scheduling.delayed`),
fires periodic schedules (:mod:`~framework.runtime.scheduling.schedules`) and applies retention
(:mod:`~framework.runtime.results.retention`).  An app deployed with workers only (Celery's
``beat``, RQ's ``worker --with-scheduler``) needs the same, so its workers elect one of
themselves to do it: :class:`Duties`, a part of every :class:`~framework.runtime.Worker` that
takes tasks (``duties = False`` on a worker class keeps its processes out).

**Election.** Every such worker contends in ``/apps/<app>/duties`` (the election recipe:
sequential-ephemeral contenders, each watching only its predecessor).  The one elected is the
*duty holder*; the others stand by in line.

**Canvases and routing.** The holder also drives the app's ``chain``/``group``/``chord``
canvases (:class:`~framework.runtime.workflows.canvas.CanvasDriver`) and moves the tasks
submitted before their type's queue was known into that queue
(:class:`~framework.runtime.scheduling.router.Router`), whether or not a master leads (a
master does neither); both fenced by its term.

**A leading master takes over.** While the app's masters' election has a leader, the duty
holder stands aside (``deferred``): the master's leader does the duties, as it always did.
When the masters' election empties (the last master exited, or was killed and its session
expired) the holder resumes.  The holder watches only the masters' leader node (one watch).

**The same code, the same guarantees.**  The holder runs the master's own
:class:`~framework.runtime.scheduling.DelayedMover`,
:class:`~framework.runtime.scheduling.Scheduler` and
:class:`~framework.runtime.results.Retention`, fenced by its term in ``duties/`` exactly as a
master's are fenced by its term in ``masters/``: every write is a multi that checks the
holder's election node.  So a deposed holder writes nothing (its node is gone once its session
expired); a schedule's slot is fired in the same multi that moves its record on at the version
read, so two firers - a holder and a master during a handover, or a holder resuming from a
pause - never fire one slot twice, and with ``CatchUp.ALL`` the next firer fires every slot
left (each once); a delayed task is queued in the same multi that deletes its node at the
version read, so it is queued once, and never before its due time (by the mover's clock).

**SUSPENDED / LOST.**  The holder's term is a leadership scope: cancelled when the session
can no longer be trusted (a paused or partitioned process stops at its trust deadline, before
the server can expire it) or its node is deleted; the duties stop with it and the worker
contends again once connected.  A stop requested (drain) resigns at once, so another worker
takes over while this one finishes its tasks.

Which schedules: those of the holder's class (``schedules = [every(...), cron(...)]`` on the
worker class, validated as a master's are); give every worker class of an app that may be
elected the same list.  Retention uses the class's ``<kind>_retention_count`` /
``_seconds``, ``retention_interval`` and ``retention_batch`` if it sets them, else
:class:`~framework.runtime.Master`'s defaults.  While a master leads, only the master's own
schedules fire.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import trio

from framework import errors, records
from framework.logs import get_logger
from framework.primitives import Election, Term
from framework.primitives.queue import WorkQueue
from framework.runtime.master import Master
from framework.runtime.records import MasterIdentity
from framework.runtime.results.retention import Limit, Retention, limits_of
from framework.runtime.scheduling.delayed import DelayedMover
from framework.runtime.scheduling.router import Router
from framework.runtime.scheduling.schedules import Schedule, Scheduler
from framework.runtime.submission import Submitter
from framework.runtime.workflows.canvas import CanvasDriver
from framework.zk import Session

if TYPE_CHECKING:
    from framework.runtime.worker_parts.hosts import DutiesHost

log = get_logger("framework.runtime.worker_parts.duties")

_SETTINGS = ("retention_interval", "retention_batch", *(
    f"{kind}_retention_{limit}" for kind in ("result", "dead", "failure", "canvas")
    for limit in ("count", "seconds")))


def duties_path(app: Any) -> str:
    """The duty holders' election of ``app``."""
    return f"{app.base}/duties"


class _Settings:
    """The retention settings of a worker class, or a master's defaults where it has none."""

    def __init__(self, worker: DutiesHost) -> None:
        for name in _SETTINGS:
            setattr(self, name, getattr(worker, name, getattr(Master, name)))


def check_schedules(owner: type, schedules: Any) -> list[Schedule]:
    """``schedules`` as a list of distinct-named schedules, or a one-line error."""
    schedules = list(schedules or [])
    names = [s.name for s in schedules if isinstance(s, Schedule)]
    if len(names) != len(schedules) or len(set(names)) != len(names):
        raise errors.ConfigurationError(
            f"{owner.__name__}.schedules must be every()/cron() schedules with distinct "
            f"names, got {schedules!r}")
    return schedules


class Duties:
    """A worker's part that contends for the app's duties and does them while elected and
    no master leads (see the module doc).  ``state``: ``off`` (this worker never contends),
    ``standby``, ``held`` or ``deferred`` (elected, a master leads)."""

    drains = False

    def __init__(self, worker: DutiesHost) -> None:
        self.worker = worker
        self.enabled = bool(getattr(worker, "duties", True)) and worker.takes_tasks
        self.schedules = check_schedules(type(worker), getattr(worker, "schedules", []))
        self.settings = _Settings(worker)
        self.limits = limits_of(self.settings)  # checked now, not at the first pass
        self.canvas_limit = Limit(self.settings.canvas_retention_count,
                                  self.settings.canvas_retention_seconds)
        interval = self.settings.retention_interval
        if interval is not None and not interval > 0:
            raise errors.ConfigurationError(
                f"retention_interval must be positive seconds or None: {interval!r}")
        self.state = "standby" if self.enabled else "off"
        self.terms = 0  # terms this process held the duties
        self._stopping = False
        self._scope: trio.CancelScope | None = None
        self.router: Router | None = None  # this process's router while it holds the duties

    # ------------------------------------------------------------ the Part protocol

    def layout(self) -> list[str]:
        return [duties_path(self.worker.app)] if self.enabled else []

    async def prepare(self, session: Session) -> None:
        """Nothing to set up."""

    def request_stop(self) -> None:
        """Resign at once (another worker takes over while this one drains)."""
        self._stopping = True
        if self._scope is not None:
            self._scope.cancel()

    def status(self) -> dict[str, Any]:
        return {"duties": self.state}

    async def run(self, session: Session) -> None:
        """Contend, hold the duties while elected, contend again after a lost term; until
        a stop is requested (or cancelled)."""
        if not self.enabled:
            return
        worker = self.worker
        identity = records.encode(MasterIdentity(worker.name, worker.address))
        election = Election(session, duties_path(worker.app), identity,
                            suspended_grace=worker.suspended_grace)
        with trio.CancelScope() as self._scope:
            while not self._stopping:
                try:
                    async with election.leadership() as term:
                        self.terms += 1
                        log.info("duties.elected", app=worker.app.name, worker=worker.name,
                                 token=term.token)
                        await self._hold(session, term)
                except errors.LeadershipLost as exc:
                    log.warning("duties.lost", app=worker.app.name, worker=worker.name,
                                reason=exc.reason)
                    self._set("standby")
                    await session.wait_connected()
        self._set("standby")

    # ------------------------------------------------------------ holding

    async def _hold(self, session: Session, term: Term) -> None:
        """Do the duties while no master leads; stand aside while one does.  Drive the
        app's canvases (:mod:`framework.runtime.workflows.canvas`) and route its unrouted
        tasks (:mod:`framework.runtime.scheduling.router`) all along."""
        masters = Election(session, self.worker.app.masters)
        await session.ensure_path(self.worker.app.masters)
        async with trio.open_nursery() as nursery:
            # canvases are driven by the holder whether or not a master leads
            nursery.start_soon(CanvasDriver(
                session, self.worker.app, term, keep=self.canvas_limit,
                trim_every=self.settings.retention_interval).run)
            # so are the unrouted tasks (a master has no router)
            self.router = Router(session, self.worker.app, WorkQueue(
                session, self.worker.app.tasks, dead_letter=self.worker.app.dead,
                fence=(term.node, term.version)))
            nursery.start_soon(self.router.run)
            doing: trio.CancelScope | None = None
            async for leader in masters.watch_leaders():
                if leader is None and doing is None:
                    doing = trio.CancelScope()
                    nursery.start_soon(self._perform, session, term, doing)
                    self._set("held")
                elif leader is not None:
                    if doing is not None:
                        doing.cancel()
                        doing = None
                    log.info("duties.deferred", app=self.worker.app.name,
                             worker=self.worker.name)
                    self._set("deferred")

    async def _perform(self, session: Session, term: Term, scope: trio.CancelScope) -> None:
        """The master's movers, fenced by ``term``, until ``scope`` is cancelled."""
        app = self.worker.app
        queue = WorkQueue(session, app.tasks, dead_letter=app.dead,
                          fence=(term.node, term.version))
        submitter = Submitter(session, app, queue)
        settings = self.settings
        with scope:
            async with trio.open_nursery() as nursery:
                if settings.retention_interval is not None:
                    retention = Retention(session, app, term, queue,
                                          batch=settings.retention_batch, **self.limits)
                    nursery.start_soon(retention.run, settings.retention_interval)
                nursery.start_soon(DelayedMover(session, app, queue).run)
                nursery.start_soon(Scheduler(session, app, queue, self.schedules,
                                             submitter).run)

    def _set(self, state: str) -> None:
        if state != self.state:
            self.state = state
            self.worker.status_changed()
