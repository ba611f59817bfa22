"""Candidates by when their attained service reaches a level (`served.Reaching`) are never fewer
than those that have reached it, and a `las` ranking read from them is the ranking of every
candidate.

The index on its own: random attempts (GPUs, start, earlier service) join and leave as candidates,
floors are asked about before and after, at random times and at the very times the service
reaches them; every candidate at or above the floor must be returned, and nothing but
candidates. Whole histories: the busy clusters of `test_preemption_memo` and the two-model
clusters of `test_victim_nodes` under `las` (jobs with earlier service of 0, 5,000 and 50,000
GPU-seconds, so preemptors of every level), with the index and without (`served.USE_INDEX`),
walked and looked at job by job; every decision and reason must match.
"""

from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corral.core import served
from corral.core.jobs import PendingJob, RunningAttempt
from corral.core.model import JobId, JobSpec, QueueName
from corral.core.served import Reaching
from tests.core.test_preemption_memo import both, busy
from tests.core.test_victim_nodes import mixed

FLOORS = (3600.0, 36000.0, 100.0)


def attempt(rng: random.Random, n: int) -> RunningAttempt:
    gpus = rng.choice([0, 1, 1, 2, 8, 16, 64])
    spec = JobSpec(JobId(f"j{n}"), QueueName("q"), gpus_per_replica=gpus)
    job = PendingJob(
        spec, attained=rng.choice([0.0, 0.0, 100.0, 3599.9, 5000.0, 50000.0, rng.uniform(0, 4e4)])
    )
    start = rng.choice([0.0, 1e5 / 3, rng.uniform(0.0, 1e5)])
    return RunningAttempt(job, 1, [(0, 1)], start, float("inf"), start)


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_every_candidate_at_or_above_the_floor_is_returned(seed: int) -> None:
    rng = random.Random(seed)
    index, live = Reaching(), {}
    for n in range(rng.randint(1, 80)):
        if live and rng.random() < 0.3:
            gone = live.pop(rng.choice(sorted(live)))
            index.leave(gone)
        a = attempt(rng, n)
        index.join(a)
        live[a.job.spec.id] = a
        if rng.random() < 0.2:
            floor = rng.choice(FLOORS)
            # at random times and at the times candidates' service reaches the floor
            times = [rng.uniform(0.0, 2e5)]
            times += [
                served.reaches_at(c, floor, c.job.attained)
                for c in rng.sample(sorted(live.values(), key=lambda c: c.job.spec.id), 1)
            ]
            for now in times:
                if not abs(now) < float("inf"):
                    continue
                got = index.reaching(floor, now)
                ids = [id(c) for c in got]
                assert len(ids) == len(set(ids))
                assert all(live.get(c.job.spec.id) is c for c in got)
                reached = {
                    id(c)
                    for c in live.values()
                    if c.job.attained + c.job.spec.gpus * (now - c.start) >= floor
                }
                assert reached <= set(ids)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), walk=st.booleans(), two_models=st.booleans())
def test_las_rankings_from_the_index_are_the_rankings_of_every_candidate(
    seed: int, walk: bool, two_models: bool
) -> None:
    indexed, every = both(mixed if two_models else busy, seed, "las", walk=walk, switch=(served, "USE_INDEX"))
    assert indexed == every
