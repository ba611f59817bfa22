"""Capacity sentences remembered within a cycle (`reasons.Sentences`) are the sentences built anew.

The random histories of `test_repeats.play` (reservations, backfill attempts, preemption, jobs
that differ by their time limits) run twice, once with the memory and once building every
sentence; every decision and every job's reason must be identical.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corral.core import reasons
from tests.core.test_repeats import play


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1),
    policy=st.sampled_from(["default", "las", "tiresias", "default"]),
    limits=st.sampled_from([0, 4, 12]),
)
def test_remembered_sentences_are_the_sentences_built_anew(seed: int, policy: str, limits: int) -> None:
    remembered = play(seed, policy, limits)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(reasons, "REMEMBER_SENTENCES", False)
        built = play(seed, policy, limits)
    assert remembered == built
