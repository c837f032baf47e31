"""What follows a task: canvases (chain, group, chord) and success/failure callbacks.

:mod:`~framework.runtime.workflows.canvas` stores a canvas under ``canvases/`` and its
driver queues each step once the steps before it are done;
:mod:`~framework.runtime.workflows.callbacks` keeps a task's ``on_success``/``on_failure``
callback in the acknowledging multi and moves it into the queue.  This wing imports the
runtime's data modules and :mod:`framework.runtime.results` only; the layers above use it
through this root.
"""

from framework.runtime.workflows.callbacks import callback_for
from framework.runtime.workflows.canvas import (
    FAILED,
    SUCCEEDED,
    Canvas,
    CanvasDriver,
    CanvasRecord,
    Signature,
    apply_canvas,
    canvas_result,
    chain,
    chord,
    failure_text,
    group,
    sig,
    step_key,
)

__all__ = ["FAILED", "SUCCEEDED", "Canvas", "CanvasDriver", "CanvasRecord", "Signature",
           "apply_canvas", "callback_for", "canvas_result", "chain", "chord", "failure_text",
           "group", "sig", "step_key"]
