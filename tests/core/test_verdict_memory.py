"""A family's capacity verdict built from remembered sentence objects is the verdict built anew.

`capacity_reasons.Sentences` answers a sentence asked with `reasons.RUNS` (a walk's family
verdict, `_Cycle.family_verdict`) with its remembered template itself, one object while it is
remembered, and `CapacityReasons.per_limit` splits such a sentence for a family's `PerLimit` once
per sentence object and time limit in a cycle (`capacity_reasons.SAME_TEMPLATE`). The random
histories of `test_repeats.play` (reservations, backfill attempts, preemption, jobs that differ
by their time limits) and `test_preemption_memo.busy` run with the memory and without (every
template concatenated and split anew), under `default`, `las` and `tiresias`: every decision and
every job's reason must be identical.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corral.core import capacity_reasons, repeats
from corral.core import limits as limits_module
from corral.core.decisions import Reason, Why
from corral.core.model import NodeName, NodeSpec, QueueName, QueueSpec
from corral.core.reasons import RUNS
from corral.core.state import ClusterState
from tests.core.test_preemption_memo import both, busy
from tests.core.test_repeats import play

SWITCH = (capacity_reasons, "SAME_TEMPLATE")


def _both(run: Any, *args: Any) -> tuple[Any, Any]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(repeats, "FEW_JOBS", 0)  # walk even a handful of jobs
        patch.setattr(limits_module, "BLOCK", 2)
        return both(run, *args, switch=SWITCH)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1),
    policy=st.sampled_from(["default", "las", "tiresias"]),
    limits=st.sampled_from([0, 4, 12, 40]),
)
def test_verdicts_from_remembered_sentences_are_the_verdicts_built_anew(
    seed: int, policy: str, limits: int
) -> None:
    remembered, built = _both(play, seed, policy, limits)
    assert remembered == built


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), policy=st.sampled_from(["default", "las", "tiresias"]))
def test_verdicts_from_remembered_sentences_on_busy_clusters(seed: int, policy: str) -> None:
    remembered, built = _both(busy, seed, policy)
    assert remembered == built


def test_per_limit_names_each_limit_its_own_end() -> None:
    """One sentence object, two time limits: two `PerLimit`s, each naming its own end."""
    nodes = [NodeSpec(NodeName("n0"), 8, "H100-80GB", labels={"leaf": "l0"})]
    state = ClusterState.build(("leaf",), nodes, [QueueSpec(QueueName("q"))])
    why = capacity_reasons.CapacityReasons(state, 0.0, [])
    template = Reason(Why.BEHIND_RESERVATION, f"held for j1's reservation at 1h, and {RUNS}: delay", 3600.0)
    short, long = why.per_limit(template, 600.0), why.per_limit(template, 7200.0)
    assert short is not None and long is not None
    assert short.reason != long.reason
    assert why.per_limit(template, 600.0) is short
    assert short.resolve(7200.0) == long.reason
    assert why.per_limit(Reason(Why.CAPACITY, "no placeholder"), 600.0) is None
