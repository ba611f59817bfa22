"""Fair-share arithmetic: decayed usage and the two-tier queue key."""

from __future__ import annotations

import math

from corral.core.fairshare import decay_usage, fair_share_key
from corral.core.model import QueueName, QueueSpec
from tests.helpers import nodes, state_of


def test_usage_halves_every_half_life_and_saturates_at_gpus_times_h_over_ln2() -> None:
    assert decay_usage(1000.0, 0, 3600.0, 3600.0) == 500.0
    steady = decay_usage(0.0, 8, 1e9, 3600.0)
    assert math.isclose(steady, 8 * 3600.0 / math.log(2))
    # two steps of one hour equal one step of two hours (the integral is exact)
    assert math.isclose(decay_usage(decay_usage(0.0, 4, 3600.0, 7200.0), 4, 3600.0, 7200.0),
                        decay_usage(0.0, 4, 7200.0, 7200.0))  # fmt: skip


def test_queues_under_quota_come_first_then_borrowers_by_weighted_share() -> None:
    qs = [QueueSpec(QueueName("under"), quota=8), QueueSpec(QueueName("heavy"), weight=1.0),
          QueueSpec(QueueName("light"), weight=4.0)]  # fmt: skip
    state = state_of(nodes(4, 8), qs)
    state.queues[QueueName("under")].alloc_gpus = 6
    state.queues[QueueName("heavy")].alloc_gpus = 8
    state.queues[QueueName("light")].alloc_gpus = 8
    keys = {name: fair_share_key(state, q, None) for name, q in state.queues.items()}
    assert keys["under"][0] == 0 and keys["heavy"][0] == 1
    assert sorted(keys, key=lambda n: keys[n]) == ["under", "light", "heavy"]
