"""A cycle formats each protection sentence once per (reason, end) and gives the same answer.

`preemption.Preemption._with_protection` remembers, for one cycle, the reason that names when
the victims' `min_runtime` protection ends, per reason object and end; the jobs of a family
(and every family with the same capacity sentence) are told it without a new sentence. The
histories of `test_repeats.play` (0 to 40 time limits), `test_preemption_memo.busy` and the
two-model clusters of `test_victim_nodes.mixed` under `las`, `tiresias` and `default`, walked
and looked at job by job, with the memory and without (`preemption.SAME_SENTENCES`): every
decision and reason must match (they differ when the memory forgets the end or the reason).
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corral.core import preemption
from tests.core.test_preemption_memo import both, busy
from tests.core.test_repeats import play
from tests.core.test_victim_nodes import mixed

SWITCH = (preemption, "SAME_SENTENCES")
POLICIES = st.sampled_from(["las", "tiresias", "default"])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), policy=POLICIES, limits=st.sampled_from([0, 3, 40]))
def test_backlogs_are_told_the_same_protection(seed: int, policy: str, limits: int) -> None:
    remembered, formatted = both(play, seed, policy, limits, switch=SWITCH)
    assert remembered == formatted


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), policy=POLICIES, walk=st.booleans())
def test_busy_clusters_are_told_the_same_protection(seed: int, policy: str, walk: bool) -> None:
    remembered, formatted = both(busy, seed, policy, walk=walk, switch=SWITCH)
    assert remembered == formatted


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), walk=st.booleans())
def test_two_models_are_told_the_same_protection(seed: int, walk: bool) -> None:
    remembered, formatted = both(mixed, seed, "las", walk=walk, switch=SWITCH)
    assert remembered == formatted
