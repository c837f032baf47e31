"""Who serves which shard (push mode): the master's plans and the replicated placement loop.

:mod:`~framework.runtime.placement.assignment` computes plans (``plan_assignment`` for one
owner per shard, ``plan_replicas`` for replicas with rules);
:mod:`~framework.runtime.placement.replicated` is the fenced loop that moves replicas one
safe step at a time (``ReplicatedPlacement``, ``commit_fenced``), and
:mod:`~framework.runtime.placement.placement_rules` what an application says about readiness
and where replicas may go.  This wing imports only the runtime's data modules (``app``,
``records``); the layers above use it through this root.
"""

from framework.runtime.placement.assignment import plan_assignment, plan_replicas
from framework.runtime.placement.placement_rules import PlacementRules, Readiness
from framework.runtime.placement.replicated import (
    ReplicatedPlacement,
    StepHook,
    commit_fenced,
    confirmed_records,
)

__all__ = ["PlacementRules", "Readiness", "ReplicatedPlacement", "StepHook", "commit_fenced",
           "confirmed_records", "plan_assignment", "plan_replicas"]
