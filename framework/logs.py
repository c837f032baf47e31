"""structlog, configured once for the whole process.

Console output for humans by default; one JSON object per line when ``FRAMEWORK_LOG_JSON=1``.
``FRAMEWORK_LOG_LEVEL`` (``debug``, ``info``, ``warning``...) sets the threshold (default
``info``).  A logged exception's traceback never shows the local variables of its frames (a
failing handler's locals may hold secrets) unless asked for: ``FRAMEWORK_LOG_LOCALS=1`` or
``configure_logging(show_locals=True)``.  Event names are stable and dotted
(``zk.session.connected``, ``election.elected``) so they can be searched and alerted on.
"""

from __future__ import annotations

import logging
import os
import sys

import structlog

_configured = False


class _CurrentStderr:
    """Writes to whatever ``sys.stderr`` is at write time, not at configuration time: a
    stream swapped later (pytest's capture, a redirect) is followed, a closed one never
    kept."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


def _flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no")


def configure_logging(*, json: bool | None = None, level: str | None = None,
                      show_locals: bool | None = None) -> None:
    """Configure structlog (idempotent; later calls with arguments reconfigure).

    ``None`` takes the environment's setting (see the module doc); ``show_locals``: print
    the local variables of each frame of a logged traceback (off by default)."""
    global _configured
    if _configured and json is None and level is None and show_locals is None:
        return
    _configured = True
    if json is None:
        json = _flag("FRAMEWORK_LOG_JSON")
    if show_locals is None:
        show_locals = _flag("FRAMEWORK_LOG_LOCALS")
    level_name = (level or os.environ.get("FRAMEWORK_LOG_LEVEL") or "info").upper()
    threshold = logging.getLevelName(level_name)
    if not isinstance(threshold, int):
        threshold = logging.INFO
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer()
        if json
        else structlog.dev.ConsoleRenderer(
            colors=sys.stderr.isatty(),
            exception_formatter=structlog.dev.RichTracebackFormatter(
                color_system="auto", show_locals=show_locals))
    )
    # JSON lines carry the traceback as text, or as a structure with the locals if asked for
    # (the console renderer prints it itself)
    exceptions: list[structlog.typing.Processor] = []
    if json:
        exceptions = [structlog.processors.ExceptionRenderer(
            structlog.tracebacks.ExceptionDictTransformer(show_locals=True))
            if show_locals else structlog.processors.format_exc_info]
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            *exceptions,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(threshold),
        logger_factory=structlog.PrintLoggerFactory(file=_CurrentStderr()),  # type: ignore[arg-type]
        cache_logger_on_first_use=False,
    )
    # kazoo logs every reconnect attempt through the standard library; keep only problems.
    logging.getLogger("kazoo").setLevel(logging.ERROR)


def get_logger(name: str) -> structlog.typing.FilteringBoundLogger:
    """A logger bound with ``component=name``.  Logging is configured on first use only if
    nobody configured structlog yet: a host application's own configuration is kept (the
    CLI and the demos call :func:`configure_logging` themselves)."""
    if not _configured and not structlog.is_configured():
        configure_logging()
    return structlog.get_logger(component=name)
