"""Layer 4: the master/worker runtime (subclass ``Master`` and ``Worker``).

``__all__`` is the public API: what a user subclasses or calls (the faces at this package's
root: ``App``, ``Client``, ``BlockingClient``, ``Master``, ``Worker``, ``Service``...) and
the data they take or return.  The wings below (``worker_parts``, ``scheduling``,
``placement``, ``workflows``, ``results``, ``operations``, ``launch``) are the runtime's own
business; see docs/architecture.md, "The runtime's wings".
"""

from framework.runtime.app import DEFAULT_QUEUE, App
from framework.runtime.blocking import BlockingClient, ClientClosedError
from framework.runtime.client import Client, DeadLetter
from framework.runtime.launch import run_component
from framework.runtime.master import Master, MasterContext
from framework.runtime.payloads import LocalDirectoryStore, PayloadMissing, PayloadStore
from framework.runtime.placement import (
    PlacementRules,
    Readiness,
    ReplicatedPlacement,
    commit_fenced,
    confirmed_records,
    plan_replicas,
)
from framework.runtime.records import (
    MasterIdentity,
    MemberState,
    MemberStatus,
    Plan,
    Revocation,
)
from framework.runtime.scheduling import CatchUp, Schedule, cron, every
from framework.runtime.service import Part, Service
from framework.runtime.submission import Existing, SubmitOptions, TaskExists
from framework.runtime.task_types import RateLimit, TaskOptions, task
from framework.runtime.tasks import Outcome, Task, TaskResult, new_task
from framework.runtime.worker import Worker
from framework.runtime.worker_parts import SoftTimeLimitExceeded
from framework.runtime.workflows import (
    Canvas,
    CanvasRecord,
    Signature,
    apply_canvas,
    canvas_result,
    chain,
    chord,
    group,
    sig,
)

__all__ = [
    "DEFAULT_QUEUE",
    "App",
    "BlockingClient",
    "Canvas",
    "CanvasRecord",
    "CatchUp",
    "Client",
    "ClientClosedError",
    "DeadLetter",
    "Existing",
    "LocalDirectoryStore",
    "Master",
    "MasterContext",
    "MasterIdentity",
    "MemberState",
    "MemberStatus",
    "Outcome",
    "Part",
    "PayloadMissing",
    "PayloadStore",
    "PlacementRules",
    "Plan",
    "RateLimit",
    "Revocation",
    "Readiness",
    "Schedule",
    "ReplicatedPlacement",
    "Service",
    "Signature",
    "SoftTimeLimitExceeded",
    "SubmitOptions",
    "Task",
    "TaskExists",
    "TaskOptions",
    "TaskResult",
    "Worker",
    "group",
    "apply_canvas",
    "canvas_result",
    "chain",
    "chord",
    "commit_fenced",
    "confirmed_records",
    "cron",
    "every",
    "new_task",
    "plan_replicas",
    "run_component",
    "sig",
    "task",
]
