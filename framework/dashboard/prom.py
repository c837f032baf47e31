"""``/metrics`` of the dashboard: Prometheus metrics derived from the watched model.

A scrape reads the model only (no ZooKeeper request).  Counters are what the dashboard saw
since it started: ``done``/``failed`` are the growth of the workers' own counts (a worker's
count at first sight included), ``dead_lettered`` new dead letters, ``retried`` failed
attempts that did not end as dead letters, ``leader_changes`` changes of the first contender.
The duration histogram is observed from ``running/`` markers (start in the marker to the
moment its removal was seen), so a task shorter than the feed's refresh may be missed; each
process's own ``--metrics-port`` has exact durations.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from framework.dashboard.model import DURATION_BUCKETS, Model

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class ModelCollector(Collector):
    """Builds every metric family from the model at scrape time."""

    def __init__(self, model: Model) -> None:
        self.model = model

    def collect(self) -> Iterator[Metric]:
        apps = sorted(self.model.apps.items())
        counters = {
            "done": "Tasks finished successfully",
            "failed": "Task attempts that failed",
            "retried": "Failed task attempts that were retried",
            "dead_lettered": "Tasks moved to the dead-letter list",
        }
        for key, text in counters.items():
            family = CounterMetricFamily(f"framework_tasks_{key}", text, labels=["app"])
            for name, app in apps:
                family.add_metric([name], getattr(app.totals, key))
            yield family
        leader = CounterMetricFamily("framework_leader_changes",
                                     "Changes of an application's active master",
                                     labels=["app"])
        for name, app in apps:
            leader.add_metric([name], app.totals.leader_changes)
        yield leader
        gauges = {
            "framework_queue_depth": ("Items in the task queue (claimed ones included)",
                                      lambda a: a.depth),
            "framework_tasks_in_flight": ("Tasks being handled (running/ markers)",
                                          lambda a: len(a.running)),
            "framework_dead_letters": ("Dead letters waiting", lambda a: len(a.dead)),
            "framework_workers": ("Live workers", lambda a: len(a.workers)),
            "framework_masters": ("Masters in the election (leader and standbys)",
                                  lambda a: len(a.contenders)),
        }
        for metric, (text, value) in gauges.items():
            gauge = GaugeMetricFamily(metric, text, labels=["app"])
            for name, app in apps:
                gauge.add_metric([name], value(app))
            yield gauge
        histogram = HistogramMetricFamily("framework_task_duration_seconds",
                                          "Task durations seen from running/ markers",
                                          labels=["app"])
        for name, app in apps:
            bounds = [*(f"{b:g}" for b in DURATION_BUCKETS), "+Inf"]
            histogram.add_metric([name], list(zip(bounds, app.durations.counts, strict=True)),
                                 app.durations.total)
        yield histogram
        states = CounterMetricFamily("framework_session_state_changes",
                                     "State changes of the dashboard's ZooKeeper session",
                                     labels=["state"])
        for state, count in sorted(self.model.session_changes.items()):
            states.add_metric([state], count)
        yield states
        yield GaugeMetricFamily("framework_dashboard_viewers", "Pages open on the dashboard",
                                value=self.model.viewers)


def registry_for(model: Model) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ModelCollector(model))
    return registry


def render(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
