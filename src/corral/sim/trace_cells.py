"""Typed parsing of one CSV cell, with errors that name the file, the line, the column and the fix."""

from __future__ import annotations

import math

from corral.core.errors import TraceError

_MAX = 1.7976931348623157e308  # the largest finite float: a NaN or an infinity fails `0 <= x <= _MAX`


def cell_error(path: object, line: int, column: str, what: str, fix: str) -> TraceError:
    """The error for one bad cell: `file, line N, column 'c': what is wrong (fix: how to fix it)`."""
    return TraceError(f"{path}, line {line}, column {column!r}: {what} (fix: {fix})")


def _empty(text: str, path: object, line: int, column: str) -> None:
    """Raise the error for a required cell left empty."""
    if not text.strip():
        raise cell_error(path, line, column, "the cell is empty", f"{column} is required: give a value")


def parse_float(text: str, path: object, line: int, column: str) -> float:
    """A finite number."""
    try:
        value = float(text)
    except ValueError:
        _empty(text, path, line, column)
        raise cell_error(
            path, line, column, f"{text!r} is not a number", "write a plain number such as 60 or 3600.5"
        ) from None
    if not math.isfinite(value):
        raise cell_error(path, line, column, f"{text!r} is not a finite number", "write a finite number")
    return value


def parse_seconds(text: str, path: object, line: int, column: str) -> float:
    """A finite number of seconds, 0 or more."""
    try:
        value = float(text)
    except ValueError:
        _empty(text, path, line, column)
        raise cell_error(
            path, line, column, f"{text!r} is not a number", "write seconds as a plain number such as 3600"
        ) from None
    if not 0.0 <= value <= _MAX:
        what = "negative" if value < 0 else "not a finite number"
        raise cell_error(path, line, column, f"{text!r} is {what}", "write 0 or more seconds")
    return value


def parse_count(text: str, path: object, line: int, column: str, *, minimum: int = 0) -> int:
    """A whole number of at least `minimum` (an integral float such as `8.0` is accepted)."""
    try:
        value = int(text)
    except ValueError:
        value = _integral_float(text, path, line, column)
    if value < minimum:
        raise cell_error(
            path,
            line,
            column,
            f"{text!r} is less than {minimum}",
            f"write a whole number of {minimum} or more",
        )
    return value


def _integral_float(text: str, path: object, line: int, column: str) -> int:
    try:
        number = float(text)
    except ValueError:
        _empty(text, path, line, column)
        number = math.nan
    if not number.is_integer():
        raise cell_error(path, line, column, f"{text!r} is not a whole number", "write an integer such as 8")
    return int(number)


_TRUE = frozenset({"true", "1"})
_FALSE = frozenset({"false", "0"})


def parse_bool(text: str, path: object, line: int, column: str) -> bool:
    """`true`, `false`, `1` or `0` (any letter case, surrounding spaces ignored)."""
    word = text.strip().lower()
    if word in _TRUE:
        return True
    if word in _FALSE:
        return False
    raise cell_error(path, line, column, f"{text!r} is not a boolean", "write true, false, 1 or 0")


def column_indices(header: list[str] | None, required: tuple[str, ...], path: object) -> dict[str, int]:
    """Column name -> index for a source file's header; every `required` name must be there."""
    names = [name.strip() for name in header or []]
    missing = [name for name in required if name not in names]
    if missing:
        found = ", ".join(repr(n) for n in names) if names else "nothing (the file is empty)"
        raise TraceError(
            f"{path}, line 1: missing required column(s) {', '.join(missing)}; the header has {found}"
            f" (fix: the header must name {', '.join(required)})"
        )
    return {name: index for index, name in enumerate(names)}
