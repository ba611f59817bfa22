"""Jobs whose victim search surely finds no candidates, told without a look, are told and decided
as if looked at (`corral.core.no_search`, switch `AHEAD`).

A walk passes over such a job (`_Cycle.family_verdict(ahead=True)`) and makes its search when
telling it (`_Cycle.tell`): the try it counts (towards `max_preemption_tries`) and the queue found
to have no victims for its class and size are as after a look. The histories of
`test_repeats.play`, `test_preemption_memo.busy` and `test_victim_nodes.mixed` under `las`,
`default` and `tiresias`, with and without it: every decision and reason must match. They differ
when the search is not made when telling (tries and the queues' memory fall behind), or when a
job whose (shape, time limit) is blocked already (a look searches nothing) lets its family pass
(seen with few tries per cycle: `tries` caps `Profile.max_preemption_tries`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corral.core import no_search
from corral.core.plugins import Profile
from corral.policies.registry import load_policy
from tests.core import test_preemption_memo, test_repeats
from tests.core.test_preemption_memo import both, busy
from tests.core.test_repeats import play
from tests.core.test_victim_nodes import mixed

POLICIES = st.sampled_from(["las", "default", "tiresias"])
SWITCH = (no_search, "AHEAD")
TRIES = st.sampled_from([1, 3, 64])


@contextmanager
def capped(tries: int) -> Iterator[None]:
    """The histories' policies with at most `tries` victim searches per cycle."""

    def load(name: str, *args: Any) -> Profile:
        return replace(load_policy(name, *args), max_preemption_tries=tries)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(test_repeats, "load_policy", load)
        patch.setattr(test_preemption_memo, "load_policy", load)
        yield


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), policy=POLICIES, limits=st.sampled_from([0, 3, 40]), tries=TRIES)
def test_backlogs_decide_alike(seed: int, policy: str, limits: int, tries: int) -> None:
    with capped(tries):
        told, looked_at = both(play, seed, policy, limits, switch=SWITCH)
    assert told == looked_at


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), policy=POLICIES, tries=TRIES)
def test_busy_clusters_decide_alike(seed: int, policy: str, tries: int) -> None:
    with capped(tries):
        told, looked_at = both(busy, seed, policy, switch=SWITCH)
    assert told == looked_at


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1))
def test_two_models_decide_alike(seed: int) -> None:
    told, looked_at = both(mixed, seed, "las", switch=SWITCH)
    assert told == looked_at
