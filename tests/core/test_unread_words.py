"""A cycle whose reasons' words no one reads (`ClusterState.words_read` and `runs_read` false, the
simulator without `on_cycle`) writes no capacity sentence (`capacity_reasons.UNREAD_WORDS`), and
decides exactly as one that writes them: in the random histories of `test_repeats.play`,
`test_preemption_memo.busy` and `test_victim_nodes.mixed` (nodes cordoned now and then), every
decision is equal and every job listed is told the same code and time (`Reason.at`); with the
switch off, the words are those written where they are read.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corral.core import capacity_reasons, repeats
from corral.core.decisions import CycleResult, Reason, Why
from corral.core.model import NodeState
from corral.core.state import ClusterState
from tests.core import test_preemption_memo, test_repeats, test_victim_nodes

_SUMMARY = test_repeats.summary
_CHURN = test_preemption_memo.cycle_then_churn


def _unread(words: bool) -> type:
    class _State:
        """`ClusterState` for the histories: its states read no passed job's reason (and, unless
        `words`, no reason's words)."""

        @staticmethod
        def build(*args: Any, **kwargs: Any) -> ClusterState:
            state = ClusterState.build(*args, **kwargs)
            state.runs_read = False
            state.words_read = words
            return state

    return _State


def _told(why: Reason | None) -> tuple[Any, ...] | None:
    return None if why is None else (why.code, why.at)


def _summary(result: CycleResult) -> tuple[Any, ...]:
    """`test_repeats.summary` with every reason as its code and time, and the words apart."""
    listed = dict(result.reasons.items())
    told = {job: _told(why) for job, why in listed.items()}
    words = {job: why.message for job, why in listed.items()}
    decided = (*_SUMMARY(result)[:5], _told(result.others), result.considered, result.next_wake)
    return (*decided, told, words)


def _churn_cordoning(state: ClusterState, profile: Any, rng: random.Random, now: float, out: Any) -> float:
    """`cycle_then_churn`, then a node cordoned or uncordoned now and then (unavailable nodes are
    named in capacity sentences: those are written)."""
    now = _CHURN(state, profile, rng, now, out)
    if rng.random() < 0.3:
        node = rng.randrange(len(state.specs))
        up = node in state.unschedulable
        state.set_node_state(state.specs[node].name, NodeState.UP if up else NodeState.CORDONED)
    return now


def _runs(run: Any, module: Any, *args: Any) -> tuple[list[Any], list[Any], list[Any]]:
    """The history with words written, unwritten, and unwritten with the switch off."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(repeats, "FEW_JOBS", 0)
        patch.setattr(test_repeats, "summary", _summary)
        patch.setattr(test_preemption_memo, "summary", _summary)
        patch.setattr(module, "ClusterState", _unread(True))
        if module is test_victim_nodes:
            patch.setattr(test_victim_nodes, "cycle_then_churn", _churn_cordoning)
        written = run(*args)
        patch.setattr(module, "ClusterState", _unread(False))
        unwritten = run(*args)
        patch.setattr(capacity_reasons, "UNREAD_WORDS", False)
        switched_off = run(*args)
    return written, unwritten, switched_off


def _check(written: list[Any], unwritten: list[Any], switched_off: list[Any]) -> int:
    """Equal decisions, codes and times; the switch off writes every word; how many reasons
    were left unwritten behind a reservation (the code whose time and placeholder matter)."""
    assert switched_off == written
    assert len(written) == len(unwritten)
    behind = 0
    for a, b in zip(written, unwritten, strict=True):
        assert a[:-1] == b[:-1]
        behind += sum(
            1
            for job, words in b[-1].items()
            if words != a[-1][job] and b[-2][job][0] is Why.BEHIND_RESERVATION
        )
    return behind


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1),
    policy=st.sampled_from(["default", "las", "tiresias"]),
    limits=st.sampled_from([0, 4, 12]),
    budget=st.booleans(),
)
def test_unwritten_words_decide_as_written_ones(seed: int, policy: str, limits: int, budget: bool) -> None:
    _check(*_runs(test_repeats.play, test_repeats, seed, policy, limits, budget))


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), policy=st.sampled_from(["default", "las"]))
def test_unwritten_words_on_busy_clusters(seed: int, policy: str) -> None:
    _check(*_runs(test_preemption_memo.busy, test_preemption_memo, seed, policy))


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), policy=st.sampled_from(["default", "las", "tiresias"]))
def test_unwritten_words_with_cordoned_nodes(seed: int, policy: str) -> None:
    _check(*_runs(test_victim_nodes.mixed, test_victim_nodes, seed, policy))


def test_words_are_left_unwritten_behind_reservations() -> None:
    """The histories do leave sentences behind reservations unwritten (else the tests above
    compare no time)."""
    behind = sum(_check(*_runs(test_repeats.play, test_repeats, seed, "default", 12)) for seed in range(20))
    assert behind > 0
