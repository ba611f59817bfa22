"""Victim selection's bound on aggregates decides as before with its two shortcuts
(`corral.core.narrow`):

- `FEW_FIRST`: before reading the aggregates node by node, `preempt._by_aggregates` checks that the
  free GPUs and the candidates' (of a narrowed group, its few attempts') together hold the job's
  replicas at all (`narrow.too_few`); if not, no set frees a placement (None), as the node by node
  bound would find.
- `LAZY_OVERLAY`: the narrowed groups' aggregates are read per node where needed (`narrow.Overlay`)
  instead of copying every node's aggregates a narrowed group touches (`narrow.overlay`): the same
  potentials, and the same dicts in the same order where the costs read them.
- `FEW_NODES`: when every group allowed is narrowed, the bound reads only the nodes their attempts
  touch and those with enough free GPUs (`narrow.Overlay.nodes`): the same potentials.

Random clusters under `tiresias` (which narrows its own queue and class to the worse levels that
would lose little work, and other queues to the fresh borrowers while its patience lasts), with
reservations, searched with each shortcut and without (`select_victims`, and `SameQueue` as the
own-queue searches use it): the same answer. The histories of `test_repeats.play`,
`test_preemption_memo.busy` and `test_victim_nodes.mixed` with each switch and without are in
`test_preemption_switches.py`.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corral.core import narrow
from corral.core.cycle import schedule
from corral.core.jobs import PendingJob
from corral.core.model import JobId, JobSpec, NodeName, NodeSpec, QueueName, QueueSpec
from corral.core.placement import Request
from corral.core.preempt import NO_CANDIDATES, Miss, Selection, eligible_groups, select_victims
from corral.core.request import request_for
from corral.core.same_queue import SameQueue
from corral.core.state import ClusterState
from corral.policies.registry import load_policy

SWITCHES = pytest.mark.parametrize("name", ["FEW_FIRST", "LAZY_OVERLAY", "FEW_NODES"])
NOW = 5000.0


def searched(seed: int) -> tuple[ClusterState, Any, PendingJob, Request]:
    """A cluster where jobs of two classes in up to three queues run since 0 (some checkpointed
    since), reservations on some nodes, and a level-0 preemptor of q0 waiting at `NOW`."""
    rng = random.Random(seed)
    gpus = rng.choice([4, 8])
    nodes = [
        NodeSpec(NodeName(f"n{i}"), gpus, "H100-80GB", labels={"leaf": f"l{i // 2}"})
        for i in range(rng.randint(2, 8))
    ]
    total = gpus * len(nodes)
    queues = [
        QueueSpec(QueueName(f"q{i}"), quota=rng.choice([0, total // 4]), cohort="c")
        for i in range(rng.randint(1, 3))
    ]
    state = ClusterState.build(("leaf",), nodes, queues)
    args = {"thresholds": [60.0, 36000.0], "max_lost": rng.choice([100.0, 1000.0, 10000.0])}
    args["patience"] = rng.choice([0.0, 21600.0])
    profile = load_policy("tiresias", {"tiresias": args})
    for i in range(rng.randint(1, 3 * len(nodes))):
        replicas, per = rng.choice([(1, 1), (1, 2), (1, gpus // 2), (1, gpus), (2, gpus)])
        spec = JobSpec(
            JobId(f"r{i}"), rng.choice(queues).name, replicas=replicas, gpus_per_replica=per,
            priority=rng.choice([0, 0, 100]), submit_time=0.0, seq=i,
        )  # fmt: skip
        state.submit(spec, attained=rng.choice([0.0, 50000.0]))
    schedule(state, profile, 0.0)
    for job_id in list(state.running):
        if rng.random() < 0.5:
            state.record_checkpoint(job_id, NOW - rng.choice([10.0, 500.0, 4000.0]))
    replicas, per = rng.choice([(1, 1), (1, gpus // 2), (1, gpus), (2, gpus), (3, gpus), (4, gpus)])
    spec = JobSpec(
        JobId("x"), QueueName("q0"), replicas=replicas, gpus_per_replica=per, priority=0,
        submit_time=NOW - rng.choice([0.0, 30000.0]), seq=10_000,
    )  # fmt: skip
    job = state.submit(spec)
    for node in range(len(nodes)):
        if rng.random() < 0.2:
            state.set_reserved(node, rng.randint(1, gpus))
    return state, profile.victims, job, request_for(state, spec)


def outcome(found: Selection | Miss | None) -> object:
    if isinstance(found, Selection):
        return (found.placement, [v.spec.id for v in found.victims])
    return found


def search_both(seed: int, name: str) -> list[tuple[object, object]]:
    """Each search (the plugin's and its own queue's) with the shortcut and without."""
    state, plugin, job, req = searched(seed)
    pairs = []
    for victims in (plugin, SameQueue(plugin)):
        with pytest.MonkeyPatch.context() as patch:
            shortcut = outcome(select_victims(state, victims, job, req, NOW))
            patch.setattr(narrow, name, False)
            long_way = outcome(select_victims(state, victims, job, req, NOW))
        pairs.append((shortcut, long_way))
    return pairs


@SWITCHES
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1))
def test_searches_find_the_same_set(name: str, seed: int) -> None:
    for shortcut, long_way in search_both(seed, name):
        assert shortcut == long_way


def test_the_searches_draw_every_case() -> None:
    """The clusters above draw searches that the bound answers at once, searches with narrowed
    groups that find a set, searches with narrowed groups that find none, and searches where
    every group allowed is narrowed (`FEW_NODES` reads fewer nodes)."""
    seen = {"too few": 0, "set, narrowed": 0, "none, narrowed": 0, "every group narrowed": 0}
    for seed in range(300):
        state, plugin, job, req = searched(seed)
        ok = eligible_groups(state, plugin, job, NOW)
        few = narrow.narrowed(state, plugin, job, NOW, ok)
        if ok and narrow.too_few(state, ok, few, req.replicas, max(1, req.gpus_per_replica)):
            seen["too few"] += 1
            assert select_victims(state, plugin, job, req, NOW) is None
        found = select_victims(state, plugin, job, req, NOW)
        if few and all(key in few for key in ok):
            seen["every group narrowed"] += 1
        if few and isinstance(found, Selection) and found.victims:
            seen["set, narrowed"] += 1
        if few and found is None:
            seen["none, narrowed"] += 1
        assert found is not NO_CANDIDATES or not few or not any(few.values())
    assert all(seen.values()), seen
