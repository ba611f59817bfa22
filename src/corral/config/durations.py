"""Durations with units (`90m`, `4h`, `1h30m`, `7d`) or Slurm's `D-HH:MM:SS`, as float seconds."""

from __future__ import annotations

import math
import re

from corral.config.invalid import InvalidValue

__all__ = ["format_duration", "parse_duration"]

_UNIT_SECONDS = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0}
_UNITS = re.compile(r"(\d+(?:\.\d+)?)([dhms])")
_DAYS = re.compile(r"(\d+)-(\d+)(?::(\d+))?(?::(\d+))?")
_CLOCK = re.compile(r"(\d+):(\d+)(?::(\d+))?")
_FORMS = "write it with a unit, e.g. 90m, 4h, 1h30m or 7d, or as Slurm's D-HH:MM:SS"


def parse_duration(value: object, *, allow_seconds: bool = False) -> float:
    """Seconds in `value`; a bare number is refused (no unit) unless `allow_seconds`.

    Raises InvalidValue (a ValueError) that says what is wrong and the correct form.
    """
    if isinstance(value, bool):
        raise InvalidValue(f"{value!r} is not a duration", _FORMS)
    if isinstance(value, int | float):
        if not allow_seconds:
            raise InvalidValue(f"duration {value!r} has no unit", _bare_hint(value))
        return _checked(float(value), value)
    if not isinstance(value, str):
        raise InvalidValue(f"{value!r} is not a duration", _FORMS)
    text = "".join(value.split()).lower()
    if not text:
        raise InvalidValue("the duration is empty", _FORMS)
    if re.fullmatch(r"\d+(?:\.\d+)?", text):
        if allow_seconds:
            return float(text)
        raise InvalidValue(f"duration {value!r} has no unit", _bare_hint(text))
    seconds = _parse_units(text)
    if seconds is None:
        seconds = _parse_slurm(text, value)
    return _checked(seconds, value)


def _bare_hint(number: object) -> str:
    return f"add a unit ({number}s, {number}m, {number}h...), e.g. 90m or 4h"


def _checked(seconds: float, value: object) -> float:
    if math.isnan(seconds) or math.isinf(seconds) or seconds < 0:
        raise InvalidValue(f"{value!r} is not a finite, non-negative duration", _FORMS)
    return seconds


def _parse_units(text: str) -> float | None:
    """`1d12h`, `1h30m`, `90s`: units from largest to smallest, each at most once."""
    pos = 0
    total = 0.0
    last = -1
    order = "dhms"
    for match in _UNITS.finditer(text):
        if match.start() != pos:
            return None
        rank = order.index(match.group(2))
        if rank <= last:
            raise InvalidValue(f"units out of order or repeated in {text!r}", _FORMS)
        last = rank
        total += float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
        pos = match.end()
    return total if pos == len(text) and pos else None


def _parse_slurm(text: str, value: object) -> float:
    """`D-HH:MM:SS`, `D-HH:MM`, `D-HH`, `HH:MM:SS`, `MM:SS`."""
    match = _DAYS.fullmatch(text)
    if match is not None:
        days, hours, minutes, seconds = (int(g) if g else 0 for g in match.groups())
        _check_clock(value, (hours, 24), (minutes, 60), (seconds, 60))
        return days * 86400.0 + hours * 3600.0 + minutes * 60.0 + seconds
    match = _CLOCK.fullmatch(text)
    if match is not None:
        first, second, third = match.groups()
        if third is None:
            _check_clock(value, (int(second), 60))
            return int(first) * 60.0 + int(second)
        _check_clock(value, (int(second), 60), (int(third), 60))
        return int(first) * 3600.0 + int(second) * 60.0 + int(third)
    raise InvalidValue(f"{value!r} is not a duration", _FORMS)


def _check_clock(value: object, *fields: tuple[int, int]) -> None:
    for number, bound in fields:
        if number >= bound:
            raise InvalidValue(f"{value!r} has a field of {number}, above {bound - 1}", _FORMS)


def format_duration(seconds: float) -> str:
    """The shortest unit form that parses back to `seconds`: 5400 -> `1h30m`, 0 -> `0s`."""
    if math.isnan(seconds) or math.isinf(seconds) or seconds < 0:
        raise ValueError(f"cannot format {seconds!r} as a duration")
    whole = int(seconds)
    fraction = round(seconds - whole, 6)
    parts: list[str] = []
    for unit in "dhm":
        count, whole = divmod(whole, int(_UNIT_SECONDS[unit]))
        if count:
            parts.append(f"{count}{unit}")
    if whole or fraction or not parts:
        rest = f"{whole + fraction:.6f}".rstrip("0").rstrip(".")
        parts.append(f"{rest}s")
    return "".join(parts)
