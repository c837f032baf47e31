"""Layer 4: the master/worker runtime (subclass ``Master`` and ``Worker``)."""

from framework.runtime.app import App
from framework.runtime.blocking import BlockingClient, ClientClosedError
from framework.runtime.client import Client, DeadLetter
from framework.runtime.master import Master, MasterContext
from framework.runtime.operations.status import (
    AppStatus,
    AppSummary,
    Watches,
    gather_status,
    list_apps,
    render_apps,
    render_status,
)
from framework.runtime.payloads import LocalDirectoryStore, PayloadMissing, PayloadStore
from framework.runtime.placement.assignment import plan_assignment, plan_replicas
from framework.runtime.placement.placement_rules import PlacementRules, Readiness, confirmed_records
from framework.runtime.placement.replicated import ReplicatedPlacement, commit_fenced
from framework.runtime.records import (
    MasterIdentity,
    MemberState,
    MemberStatus,
    Plan,
    Revocation,
)
from framework.runtime.launch.runner import load_class, run_component
from framework.runtime.scheduling.schedules import CatchUp, Schedule, cron, every
from framework.runtime.service import Part, Service
from framework.runtime.submission import Existing, TaskExists
from framework.runtime.task_types import RateLimit, TaskOptions, task
from framework.runtime.tasks import Outcome, Task, TaskResult, new_task
from framework.runtime.worker import Worker
from framework.runtime.worker_parts.soft_limit import SoftTimeLimitExceeded
from framework.runtime.workflows.canvas import (
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
    "App",
    "AppStatus",
    "AppSummary",
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
    "Task",
    "TaskExists",
    "TaskOptions",
    "TaskResult",
    "Watches",
    "Worker",
    "gather_status",
    "group",
    "list_apps",
    "load_class",
    "apply_canvas",
    "canvas_result",
    "chain",
    "chord",
    "commit_fenced",
    "confirmed_records",
    "cron",
    "every",
    "new_task",
    "plan_assignment",
    "plan_replicas",
    "render_apps",
    "render_status",
    "run_component",
    "sig",
    "task",
]
