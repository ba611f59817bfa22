"""A walk's end gives its capacity runs the reasons looking at each job would (`repeats.Walk.finish`).

A run of jobs passed as blocked by capacity is told, at the walk's end, one reason for all its
jobs when every (shape, time limit) of its shape, queue and class was told the same this cycle
(`first_told.FirstTold.uniform`, which compares those reasons without hashing them); else each
job's reason is resolved when read. And a job's twin families (same shape, queue and class) are
found by its family's id (`first_told.TWINS_BY_FAMILY`). The random histories of
`test_repeats.play` and `test_preemption_memo.busy` run with these shortcuts and without (every
run resolved job by job; twins found by their shape): every decision and reason must be
identical. `Reason`, written out for the compiled core, is a value: equal reasons are equal and
hash alike, and it cannot be changed.
"""

from __future__ import annotations

import pickle
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corral.core import first_told, repeats
from corral.core import limits as limits_module
from corral.core.decisions import Reason, Why
from corral.core.families import Family
from corral.core.first_told import FirstTold
from corral.core.model import JobId, JobSpec, NodeName, NodeSpec, QueueName, QueueSpec
from corral.core.state import ClusterState
from tests.core.test_preemption_memo import both, busy
from tests.core.test_repeats import play


def _both(run: Any, *args: Any, switch: tuple[Any, str]) -> tuple[Any, Any]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(repeats, "FEW_JOBS", 0)  # walk even a handful of jobs
        patch.setattr(limits_module, "BLOCK", 2)
        return both(run, *args, switch=switch)


SWITCHES = [(repeats, "UNIFORM_RUNS"), (first_told, "TWINS_BY_FAMILY")]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1),
    policy=st.sampled_from(["default", "las", "tiresias"]),
    limits=st.sampled_from([0, 4, 12, 40]),
    switch=st.sampled_from(SWITCHES),
)
def test_runs_told_at_once_are_told_what_each_job_would_be(
    seed: int, policy: str, limits: int, switch: tuple[Any, str]
) -> None:
    shortcut, long_way = _both(play, seed, policy, limits, switch=switch)
    assert shortcut == long_way


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1),
    policy=st.sampled_from(["default", "las"]),
    switch=st.sampled_from(SWITCHES),
)
def test_runs_told_at_once_on_busy_clusters(seed: int, policy: str, switch: tuple[Any, str]) -> None:
    shortcut, long_way = _both(busy, seed, policy, switch=switch)
    assert shortcut == long_way


def test_a_reason_is_a_value() -> None:
    one = Reason(Why.CAPACITY, "needs 8 GPUs", 10.0)
    same = Reason(Why.CAPACITY, "needs 8 GPUs", at=10.0)
    assert one == same and hash(one) == hash(same) and len({one, same}) == 1
    assert one != Reason(Why.TOPOLOGY, "needs 8 GPUs", 10.0)
    assert one != Reason(Why.CAPACITY, "needs 8 GPUs", 11.0)
    assert one != Reason(Why.CAPACITY, "needs 4 GPUs", 10.0)
    assert Reason(Why.HELD, "held").at is None
    assert str(one) == "needs 8 GPUs"
    assert repr(one) == "Reason(code=<Why.CAPACITY: 'capacity'>, message='needs 8 GPUs', at=10.0)"
    assert pickle.loads(pickle.dumps(one)) == one
    assert one != "needs 8 GPUs"


def test_runs_of_a_shape_told_two_reasons_are_resolved_job_by_job() -> None:
    """When the (shape, time limit)s of a shape were told different reasons this cycle, a run of
    that shape is not told one reason, even if one of them is its own."""
    nodes = [NodeSpec(NodeName("n0"), 8, "H100-80GB", labels={"leaf": "l0"})]
    state = ClusterState.build(("leaf",), nodes, [QueueSpec(QueueName("q"))])
    for i, limit in enumerate((600.0, 1200.0)):
        state.submit(JobSpec(JobId(f"j{i}"), QueueName("q"), gpus_per_replica=1, time_limit=limit, seq=i))
    queue = state.queues[QueueName("q")]
    jobs = [state.jobs[JobId("j0")], state.jobs[JobId("j1")]]
    (family_id, keys), *_ = queue.by_family.items()
    family = Family(0, keys, queue, family_id)
    a, c = Reason(Why.CAPACITY, "told first"), Reason(Why.CAPACITY, "told later")
    family.runs.append((keys[0], keys[-1], a))
    told = FirstTold({}, state, state.jobs, [family])
    assert told.uniform(jobs[0], None, False) == a
    assert told.uniform(jobs[0], Reason(Why.CAPACITY, "told first"), False) == a
    assert told.uniform(jobs[0], c, False) is None
    assert told.uniform(jobs[0], a, True) is None  # a, and another reason than a
