"""Shortcuts of the cycle that the simulator's speed relies on give what the long way gives."""

from __future__ import annotations

from corral.core.cycle import schedule
from corral.core.model import JobId, JobSpec, NodeName, NodeSpec, QueueName, QueueSpec
from corral.core.placement import Miss, place
from corral.core.request import request_for
from corral.core.state import ClusterState
from corral.policies.registry import load_policy


def test_never_fits_answers_follow_queue_changes() -> None:
    """The answer is cached per shape until static capacity changes: a queue's new limit counts."""
    nodes = [NodeSpec(NodeName(f"n{i}"), 8) for i in range(4)]
    state = ClusterState.build((), nodes, [QueueSpec(QueueName("q"), limit=8)])
    profile = load_policy("default")
    state.submit(JobSpec(JobId("a"), QueueName("q"), replicas=2, gpus_per_replica=8))
    first = schedule(state, profile, 0.0)
    assert [r.job for r in first.rejections] == ["a"]
    state.submit(JobSpec(JobId("b"), QueueName("q"), replicas=2, gpus_per_replica=8, seq=1))
    assert [r.reason for r in schedule(state, profile, 1.0).rejections] == [first.rejections[0].reason]
    state.add_queue(QueueSpec(QueueName("q"), limit=32))
    state.submit(JobSpec(JobId("c"), QueueName("q"), replicas=2, gpus_per_replica=8, seq=2))
    later = schedule(state, profile, 2.0)
    assert not later.rejections and [s.job for s in later.starts] == ["c"]


def test_a_full_cluster_misses_with_its_capacity() -> None:
    """Placement tries one NVLink group before counting capacity; a miss still carries the counts."""
    nodes = [NodeSpec(NodeName(f"n{i}"), 8, nvlink=((0, 1, 2, 3), (4, 5, 6, 7))) for i in range(2)]
    state = ClusterState.build((), nodes, [QueueSpec(QueueName("q"))])
    spec = JobSpec(JobId("x"), QueueName("q"), gpus_per_replica=4)
    req = request_for(state, spec)
    for _ in range(3):
        assert isinstance(place(state, req), list)
    state.plan.commit()
    wide = request_for(state, JobSpec(JobId("y"), QueueName("q"), replicas=2, gpus_per_replica=4))
    missed = place(state, wide)
    assert isinstance(missed, Miss)
    assert (missed.best_replicas, missed.best_gpus) == (1, 4)
    assert isinstance(place(state, req), list)  # the last group of four still fits one replica


def test_interned_keys_of_live_jobs_keep_their_ids() -> None:
    """When the intern table is trimmed, a waiting or running job's verdict key and family keep
    their ids, so that a later job of the same (shape, time limit) shares them (a walk finds the
    jobs of one key in one list)."""
    state = ClusterState.build((), [NodeSpec(NodeName("n0"), 8)], [QueueSpec(QueueName("q"))])
    state._intern_cap = 6  # trim after a few keys

    def submit(job_id: str, seq: int, limit: float) -> None:
        state.submit(JobSpec(JobId(job_id), QueueName("q"), seq=seq, time_limit=limit))

    submit("keep", 0, 60.0)
    for i in range(1, 12):
        submit(f"other{i}", i, 60.0 * (i + 1))  # new keys: the table is trimmed on the way
        if i % 2:
            state.remove_pending(JobId(f"other{i}"))  # dead keys may be forgotten
    submit("later", 12, 60.0)
    keep, later = state.jobs[JobId("keep")], state.jobs[JobId("later")]
    assert (later.verdict_key, later.family) == (keep.verdict_key, keep.family)
    assert state.queues[QueueName("q")].by_verdict[keep.verdict_key] == sorted([keep.key, later.key])
