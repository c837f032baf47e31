"""argparse number types shared by every command line (the framework's and the examples').

Each parses its text and checks its bounds; a mistake is one line (argparse's ``error:``
line, exit status 2), never a traceback.
"""

from __future__ import annotations

import argparse
from typing import Any, Callable


def _bounded(kind: type[Any], what: str, low: float, high: float | None = None,
             *, above: bool = False) -> Callable[[str], Any]:
    """An argparse type: ``kind`` parsed from the text and checked against its bounds
    (``above``: strictly above ``low``), each mistake one line."""
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not {what}: {text!r}") from None
        if high is not None and not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be between {low:g} and {high:g}: {text!r}")
        if (value <= low) if above else (value < low):
            bound = "positive" if above and low == 0 else f"{low:g} or more"
            raise argparse.ArgumentTypeError(f"must be {bound}: {text!r}")
        return value

    return parse


#: argparse types shared by every command line (the framework's and the examples')
positive_seconds = _bounded(float, "a number of seconds", 0, above=True)
non_negative_seconds = _bounded(float, "a number of seconds", 0)
positive_int = _bounded(int, "a whole number", 1)
non_negative_int = _bounded(int, "a whole number", 0)
port_number = _bounded(int, "a port number", 0, 65535)
