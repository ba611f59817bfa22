"""`jobs.FamilyParts`, kept up to date as jobs enter and leave their queue, answers as a split
made from scratch: every family's keys per part, and where its parts change from any position.

Random submissions (with random attained service, so that the least-attained-service victims'
parts differ inside a family), starts (the jobs leave their queue), removals and requeues with
more attained service run through a real `ClusterState`; after each step the state's parts are
compared with those of a fresh `FamilyParts` split from the queue's family orders.
"""

from __future__ import annotations

import random
from bisect import bisect_left

from hypothesis import given, settings
from hypothesis import strategies as st

from corral.core.jobs import FamilyParts, PendingJob
from corral.core.model import JobId, JobSpec, NodeName, NodeSpec, QueueName, QueueSpec
from corral.core.state import ClusterState
from corral.policies.ordering import LeastAttained, LeastAttainedArgs
from corral.policies.victims import AttainedService, AttainedServiceArgs

THRESHOLDS = (100.0, 1000.0)
VICTIMS = AttainedService(AttainedServiceArgs(THRESHOLDS))


def _state() -> ClusterState:
    nodes = [NodeSpec(NodeName(f"n{i}"), 8, "H100-80GB", labels={"leaf": "l0"}) for i in range(4)]
    queues = [QueueSpec(QueueName("a"), quota=8), QueueSpec(QueueName("b"), quota=8)]
    state = ClusterState.build(("leaf",), nodes, queues)
    state.set_order(LeastAttained(LeastAttainedArgs(THRESHOLDS)).key)
    return state


def _check(state: ClusterState) -> None:
    for queue in state.queues.values():
        fresh = FamilyParts()
        fresh.use(VICTIMS, VICTIMS.family_part)
        for family, keys in queue.by_family.items():
            expected = fresh.of(family, keys, state.jobs)
            assert queue.parts.of(family, keys, state.jobs) == expected
            for part in (0, 1):
                for pos in range(len(keys) + 1):
                    stop = pos
                    while stop < len(keys) and VICTIMS.family_part(state.jobs[keys[stop][-1]]) == part:  # type: ignore[index]
                        stop += 1
                    assert queue.parts.stop(family, keys, state.jobs, pos, part) == stop
        # the split keeps nothing of a family that has left
        assert set(queue.parts.families) <= set(queue.by_family)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_family_parts_match_a_split_from_scratch(seed: int) -> None:
    rng = random.Random(seed)
    state = _state()
    for queue in state.queues.values():
        queue.parts.use(VICTIMS, VICTIMS.family_part)
    seq, now = 0, 0.0
    running: list[JobId] = []
    for _ in range(rng.randint(5, 60)):
        now += 1.0
        action = rng.random()
        pending = sorted(state.jobs)
        if action < 0.5 or not pending:
            seq += 1
            spec = JobSpec(
                JobId(f"j{seq}"),
                QueueName(rng.choice("ab")),
                gpus_per_replica=rng.choice((1, 2)),
                priority=rng.choice((0, 100)),
                submit_time=float(rng.randint(0, 5)),
                seq=seq,
            )
            state.submit(spec, attained=rng.choice((0.0, 50.0, 500.0, 5000.0)))
        elif action < 0.7:
            state.remove_pending(JobId(rng.choice(pending)))
        elif action < 0.9:
            job: PendingJob = state.jobs[JobId(rng.choice(pending))]
            queue = state.queues[job.spec.queue]
            free = [n for n in range(len(state.alloc)) if state.index.avail[n] >= job.spec.gpus]
            if free:
                free_bits = [g for g in range(8) if not state.alloc[free[0]] >> g & 1]
                mask = sum(1 << g for g in free_bits[: job.spec.gpus])
                state.start(job, [(free[0], mask)], now)
                _leave(state, job)
                running.append(job.spec.id)
        elif running:
            job_id = running.pop(rng.randrange(len(running)))
            state.end(job_id, True, now + rng.choice((10.0, 600.0)))
        if rng.random() < 0.3:  # a walk asks about a family: it is split from then on
            for queue in state.queues.values():
                for family, keys in list(queue.by_family.items())[:1]:
                    queue.parts.of(family, keys, state.jobs)
        _check(state)


def _leave(state: ClusterState, job: PendingJob) -> None:
    """What a cycle does with the jobs it started (`_Cycle.remove_started`)."""
    queue = state.queues[job.spec.queue]
    del queue.pending[job.spec.id]
    del state.jobs[job.spec.id]
    state.unqueue(queue, job)
    del queue.pending_keys[bisect_left(queue.pending_keys, job.key)]
    job.key = ()


def test_a_new_part_function_forgets_the_split() -> None:
    state = _state()
    queue = state.queue(QueueName("a"))
    queue.parts.use(VICTIMS, VICTIMS.family_part)
    for i, attained in enumerate((0.0, 5000.0, 0.0)):
        state.submit(JobSpec(JobId(f"j{i}"), QueueName("a"), seq=i), attained=attained)
    [(family, keys)] = queue.by_family.items()
    assert sorted(len(k) for k in queue.parts.of(family, keys, state.jobs).values()) == [1, 2]
    queue.parts.use(object(), lambda job: 7)
    assert queue.parts.of(family, keys, state.jobs) == {7: keys}
