"""Helpers for context managers that run their caller's body inside a nursery."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def single_body_error() -> Iterator[None]:
    """Re-raise the one error of a nursery unwrapped.

    A context manager that yields inside a nursery would otherwise hand the caller's own
    exception back wrapped in an ``ExceptionGroup`` (trio's strict exception groups), so
    ``except ValueError`` around ``async with election.leadership():`` would miss it.
    Nested groups of one error each are unwrapped too; groups of several errors pass
    through unchanged.
    """
    try:
        yield
    except BaseExceptionGroup as group:
        if len(group.exceptions) != 1:
            raise
        inner = group.exceptions[0]
        while isinstance(inner, BaseExceptionGroup) and len(inner.exceptions) == 1:
            inner = inner.exceptions[0]
        context, suppress = inner.__context__, inner.__suppress_context__
        try:
            raise inner  # the group was only trio's wrapper
        finally:
            inner.__context__, inner.__suppress_context__ = context, suppress
