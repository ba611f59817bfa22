"""Jobs whose victim search surely finds no candidates, told without a look, are told and decided
as if looked at (`corral.core.no_search`, switch `AHEAD`).

A walk passes over such a job (`_Cycle.family_verdict(ahead=True)`) and makes its search when
telling it (`_Cycle.tell`): the try it counts (towards `max_preemption_tries`) and the queue found
to have no victims for its class and size are as after a look. The histories of
`test_repeats.play`, `test_preemption_memo.busy` and `test_victim_nodes.mixed` under `las`,
`default` and `tiresias`, with and without it: every decision and reason must match. They differ
when the search is not made when telling (tries and the queues' memory fall behind), or when a
job whose (shape, time limit) is blocked already (a look searches nothing) lets its family pass.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corral.core import no_search
from tests.core.test_preemption_memo import both, busy
from tests.core.test_repeats import play
from tests.core.test_victim_nodes import mixed

POLICIES = st.sampled_from(["las", "default", "tiresias"])
SWITCH = (no_search, "AHEAD")


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), policy=POLICIES, limits=st.sampled_from([0, 3, 40]))
def test_backlogs_decide_alike(seed: int, policy: str, limits: int) -> None:
    told, looked_at = both(play, seed, policy, limits, switch=SWITCH)
    assert told == looked_at


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), policy=POLICIES)
def test_busy_clusters_decide_alike(seed: int, policy: str) -> None:
    told, looked_at = both(busy, seed, policy, switch=SWITCH)
    assert told == looked_at


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1))
def test_two_models_decide_alike(seed: int) -> None:
    told, looked_at = both(mixed, seed, "las", switch=SWITCH)
    assert told == looked_at
