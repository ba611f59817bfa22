"""A family's capacity verdict built from remembered sentence objects is the verdict built anew.

`capacity_reasons.Sentences` answers a sentence asked with `reasons.RUNS` (a walk's family
verdict, `_Cycle.family_verdict`) with its remembered template itself, one object while it is
remembered, instead of joining its parts around `RUNS` again (`capacity_reasons.SAME_TEMPLATE`);
the protection sentence is then remembered per sentence object too. The random
histories of `test_repeats.play` (reservations, backfill attempts, preemption, jobs that differ
by their time limits) and `test_preemption_memo.busy` run with the memory and without (every
sentence joined anew), under `default`, `las` and `tiresias`: every decision and
every job's reason must be identical.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corral.core import capacity_reasons, repeats
from corral.core import limits as limits_module
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
