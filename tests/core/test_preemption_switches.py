"""The preemption phase's per-cycle memories change no decision and no sentence.

Each memory has a switch in `corral.core.preemption`; the histories of `test_repeats.play` (0 to
40 time limits), `test_preemption_memo.busy` and the two-model clusters of
`test_victim_nodes.mixed` under `las`, `default` and `tiresias`, walked and looked at job by job,
run with the memory and without it: every decision and reason must match.

- `NONE_BY_KEY`: `Preemption._search` remembers, per `Victims.preemptor_key`, the queues' use
  version at which a search found no running attempt that could be a victim at all, and answers
  the searches of other families of that key (other shapes, queues of the same key, nodes
  avoided) without searching while the version holds (`tiresias`, which narrows groups, is never
  answered from it). The histories differ when the memory outlives the use version or ignores
  the key.
- `SAME_SENTENCES`: `Preemption._with_protection` remembers, for one cycle, the reason that names
  when the victims' `min_runtime` protection ends, per reason object and end; the jobs of a
  family (and every family with the same capacity sentence) are told it without a new sentence.
  The histories differ when the memory forgets the end or the reason.
- `EARLIER_ONLY`: `Preemption._until` asks a protected group whether the preemptor may take from
  it only when its protection ends before the earliest eligible end found so far (asking the
  others changes no minimum). The histories differ when a group ending earlier is passed over.
- `BUDGET_FEW`: `Preemption.for_budget` answers at once a search whose ranked candidates and the
  free GPUs together hold too few of the job's replicas (`test_tiresias_fresh.py`: budget
  histories). The histories differ when a search that a set could serve is answered so.
- `narrow.FEW_FIRST`, `narrow.LAZY_OVERLAY`, `narrow.FEW_NODES`: victim selection's bound on
  aggregates answers at once a search whose free GPUs and candidates' together cannot hold the
  job, reads the narrowed groups' aggregates per node where needed, and, when every group is
  narrowed, only the nodes they touch or with enough free GPUs (`tests/core/test_narrowed_bound.py`
  compares the searches themselves). The histories differ when the bound answers a search that a
  node set could serve, or the narrowed aggregates or the nodes are read otherwise.
- `backfill.REMEMBER_ENDS`: the cycle answers `backfill.backfill_end` from its memory (`Ends`,
  compared field by field in `_Cycle.backfill_end`) while its epoch and the base id hold. The
  histories differ when the memory outlives a reservation, a start or a node's change.
- `reserve.REPLICA_BOUND`: a backfill attempt's miss with reservations lifted (`misses_lifted`) is
  told by counting the cluster's whole replicas (`counted.replicas_with`) before `place_counts`.
  The histories differ when the count says a miss with enough replicas (`<=` for `<`).
- `nodes.STILL_NODES`: a change of reserved GPUs alone does not move in the index a node that
  offers nothing before and after it (`tests/core/test_still_nodes.py` compares the index with the
  masks after random changes).
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corral.core import backfill, narrow, nodes, preemption, reserve
from tests.core.test_preemption_memo import both, busy
from tests.core.test_repeats import play
from tests.core.test_victim_nodes import mixed

SWITCHES = pytest.mark.parametrize(
    "module,name",
    [
        (preemption, "NONE_BY_KEY"),
        (preemption, "SAME_SENTENCES"),
        (preemption, "EARLIER_ONLY"),
        (preemption, "BUDGET_FEW"),
        (narrow, "FEW_FIRST"),
        (narrow, "LAZY_OVERLAY"),
        (narrow, "FEW_NODES"),
        (backfill, "REMEMBER_ENDS"),
        (reserve, "REPLICA_BOUND"),
        (nodes, "STILL_NODES"),
    ],
)
POLICIES = st.sampled_from(["las", "default", "tiresias"])


@SWITCHES
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), policy=POLICIES, limits=st.sampled_from([0, 3, 40]))
def test_backlogs_decide_alike(module: Any, name: str, seed: int, policy: str, limits: int) -> None:
    remembered, long_way = both(play, seed, policy, limits, switch=(module, name))
    assert remembered == long_way


@SWITCHES
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), policy=POLICIES, walk=st.booleans())
def test_busy_clusters_decide_alike(module: Any, name: str, seed: int, policy: str, walk: bool) -> None:
    remembered, long_way = both(busy, seed, policy, walk=walk, switch=(module, name))
    assert remembered == long_way


@SWITCHES
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), walk=st.booleans())
def test_two_models_decide_alike(module: Any, name: str, seed: int, walk: bool) -> None:
    remembered, long_way = both(mixed, seed, "las", walk=walk, switch=(module, name))
    assert remembered == long_way
