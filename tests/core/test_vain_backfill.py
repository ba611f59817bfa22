"""Backfill attempts skipped as vain (`backfill.SKIP_VAIN_BACKFILL`) decide what making them decides.

A job whose placement missed is tried for backfill by lifting the cycle's reservations that start
at or after its end. When every reservation it would lift starts after `backfill.backfill_end` (the
latest start from which lifting changes what some node offers), the attempt would place nothing
new; the cycle skips it. The random histories of `test_repeats.play` (reservations, backfill,
preemption, families that differ by their time limits) and the busy clusters of
`test_preemption_memo.busy` run with the skip and without, walked and looked at job by job: every
decision and every job's reason must be identical.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from corral.core import backfill
from tests.core.test_preemption_memo import both, busy
from tests.core.test_repeats import play


def _both(run: Any, *args: Any, walk: bool) -> tuple[Any, Any]:
    """The run with vain backfill attempts skipped and with them tried."""
    return both(run, *args, walk=walk, switch=(backfill, "SKIP_VAIN_BACKFILL"))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1),
    policy=st.sampled_from(["default", "las", "tiresias", "fifo"]),
    limits=st.sampled_from([0, 4, 12]),
    walk=st.booleans(),
)
@example(seed=3, policy="default", limits=12, walk=False)
def test_skipped_backfill_attempts_decide_as_the_attempts(
    seed: int, policy: str, limits: int, walk: bool
) -> None:
    skipped, tried = _both(play, seed, policy, limits, walk=walk)
    assert skipped == tried


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), policy=st.sampled_from(["default", "las"]), walk=st.booleans())
def test_skipped_backfill_attempts_on_busy_clusters(seed: int, policy: str, walk: bool) -> None:
    skipped, tried = _both(busy, seed, policy, walk=walk)
    assert skipped == tried
