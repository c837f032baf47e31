"""Logged tracebacks never show local variables unless asked for (``FRAMEWORK_LOG_LOCALS=1``
or ``configure_logging(show_locals=True)``): a failing handler's locals may hold secrets.

Each case runs in a fresh interpreter (structlog's configuration is process-wide); a real
worker's log is checked the same way in tests/test_metrics.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent

PROGRAM = """
import sys
from framework.logs import configure_logging, get_logger
configure_logging({arguments})

def handler(token):
    api_key = token.upper()  # the secret exists only at run time
    raise ValueError("handler failed")

try:
    handler(sys.argv[1])
except ValueError as exc:
    get_logger("test").warning("task.failed", exc_info=exc)
"""


def _logged(arguments: str = "", **env: str) -> str:
    base = {k: v for k, v in os.environ.items()
            if k not in ("FRAMEWORK_LOG_LOCALS", "FRAMEWORK_LOG_JSON")}
    result = subprocess.run(
        [sys.executable, "-c", PROGRAM.format(arguments=arguments), "hunter2"],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
        env=base | {"FRAMEWORK_LOG_LEVEL": "info"} | env)
    assert result.returncode == 0, result.stderr
    assert "task.failed" in result.stderr and "handler failed" in result.stderr
    return result.stderr


@pytest.mark.parametrize("json", ["0", "1"])
def test_no_locals_by_default(json: str) -> None:
    logged = _logged(FRAMEWORK_LOG_JSON=json)
    assert "HUNTER2" not in logged and "hunter2" not in logged
    assert "in handler" in logged  # the traceback itself is there


@pytest.mark.parametrize("json", ["0", "1"])
def test_locals_when_asked_for(json: str) -> None:
    assert "HUNTER2" in _logged(FRAMEWORK_LOG_LOCALS="1", FRAMEWORK_LOG_JSON=json)
    assert "HUNTER2" in _logged("show_locals=True", FRAMEWORK_LOG_JSON=json)
    assert "HUNTER2" not in _logged("show_locals=False", FRAMEWORK_LOG_LOCALS="1",
                                    FRAMEWORK_LOG_JSON=json)
