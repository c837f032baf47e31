"""When tasks run later: delayed tasks (``countdown=``/``eta=``) and periodic schedules.

:mod:`~framework.runtime.scheduling.delayed` keeps a delayed task under ``delayed/`` and
moves it into the queue at its due time; :mod:`~framework.runtime.scheduling.schedules`
fires ``every``/``cron`` slots, each once.  Both are run by the active master or a worker
holding the app's duties, fenced by its term.  This wing imports the runtime's data modules
and :mod:`framework.runtime.results` only; the layers above use it through this root.
"""

from framework.runtime.scheduling.delayed import DelayedMover, DelayedRecord, due_of
from framework.runtime.scheduling.schedules import (
    CatchUp,
    Schedule,
    Scheduler,
    ScheduleRecord,
    cron,
    every,
)

__all__ = ["CatchUp", "DelayedMover", "DelayedRecord", "Schedule", "ScheduleRecord",
           "Scheduler", "cron", "every", "due_of"]
