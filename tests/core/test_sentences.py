"""Capacity sentences remembered (`capacity_reasons.Sentences`) are the sentences built anew.

The random histories of `test_repeats.play` (reservations, backfill attempts, preemption, jobs
that differ by their time limits) and `test_preemption_memo.busy` run twice, once with the memory
(of the cycle, and across cycles by the values a sentence reads) and once building every sentence;
every decision and every job's reason must be identical.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corral.core import capacity_reasons, reasons
from corral.core.model import JobId, JobSpec, NodeName, NodeSpec, QueueName, QueueSpec
from corral.core.placement import Miss
from corral.core.request import request_for
from corral.core.state import ClusterState
from tests.core.test_preemption_memo import busy
from tests.core.test_repeats import play


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1),
    policy=st.sampled_from(["default", "las", "tiresias", "default"]),
    limits=st.sampled_from([0, 4, 12]),
)
def test_remembered_sentences_are_the_sentences_built_anew(seed: int, policy: str, limits: int) -> None:
    remembered = play(seed, policy, limits)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(capacity_reasons, "REMEMBER_SENTENCES", False)
        built = play(seed, policy, limits)
    assert remembered == built


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1),
    policy=st.sampled_from(["default", "las"]),
    lasting=st.booleans(),
)
def test_sentences_remembered_across_cycles_are_the_sentences_built_anew(
    seed: int, policy: str, lasting: bool
) -> None:
    """The memory across cycles (`capacity_reasons.LASTING_SENTENCES`) on clusters whose cycles are hours
    apart: against no memory at all, or against the cycle's memory alone."""
    remembered = busy(seed, policy)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(capacity_reasons, "LASTING_SENTENCES" if lasting else "REMEMBER_SENTENCES", False)
        built = busy(seed, policy)
    assert remembered == built


def test_a_sentence_remembered_across_cycles_reads_the_held_gpus() -> None:
    """Two cycles whose only difference is how many free GPUs the reservations hold: the second
    is told its own count, not the first's sentence."""
    nodes = [NodeSpec(NodeName(f"n{i}"), 8, "H100-80GB", labels={"leaf": "l0"}) for i in range(2)]
    state = ClusterState.build(("leaf",), nodes, [QueueSpec(QueueName("q"))])
    state.submit(JobSpec(JobId("j"), QueueName("q"), gpus_per_replica=8, time_limit=600.0))
    job = state.jobs[JobId("j")]
    req = request_for(state, job.spec, job.shape)
    miss = Miss(len(state.topology.span_names) - 1, 0, 6)  # the cluster: 6 GPUs free
    held = [("gang", 3600.0, (0, 1))]
    for count in (3, 5):
        told = capacity_reasons.Sentences(state, 0.0).capacity(
            req, miss, held, 1, 600.0, lambda r, h, n=count: n
        )
        assert told == reasons.capacity(state, req, miss, held, 600.0, 0.0, lambda n=count: n)
        assert f"{count} more are held" in told.message
