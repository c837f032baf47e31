"""Running a master or a worker as a process: ``run_component`` and ``load_class``.

:mod:`~framework.runtime.launch.runner` connects a session, runs one ``Master`` or
``Worker`` until it is done, and turns SIGTERM/Ctrl-C into a graceful stop (a second signal
cancels); ``load_class`` resolves ``package.module:Class`` with one-line errors.  The top of
the runtime: it imports the master and the worker, nothing imports it but the package root
and the layers above (``framework run``, ``framework.testing``).
"""

from framework.runtime.launch.runner import load_class, run_component

__all__ = ["load_class", "run_component"]
