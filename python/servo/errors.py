"""Error plumbing shared by every layer: the one error that ended a run of nested task groups."""

from __future__ import annotations


def first_error(exc: BaseException) -> BaseException:
    """The single error inside (possibly nested) task-group exception groups, else ``exc``."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc
