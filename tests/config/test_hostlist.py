"""Slurm hostlist expansion."""

from __future__ import annotations

import pytest

from corral.config.hostlist import expand_hostlist
from corral.config.invalid import InvalidValue


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("dgx01", ["dgx01"]),
        ("dgx[01-03]", ["dgx01", "dgx02", "dgx03"]),
        ("dgx[08-10]", ["dgx08", "dgx09", "dgx10"]),
        ("n[1-3,7]", ["n1", "n2", "n3", "n7"]),
        ("n[9-11]", ["n9", "n10", "n11"]),
        ("n[001-002]", ["n001", "n002"]),
        ("a[1-2]b[1-2]", ["a1b1", "a1b2", "a2b1", "a2b2"]),
        ("a,b[1-2]", ["a", "b1", "b2"]),
        ("rack[1-2]-gpu[0-1]", ["rack1-gpu0", "rack1-gpu1", "rack2-gpu0", "rack2-gpu1"]),
        (" x , y ", ["x", "y"]),
        ("[1-2]x", ["1x", "2x"]),
        ("node.example[1-2]", ["node.example1", "node.example2"]),
    ],
)
def test_expands(text: str, names: list[str]) -> None:
    assert expand_hostlist(text) == names


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("dgx[08-01]", "runs backwards"),
        ("dgx[01-", "never closed"),
        ("dgx[a-b]", "not a number range"),
        ("", "empty"),
        ("   ", "empty"),
        ("dgx[]", "empty brackets"),
        ("dgx01]", "without '['"),
        ("dgx[1-[2]]", "nested"),
        ("a,,b", "empty name"),
        ("a,", "empty name"),
        ("dgx[1-3,]", "not a number range"),
        ("dgx 01", "unexpected character"),
    ],
)
def test_malformed_raises_value_error_with_the_correct_form(text: str, problem: str) -> None:
    with pytest.raises(ValueError, match=r"\[01-08\]") as info:
        expand_hostlist(text)
    assert problem in str(info.value)
    assert isinstance(info.value, InvalidValue)


def test_backwards_range_suggests_the_swap() -> None:
    with pytest.raises(InvalidValue) as info:
        expand_hostlist("dgx[08-01]")
    assert info.value.fix == "write the low number first, e.g. [01-08]"
