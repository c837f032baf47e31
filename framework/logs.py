"""structlog, configured once for the whole process.

Console output for humans by default; one JSON object per line when ``FRAMEWORK_LOG_JSON=1``.
``FRAMEWORK_LOG_LEVEL`` (``debug``, ``info``, ``warning``...) sets the threshold (default
``info``).  Event names are stable and dotted (``zk.session.connected``, ``election.elected``)
so they can be searched and alerted on.
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


def configure_logging(*, json: bool | None = None, level: str | None = None) -> None:
    """Configure structlog (idempotent; later calls with arguments reconfigure)."""
    global _configured
    if _configured and json is None and level is None:
        return
    _configured = True
    if json is None:
        json = os.environ.get("FRAMEWORK_LOG_JSON", "") not in ("", "0", "false", "no")
    level_name = (level or os.environ.get("FRAMEWORK_LOG_LEVEL") or "info").upper()
    threshold = logging.getLevelName(level_name)
    if not isinstance(threshold, int):
        threshold = logging.INFO
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer()
        if json
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            # JSON lines carry the traceback as text (the console renderer prints it itself)
            *([structlog.processors.format_exc_info] if json else []),
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
