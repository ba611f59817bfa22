"""A cycle whose passed jobs' reasons no one reads (`ClusterState.runs_read` false, the simulator
without `on_cycle`) lists only the jobs it looked at, and decides exactly as one that lists them
all: in the random histories of `test_repeats.play` (walking even over a handful of jobs) and of
`test_preemption_memo.busy`, every decision is equal and every reason listed is the same."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corral.core import repeats
from corral.core.decisions import CycleResult
from corral.core.state import ClusterState
from tests.core import test_preemption_memo, test_repeats

_SUMMARY = test_repeats.summary


class _Unread:
    """`ClusterState` for `play` and `busy`: its states read no passed job's reason."""

    @staticmethod
    def build(*args: Any, **kwargs: Any) -> ClusterState:
        state = ClusterState.build(*args, **kwargs)
        state.runs_read = False
        return state


def _summary(result: CycleResult) -> tuple[Any, ...]:
    """`test_repeats.summary`, with the reasons as a dict (compared apart)."""
    listed = dict(result.reasons.items())
    return (*_SUMMARY(result)[:5], result.others, result.considered, result.next_wake, listed)


def _both(run: Any, module: Any, *args: Any) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(repeats, "FEW_JOBS", 0)
        patch.setattr(test_repeats, "summary", _summary)
        patch.setattr(test_preemption_memo, "summary", _summary)
        read = run(*args)
        patch.setattr(module, "ClusterState", _Unread)
        unread = run(*args)
    return read, unread


def _check(read: list[tuple[Any, ...]], unread: list[tuple[Any, ...]]) -> int:
    """Equal decisions; the reasons listed without runs are those listed with them; how many of
    the jobs were left out (the runs)."""
    assert len(read) == len(unread)
    left_out = 0
    for a, b in zip(read, unread, strict=True):
        assert a[:-1] == b[:-1]
        every, listed = a[-1], b[-1]
        assert all(every[job] == reason for job, reason in listed.items())
        left_out += len(every) - len(listed)
    return left_out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1),
    policy=st.sampled_from(["default", "las", "tiresias"]),
    limits=st.sampled_from([0, 4, 12]),
    budget=st.booleans(),  # (kept out by their queue's budget: admission runs told per part and key)
)
def test_unread_runs_decide_as_listed_ones(seed: int, policy: str, limits: int, budget: bool) -> None:
    _check(*_both(test_repeats.play, test_repeats, seed, policy, limits, budget))


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), policy=st.sampled_from(["default", "las"]))
def test_unread_runs_on_busy_clusters(seed: int, policy: str) -> None:
    _check(*_both(test_preemption_memo.busy, test_preemption_memo, seed, policy))


def test_runs_are_left_out() -> None:
    """The histories do pass jobs over in runs (else the tests above compare nothing)."""
    left_out = sum(_check(*_both(test_repeats.play, test_repeats, seed, "default", 12)) for seed in range(20))
    assert left_out > 0
