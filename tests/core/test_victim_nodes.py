"""Where a ranked list's candidates are, remembered in a cycle (`victim_nodes.on_nodes`), is what
building it for every search gives.

Busy clusters of two GPU models (jobs that ask for one model, the other or either, so searches
of one ranking read different node classes), some jobs launched per node (they hold their nodes
alone), queues borrowing beyond small quotas, `las` and `default`: each history runs with the
memory and without it (`victim_nodes.REMEMBER_NODES`), walked and looked at job by job; every
decision and reason must match.
"""

from __future__ import annotations

import random
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corral.core import victim_nodes
from corral.core.model import JobId, JobSpec, Launch, NodeName, NodeSpec, QueueName, QueueSpec
from corral.core.state import ClusterState
from corral.policies.registry import load_policy
from tests.core.test_preemption_memo import both, cycle_then_churn
from tests.core.test_repeats import CLASSES

MODELS = ("H100-80GB", "A100-40GB")


def mixed(seed: int, policy: str) -> list[tuple[Any, ...]]:
    rng = random.Random(seed)
    nodes = [
        NodeSpec(NodeName(f"n{i}"), 8, rng.choice(MODELS), labels={"leaf": f"l{i // 2}"})
        for i in range(rng.randint(3, 7))
    ]
    queues = [QueueSpec(QueueName(f"q{i}"), quota=rng.choice([0, 8, 16])) for i in range(rng.randint(1, 3))]
    state = ClusterState.build(("leaf",), nodes, queues)
    profile = load_policy(policy)
    outcome: list[tuple[Any, ...]] = []
    now, seq = 0.0, 0
    for _ in range(rng.randint(3, 10)):
        for _ in range(rng.randint(0, 30)):
            seq += 1
            prio, name = rng.choice(CLASSES)
            per_node = rng.random() < 0.1
            gpus = 8 if per_node else rng.choice([1, 2, 4, 8])
            spec = JobSpec(
                JobId(f"j{seq}"), rng.choice(queues).name, gpus_per_replica=gpus,
                priority=prio, priority_class=name, submit_time=now, seq=seq,
                time_limit=rng.choice([None, 3600.0, 36000.0]),
                gpu_model=rng.choice([(), ("H100*",), ("A100*",)]),
                launch=Launch.PER_NODE if per_node else Launch.PER_GPU,
            )  # fmt: skip
            state.submit(spec, attained=rng.choice([0.0, 0.0, 5000.0, 50000.0]))
        now = cycle_then_churn(state, profile, rng, now, outcome)
    return outcome


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), policy=st.sampled_from(["las", "default", "las"]), walk=st.booleans())
def test_remembered_candidate_nodes_are_the_nodes_built_anew(seed: int, policy: str, walk: bool) -> None:
    remembered, built = both(mixed, seed, policy, walk=walk, switch=(victim_nodes, "REMEMBER_NODES"))
    assert remembered == built
