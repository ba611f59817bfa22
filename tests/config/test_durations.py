"""Durations with units and in Slurm's forms, and their formatting."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from corral.config.durations import format_duration, parse_duration
from corral.config.invalid import InvalidValue


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90s", 90),
        ("90m", 5400),
        ("4h", 14400),
        ("1h30m", 5400),
        ("7d", 604800),
        ("1d12h", 129600),
        ("1d2h3m4s", 93784),
        ("1.5h", 5400),
        ("1h 30m", 5400),
        ("4H", 14400),
        ("0s", 0),
        ("1-00:00:00", 86400),
        ("2-03:04:05", 2 * 86400 + 3 * 3600 + 4 * 60 + 5),
        ("1-12", 129600),
        ("1-12:30", 129600 + 1800),
        ("01:30:00", 5400),
        ("100:00:00", 360000),
        ("90:00", 5400),
        ("05:30", 330),
    ],
)
def test_parses(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("value", ["90", "4", 90, 4.5, "1.5"])
def test_a_bare_number_is_refused_with_a_hint(value: object) -> None:
    with pytest.raises(InvalidValue) as info:
        parse_duration(value)
    assert "no unit" in info.value.message
    assert "90m or 4h" in info.value.fix
    assert "90m or 4h" in str(info.value)


def test_seconds_are_accepted_where_the_caller_allows_them() -> None:
    assert parse_duration(90, allow_seconds=True) == 90.0
    assert parse_duration(2.5, allow_seconds=True) == 2.5
    assert parse_duration("30", allow_seconds=True) == 30.0
    assert parse_duration("1m", allow_seconds=True) == 60.0


@pytest.mark.parametrize(
    "value",
    [
        "",
        "h",
        "4x",
        "m30",
        "30m1h",
        "1h1h",
        "1-24",
        "1:60",
        "1:00:60",
        "-5m",
        "abc",
        True,
        None,
        [],
        "1-",
        "1::2",
    ],
)
def test_malformed_is_refused_with_the_correct_forms(value: object) -> None:
    with pytest.raises(ValueError, match="90m"):
        parse_duration(value)


def test_negative_seconds_are_refused() -> None:
    with pytest.raises(InvalidValue):
        parse_duration(-1, allow_seconds=True)
    with pytest.raises(InvalidValue):
        parse_duration(float("inf"), allow_seconds=True)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (5400, "1h30m"),
        (0, "0s"),
        (90, "1m30s"),
        (604800, "7d"),
        (129600, "1d12h"),
        (93784, "1d2h3m4s"),
        (1.5, "1.5s"),
        (3600.25, "1h0.25s"),
    ],
)
def test_formats(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


@pytest.mark.parametrize("seconds", [-1.0, float("nan"), float("inf")])
def test_format_refuses_what_is_not_a_duration(seconds: float) -> None:
    with pytest.raises(ValueError):
        format_duration(seconds)


@given(st.integers(min_value=0, max_value=10**9))
def test_round_trip_whole_seconds(seconds: int) -> None:
    assert parse_duration(format_duration(seconds)) == seconds


@given(st.integers(min_value=0, max_value=10**7), st.integers(min_value=0, max_value=999))
def test_round_trip_milliseconds(whole: int, millis: int) -> None:
    seconds = whole + millis / 1000
    assert parse_duration(format_duration(seconds)) == pytest.approx(seconds, abs=1e-6)
