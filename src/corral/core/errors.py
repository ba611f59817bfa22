"""The one exception root of Corral and its tree.

Expected scheduling outcomes (a job that waits, a job rejected) are values, not exceptions;
these are for bad input at the edges and for bugs::

    CorralError
    ├── ConfigError        a cluster file, job spec or policy profile is invalid (names the place and the fix)
    ├── TraceError         a trace row is malformed (names the file, the row and the column)
    └── InvariantError     the scheduler's own state broke a promise (a bug: never caught)
"""

from __future__ import annotations


class CorralError(Exception):
    """Root of every error Corral raises on purpose."""


class ConfigError(CorralError):
    """Invalid configuration: the message names the file, the field or line, and the fix."""

    def __init__(self, message: str, *, source: str = "", where: str = "", fix: str = "") -> None:
        self.source = source
        self.where = where
        self.fix = fix
        self.detail = message
        parts = [p for p in (source, where) if p]
        text = f"{': '.join(parts)}: {message}" if parts else message
        if fix:
            text += f" (fix: {fix})"
        super().__init__(text)


class TraceError(CorralError):
    """A malformed trace: the message names the file, the row and the column."""


class InvariantError(CorralError):
    """The scheduler's state broke one of its promises; always a bug."""
