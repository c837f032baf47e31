"""Where results live and how they are trimmed: the result index and retention.

:mod:`~framework.runtime.results.result_index` keeps each result, dead letter and failure
record under a numbered slot (``queued`` marks, slot keepers);
:mod:`~framework.runtime.results.retention` and
:mod:`~framework.runtime.results.retention_results` delete the oldest beyond an app's limits,
fenced by the deleter's term.  This wing imports only the runtime's data modules (``app``,
``records``, ``tasks``); the layers above use it through this root.
"""

from framework.runtime.results.result_index import slot_of
from framework.runtime.results.retention import Limit, Retention, limits_of

__all__ = ["Limit", "Retention", "limits_of", "slot_of"]
