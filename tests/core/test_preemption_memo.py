"""A cycle's memory of its victim searches gives what searching every time gives.

`preemption.Preemption` answers a search that found nothing again for a job of the same
`Victims.preemptor_key` and family while the cycle's epoch holds, ranks the candidates once per
preemptor key (for `las`, once per cycle, less the attempts that stopped being candidates) and
remembers when protections end per preemptor key (`tiresias`' holds its level and whether its
`patience` is over: `play` runs it with a short patience, levels crossed and checkpoints). The
same random clusters, backlogs and cycles run with that memory and without it
(`preemption.REMEMBER`); every decision and reason must match: the backlogs of
`test_repeats.play`, and busy clusters where queues borrow beyond their quotas and many jobs of
a few shapes search for victims in each cycle.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corral.core import preemption, repeats
from corral.core.cycle import schedule
from corral.core.model import JobId, JobSpec, NodeName, NodeSpec, QueueName, QueueSpec
from corral.core.state import ClusterState
from corral.policies.registry import load_policy
from tests.core.test_repeats import CLASSES, play, summary
from tests.helpers import check_no_double_allocation


def busy(seed: int, policy: str) -> list[tuple[Any, ...]]:
    """Waves of jobs of few shapes and classes over queues with small quotas, cycles hours apart;
    the jobs of a family differ by their time limits (jobs of one time limit repeat the first's
    answer without a search)."""
    rng = random.Random(seed)
    nodes = [
        NodeSpec(NodeName(f"n{i}"), 8, "H100-80GB", labels={"leaf": f"l{i // 2}"})
        for i in range(rng.randint(2, 6))
    ]
    queues = [
        QueueSpec(QueueName(f"q{i}"), quota=rng.choice([0, 4, 8, 16])) for i in range(rng.randint(1, 3))
    ]
    state = ClusterState.build(("leaf",), nodes, queues)
    profile = load_policy(policy)
    outcome: list[tuple[Any, ...]] = []
    now, seq = 0.0, 0
    for _ in range(rng.randint(3, 10)):
        for _ in range(rng.randint(0, 30)):
            seq += 1
            prio, name = rng.choice(CLASSES)
            spec = JobSpec(
                JobId(f"j{seq}"), rng.choice(queues).name, gpus_per_replica=rng.choice([1, 2, 4, 8]),
                priority=prio, priority_class=name, submit_time=now, seq=seq,
                time_limit=rng.choice([None, 3600.0, 7200.0, 36000.0]),
            )  # fmt: skip
            state.submit(spec, attained=rng.choice([0.0, 0.0, 5000.0, 50000.0]))
        now = cycle_then_churn(state, profile, rng, now, outcome)
    return outcome


def cycle_then_churn(
    state: ClusterState, profile: Any, rng: random.Random, now: float, outcome: list[tuple[Any, ...]]
) -> float:
    """A cycle at `now` (its decisions and reasons into `outcome`), then the next instant, 10
    minutes to 2 hours later: victims past their deadline stop, a fifth of the others end."""
    result = schedule(state, profile, now)
    check_no_double_allocation(state)
    outcome.append(summary(result))
    now += rng.choice([600.0, 3600.0, 7200.0])
    for job_id in list(state.running):
        attempt = state.running[job_id]
        if attempt.preempting_deadline is not None and attempt.preempting_deadline <= now:
            state.end(job_id, requeue=True, now=now)
        elif rng.random() < 0.2:
            state.end(job_id, requeue=False, now=now)
    return now


def both(
    run: Any, *args: Any, walk: bool = True, switch: tuple[Any, str] = (preemption, "REMEMBER")
) -> tuple[Any, Any]:
    """The run with a shortcut and without (`switch`: the module and the name of its switch; by
    default the search memory), looking at every job when not `walk` (then the jobs of one
    family search one after another)."""
    with pytest.MonkeyPatch.context() as patch:
        if not walk:
            patch.setattr(repeats, "MANY_SHAPES", -1)
        shortcut = run(*args)
        patch.setattr(*switch, False)
        long_way = run(*args)
    return shortcut, long_way


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1),
    policy=st.sampled_from(["default", "las", "tiresias", "tiresias_estimated"]),
)
def test_remembered_searches_change_nothing(seed: int, policy: str) -> None:
    remembered, searched = both(play, seed, policy)
    assert remembered == searched


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1), policy=st.sampled_from(["default", "las", "tiresias"]), walk=st.booleans()
)
def test_remembered_searches_change_nothing_on_a_busy_cluster(seed: int, policy: str, walk: bool) -> None:
    remembered, searched = both(busy, seed, policy, walk=walk)
    assert remembered == searched
