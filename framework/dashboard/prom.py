"""The dashboard's ``/metrics``: Prometheus families built from the model at scrape time.

Names: ``framework_app_*`` for an application's numbers (label ``app``), summed over its
processes; ``framework_dashboard_*`` for the dashboard itself.  Each process's own
``--metrics-port`` endpoint (:mod:`framework.metrics`) uses ``framework_*`` names without
``app_``: a Prometheus that scrapes both and sums a name never counts a task twice.

The task counters and the duration histogram are the sums of what each live worker
publishes in its status record (:class:`~framework.metrics.TaskStats`: every task it ran,
timed by the process that ran it); they only grow while the dashboard runs (see
:meth:`~framework.dashboard.model.AppModel.set_workers`).  ``leader_changes`` counts changes
of the first contender that the dashboard saw.
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
from prometheus_client.utils import floatToGoString

from framework.dashboard.model import STATE_ORDER, Model

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class ModelCollector(Collector):
    """Builds every metric family from the model at scrape time."""

    def __init__(self, model: Model) -> None:
        self.model = model

    def collect(self) -> Iterator[Metric]:
        apps = sorted(self.model.apps.items())
        counters = {
            "done": "Tasks finished successfully (sum over the app's workers)",
            "failed": "Task attempts that failed (sum over the app's workers)",
            "retried": "Failed task attempts that were retried (sum over the app's workers)",
            "dead_lettered": "Task attempts that failed for good (sum over the app's workers)",
        }
        for key, text in counters.items():
            family = CounterMetricFamily(f"framework_app_tasks_{key}", text, labels=["app"])
            for name, app in apps:
                family.add_metric([name], getattr(app.totals, key))
            yield family
        leader = CounterMetricFamily("framework_app_leader_changes",
                                     "Changes of an application's active master",
                                     labels=["app"])
        for name, app in apps:
            leader.add_metric([name], app.leader_changes)
        yield leader
        depth = GaugeMetricFamily("framework_app_queue_depth",
                                  "Items in the app's task queue named by the queue label "
                                  "(default, or a named queue; claimed ones included)",
                                  labels=["app", "queue"])
        for name, app in apps:
            for queue, (items, _claimed) in sorted(app.queues.items()) or [("default", (0, 0))]:
                depth.add_metric([name, queue], items)
        yield depth
        gauges = {
            "framework_app_tasks_in_flight": ("Tasks being handled (running/ markers)",
                                              lambda a: len(a.running)),
            "framework_app_dead_letters": ("Dead letters waiting", lambda a: len(a.dead)),
            "framework_app_results": ("Result records of the app (succeeded, failed for good "
                                      "or revoked; 0 until first counted)",
                                      lambda a: a.results or 0),
            "framework_app_members": ("Live members of workers/ (every kind)",
                                      lambda a: len(a.workers)),
            "framework_app_masters": ("Masters in the election (leader and standbys)",
                                      lambda a: len(a.contenders)),
        }
        for metric, (text, value) in gauges.items():
            gauge = GaugeMetricFamily(metric, text, labels=["app"])
            for name, app in apps:
                gauge.add_metric([name], value(app))
            yield gauge
        state = GaugeMetricFamily("framework_app_state", "1 for the application's state "
                                  "(stale: no live process, neither done nor cancelled)",
                                  labels=["app", "state"])
        for name, app in apps:
            current = app.state
            for known in STATE_ORDER:
                state.add_metric([name, known], 1 if known == current else 0)
        yield state
        histogram = HistogramMetricFamily(
            "framework_app_task_duration_seconds",
            "Task attempt durations, timed by the processes that ran them (sum over the "
            "app's workers)", labels=["app"])
        for name, app in apps:
            durations = app.totals.durations
            bounds = [*(floatToGoString(b) for b in durations.bounds), "+Inf"]
            histogram.add_metric([name], list(zip(bounds, durations.counts, strict=True)),
                                 durations.sum)
        yield histogram
        states = CounterMetricFamily("framework_dashboard_session_state_changes",
                                     "State changes of the dashboard's ZooKeeper session",
                                     labels=["state"])
        for session_state, count in sorted(self.model.session_changes.items()):
            states.add_metric([session_state], count)
        yield states
        yield GaugeMetricFamily("framework_dashboard_viewers", "Pages open on the dashboard",
                                value=self.model.viewers)


def registry_for(model: Model) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ModelCollector(model))
    return registry


def render(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
