"""A family's verdict known before its first look (`repeats.AHEAD`) decides what the look decides,
and a cycle leaves no reference cycle behind.

When a walk is about to hand out a job of a family without a verdict, it first asks the cycle
for the family's verdict (`_Cycle.family_verdict`): when there is one and no backfill window
could hold the job, the job is told what `consider` would tell it, with the cycle's memory of
that look (`_Cycle.tell`: the blocked shape and the verdict key's answer), and its family is
settled as after the look. The random histories of `test_repeats.play` (reservations, backfill,
preemption, families that differ by their time limits) and the busy clusters of
`test_preemption_memo.busy` run with the shortcut and without: every decision and every job's
reason must be identical.

A finished walk keeps the reasons it gives lazily (`Reasons.add_lazy_run`) but lets go of the
cycle, which holds the result that holds those reasons: a cycle's objects are freed by
reference counts, not left to the cyclic collector (a third of the CPU of `overload128`).
"""

from __future__ import annotations

import gc
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corral.core import cycle as cycle_module
from corral.core import limits as limits_module
from corral.core import repeats
from corral.core.cycle import schedule
from corral.core.jobs import PendingJob
from corral.core.model import JobId, JobSpec, NodeName, NodeSpec, QueueName, QueueSpec
from corral.core.state import ClusterState
from corral.policies.registry import load_policy
from tests.core.test_preemption_memo import both, busy
from tests.core.test_repeats import behind_backlog, play, summary


def _both(run: Any, *args: Any) -> tuple[Any, Any]:
    """The run with verdicts known ahead of a look and without (walking even a handful of jobs,
    in small blocks of the families' time limits)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(repeats, "FEW_JOBS", 0)
        patch.setattr(limits_module, "BLOCK", 2)
        return both(run, *args, switch=(repeats, "AHEAD"))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1),
    policy=st.sampled_from(["default", "las", "tiresias", "tiresias_estimated"]),
    limits=st.sampled_from([0, 4, 12, 40]),
)
def test_verdicts_known_ahead_decide_as_the_looks(seed: int, policy: str, limits: int) -> None:
    ahead, looked = _both(play, seed, policy, limits)
    assert ahead == looked


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), policy=st.sampled_from(["default", "las"]))
def test_verdicts_known_ahead_on_busy_clusters(seed: int, policy: str) -> None:
    ahead, looked = _both(busy, seed, policy)
    assert ahead == looked


def many_families() -> ClusterState:
    """Two full nodes busy for two hours; a two-node gang (the queue's head: it takes the
    reservation), then ten jobs of each of four shapes, every job with its own time limit, all
    ending after the reservation starts (no backfill window holds them)."""
    nodes = [NodeSpec(NodeName(f"n{i}"), 8, "H100-80GB", labels={"leaf": "l0"}) for i in range(2)]
    state = ClusterState.build(("leaf",), nodes, [QueueSpec(QueueName("q"))])
    for i in range(2):
        spec = JobSpec(JobId(f"run{i}"), QueueName("q"), gpus_per_replica=8, time_limit=7200.0, seq=i)
        state.submit(spec)
    schedule(state, load_policy("default"), 0.0)
    state.submit(JobSpec(JobId("gang"), QueueName("q"), replicas=2, gpus_per_replica=8, seq=2))
    seq = 3
    for gpus in (1, 2, 4, 8):
        for i in range(10):
            limit = 10800.0 + 60 * seq
            state.submit(
                JobSpec(
                    JobId(f"g{gpus}-{i}"), QueueName("q"), gpus_per_replica=gpus, time_limit=limit, seq=seq
                )
            )
            seq += 1
    return state


def _looks(ahead: bool) -> tuple[tuple[Any, ...], list[JobId]]:
    looks: list[JobId] = []
    plain = cycle_module._Cycle.consider

    def counted(self: cycle_module._Cycle, job: PendingJob) -> bool:
        looks.append(job.spec.id)
        return plain(self, job)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cycle_module._Cycle, "consider", counted)
        patch.setattr(repeats, "AHEAD", ahead)
        state = many_families()
        looks.clear()
        result = schedule(state, load_policy("default"), 60.0)
    return summary(result), looks


def test_families_after_the_reservation_are_told_without_a_look() -> None:
    """Once the head holds its reservation and the one-GPU job found no victims (nor, so, any
    larger job of its queue), each other family's verdict is known before its first job is
    looked at: those two are looked at (without the shortcut, one job per family), and every
    job is told the same."""
    ahead, ahead_looks = _looks(True)
    looked, looked_looks = _looks(False)
    assert ahead == looked
    assert ahead_looks == [JobId("gang"), JobId("g1-0")]
    assert len(looked_looks) == 5  # the head, and the first job of each of the four families
    assert len(ahead[5]) == 41  # a reason for every waiting job


def test_a_cycle_leaves_no_reference_cycle() -> None:
    """A cycle whose walk gives reasons lazily (jobs held behind a reservation, each told its own
    end) leaves nothing for the cyclic collector once its result is dropped."""
    state, _ = behind_backlog(0.0)
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    try:
        result = schedule(state, load_policy("default"), 60.0)
        assert result.reasons._lazy, "the walk gave no reason lazily: nothing to check"
        del result
        assert gc.collect() == 0
    finally:
        if enabled:
            gc.enable()
