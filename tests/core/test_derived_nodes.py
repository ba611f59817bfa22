"""Where a ranked list's candidates are, derived from the list before it (`victim_nodes._less`:
after a nomination or a start, the ranking less the attempts no longer candidates; a higher
attained-service level's ranking, which is a lower level's less the attempts below its floor),
is what building it anew gives; and a search that skips the nodes because the candidates' GPUs
and the free ones cannot hold its replicas (`victim_nodes._too_few`) finds what it would have.

The histories of `test_repeats.play` (backlogs, 0 to 40 time limits), `test_preemption_memo.busy`
and the two-model clusters of `test_victim_nodes.mixed` under `las` and `tiresias` (and
`default`, whose rankings read the queues), walked and looked at job by job, run with each
shortcut and without it (`victim_nodes.DERIVE_NODES`, `FEW_FIRST`): every decision and reason
must match.
Each test also checks that the histories derive at all (else it would compare nothing).
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corral.core import victim_nodes
from tests.core.test_preemption_memo import both, busy
from tests.core.test_repeats import play
from tests.core.test_victim_nodes import mixed
from tests.helpers import ran_interpreted

POLICIES = st.sampled_from(["las", "tiresias", "las", "default"])
SWITCHES = pytest.mark.parametrize("name", ["DERIVE_NODES", "FEW_FIRST"])
SEEN = {"derived": 0, "too few": 0}  # the shortcuts taken in the tests of this module


@pytest.fixture(autouse=True)
def count_shortcuts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Count the shortcuts taken (interpreted only: a compiled module calls its functions directly)."""
    less, too_few = victim_nodes._less, victim_nodes._too_few

    def derived(*args: Any) -> Any:
        found = less(*args)
        SEEN["derived"] += found is not None
        return found

    def few(*args: Any) -> bool:
        found = too_few(*args)
        SEEN["too few"] += found
        return found

    monkeypatch.setattr(victim_nodes, "_less", derived)
    monkeypatch.setattr(victim_nodes, "_too_few", few)


@SWITCHES
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), policy=POLICIES, limits=st.sampled_from([0, 3, 40]))
def test_backlogs_decide_alike(name: str, seed: int, policy: str, limits: int) -> None:
    derived, built = both(play, seed, policy, limits, switch=(victim_nodes, name))
    assert derived == built


@SWITCHES
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), policy=POLICIES, walk=st.booleans())
def test_busy_clusters_decide_alike(name: str, seed: int, policy: str, walk: bool) -> None:
    derived, built = both(busy, seed, policy, walk=walk, switch=(victim_nodes, name))
    assert derived == built


@SWITCHES
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), policy=POLICIES, walk=st.booleans())
def test_two_models_decide_alike(name: str, seed: int, policy: str, walk: bool) -> None:
    derived, built = both(mixed, seed, policy, walk=walk, switch=(victim_nodes, name))
    assert derived == built


def test_the_histories_take_the_shortcuts() -> None:
    """The histories above reach both shortcuts (counted interpreted: a compiled module calls
    the shortcuts directly, so under the compiled core this test runs itself interpreted)."""
    if ran_interpreted(__file__, "test_the_histories_take_the_shortcuts"):
        return
    SEEN.update({"derived": 0, "too few": 0})
    for seed in range(40):
        both(busy, seed, "las", switch=(victim_nodes, "DERIVE_NODES"))
        both(mixed, seed, "las", switch=(victim_nodes, "DERIVE_NODES"))
    assert SEEN["derived"] > 0
    assert SEEN["too few"] > 0
