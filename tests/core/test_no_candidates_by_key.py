"""A search that found no candidates answers every job of the same preemptor key in the cycle.

`preemption.Preemption._search` remembers, per `Victims.preemptor_key`, the queues' use version
at which a search found no running attempt that could be a victim at all, and answers the
searches of other families of that key (other shapes, queues of the same key, nodes avoided)
without searching while the version holds. The histories of `test_repeats.play` (0 to 40 time
limits), `test_preemption_memo.busy` and the two-model clusters of `test_victim_nodes.mixed`
under `las`, `default` and `tiresias` (which narrows groups: never answered from memory),
walked and looked at job by job, with the memory and without (`preemption.NONE_BY_KEY`):
every decision and reason must match (they differ when the memory outlives the use version).
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corral.core import preemption
from tests.core.test_preemption_memo import both, busy
from tests.core.test_repeats import play
from tests.core.test_victim_nodes import mixed

SWITCH = (preemption, "NONE_BY_KEY")
POLICIES = st.sampled_from(["las", "default", "tiresias"])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), policy=POLICIES, limits=st.sampled_from([0, 3, 40]))
def test_backlogs_search_alike(seed: int, policy: str, limits: int) -> None:
    remembered, searched = both(play, seed, policy, limits, switch=SWITCH)
    assert remembered == searched


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), policy=POLICIES, walk=st.booleans())
def test_busy_clusters_search_alike(seed: int, policy: str, walk: bool) -> None:
    remembered, searched = both(busy, seed, policy, walk=walk, switch=SWITCH)
    assert remembered == searched


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), walk=st.booleans())
def test_two_models_search_alike(seed: int, walk: bool) -> None:
    remembered, searched = both(mixed, seed, "las", walk=walk, switch=SWITCH)
    assert remembered == searched
