"""What an operator does to an application and reads about it.

:mod:`~framework.runtime.operations.status` gathers an app's status and the list of apps
(data: ``AppStatus``, ``AppSummary``); :mod:`~framework.runtime.operations.inspect` reads
what runs, waits and is scheduled now; :mod:`~framework.runtime.operations.actions` are the
operator's writes (requeue or discard a dead letter, cancel, resume, purge, rerun);
:mod:`~framework.runtime.operations.task_lookup` finds where a task is;
:mod:`~framework.runtime.operations.cancel` is the ``cancel`` znode every master and worker
watches.  Everything here returns data: printing it is the command line's job.  This wing
imports the runtime's data modules, :mod:`framework.runtime.scheduling` and
:mod:`framework.runtime.results` only; the layers above use it through this root.
"""

from framework.runtime.operations.actions import (
    ActionError,
    UnknownApp,
    discard,
    known_apps,
    lookup_result,
    requeue,
    require_app,
)
from framework.runtime.operations.cancel import is_cancelled, wait_cancelled
from framework.runtime.operations.inspect import (
    ActiveTask,
    DelayedReport,
    DelayedTask,
    QueueReport,
    ScheduleState,
    TypeRow,
    active,
    delayed_tasks,
    item_of,
    queue_report,
    queue_reports,
    schedule_rows,
    schedule_states,
    type_rows,
    unstructure,
)
from framework.runtime.operations.status import (
    AppState,
    AppStatus,
    AppSummary,
    Contender,
    Watches,
    gather_status,
    list_apps,
    result_count,
)
from framework.runtime.operations.task_lookup import where_is

__all__ = [
    "ActionError", "ActiveTask", "AppState", "AppStatus", "AppSummary", "Contender",
    "DelayedReport", "DelayedTask", "QueueReport", "ScheduleState", "TypeRow", "UnknownApp",
    "Watches", "active", "delayed_tasks", "discard", "gather_status", "is_cancelled",
    "item_of", "known_apps", "list_apps", "lookup_result", "queue_report", "queue_reports",
    "require_app",
    "requeue", "result_count", "schedule_rows", "schedule_states", "type_rows",
    "unstructure", "wait_cancelled", "where_is",
]
