"""The parts a :class:`~framework.runtime.Worker` is made of, each with one job.

:mod:`~framework.runtime.worker_parts.task_consumer` takes tasks (pull mode: slots, claims,
failures), one :class:`~framework.runtime.worker_parts.delivery.Delivery` per claimed item;
:mod:`~framework.runtime.worker_parts.markers` are the ``running/`` markers,
:mod:`~framework.runtime.worker_parts.handlers` where a handler runs (trio, a thread or a
process) and :mod:`~framework.runtime.worker_parts.soft_limit` the soft time limit inside
async handlers; :mod:`~framework.runtime.worker_parts.shard_server` serves the shards the
master assigns (push mode); :mod:`~framework.runtime.worker_parts.duties` does the master's
duties in worker-only deployments.  A part reads its worker through the small protocols of
:mod:`~framework.runtime.worker_parts.hosts`, never ``Worker`` itself.  This is the top
wing: it may import the other wings and the master (duties reuse the master's defaults and
schedulers); the layers above use it through this root.
"""

from framework.runtime.worker_parts.duties import Duties, check_schedules
from framework.runtime.worker_parts.handlers import HANDLER_POOLS, HandlerPool, check_handler
from framework.runtime.worker_parts.shard_server import ShardServer
from framework.runtime.worker_parts.soft_limit import SoftTimeLimitExceeded, run_with_soft_limit
from framework.runtime.worker_parts.task_consumer import TaskConsumer

__all__ = ["HANDLER_POOLS", "Duties", "HandlerPool", "ShardServer", "SoftTimeLimitExceeded",
           "TaskConsumer", "check_handler", "check_schedules", "run_with_soft_limit"]
