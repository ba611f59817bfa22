"""`tiresias`' remembered answers about a group's candidates give what computing them gives.

`Tiresias` remembers, per (group, service floor), whether a candidate has a worse level and
little to lose, which candidates `narrow` keeps, and when the first protected one leaves its
minimum run time, for one `Occupancy` at one `now` while `Occupancy.changes` holds
(`tiresias_memo`). Random histories run with that memory and without it
(`tiresias_memo.REMEMBER`): busy clusters where queues borrow, jobs of few shapes cross levels,
running jobs checkpoint and end between cycles, and cycles often come again at the same instant
(what changed between them must be seen), or later with nothing changed. Two clusters share one
profile, cycle by cycle, so a memory of one is never read for the other. Every decision and
reason must match; so must the answers themselves across instants with nothing changed.
"""

from __future__ import annotations

import random
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corral.core.cycle import schedule
from corral.core.jobs import PendingJob
from corral.core.model import JobId, JobSpec, NodeName, NodeSpec, QueueName, QueueSpec
from corral.core.state import ClusterState
from corral.policies import tiresias_memo
from corral.policies.registry import load_policy
from tests.core.test_preemption_memo import both
from tests.core.test_repeats import CLASSES, summary
from tests.helpers import check_no_double_allocation, job, nodes, occupy, queues, state_of

SHAPES = [(1, 1), (1, 2), (1, 4), (1, 8), (2, 8)]


def cluster(rng: random.Random) -> ClusterState:
    nodes = [
        NodeSpec(NodeName(f"n{i}"), 8, "H100-80GB", labels={"leaf": f"l{i // 2}"})
        for i in range(rng.randint(2, 6))
    ]
    total = 8 * len(nodes)
    queues = [
        QueueSpec(QueueName(f"q{i}"), quota=rng.choice([0, total // 4, total // 2]), cohort="c")
        for i in range(rng.randint(1, 3))
    ]
    return ClusterState.build(("leaf",), nodes, queues)


def history(seed: int) -> list[tuple[Any, ...]]:
    """Two clusters under one profile, cycles at the same instant or up to 15 minutes apart."""
    rng = random.Random(seed)
    args: dict[str, Any] = {
        "thresholds": rng.choice([[600.0], [1200.0, 12_000.0], [3600.0, 36_000.0]]),
        "max_lost": rng.choice([0.0, 300.0, 600.0]),
        "patience": rng.choice([0.0, 600.0, 3600.0]),
        "starve": rng.choice([0.0, 1800.0]),
    }
    profile = load_policy("tiresias", {"tiresias": args})
    states = [cluster(rng), cluster(rng)]
    outcome: list[tuple[Any, ...]] = []
    now, seq = 0.0, 0
    for _ in range(rng.randint(4, 12)):
        for state in states:
            queues = list(state.queues)
            for _ in range(rng.choice([0, 1, rng.randint(0, 25)])):
                seq += 1
                replicas, gpus = rng.choice(SHAPES)
                prio, name = rng.choice(CLASSES)
                spec = JobSpec(
                    JobId(f"j{seq}"), QueueName(rng.choice(queues)), replicas=replicas,
                    gpus_per_replica=gpus, priority=prio, priority_class=name, submit_time=now,
                    seq=seq, time_limit=rng.choice([None, 600.0, 3600.0]),
                )  # fmt: skip
                state.submit(spec, attained=rng.choice([0.0, 0.0, 1000.0, 5000.0, 50_000.0]))
            result = schedule(state, profile, now)
            check_no_double_allocation(state)
            outcome.append(summary(result))
        now += rng.choice([0.0, 0.0, 60.0, 300.0, 900.0])  # often again at the same instant
        quiet = rng.random() < 0.3  # nothing ends nor checkpoints: only the time moved
        for state in [] if quiet else states:
            for job_id in list(state.running):
                attempt = state.running[job_id]
                if rng.random() < 0.3:
                    state.record_checkpoint(job_id, now)
                if attempt.preempting_deadline is not None and attempt.preempting_deadline <= now:
                    state.end(job_id, requeue=True, now=now)
                elif rng.random() < 0.15 or attempt.limit_end <= now:
                    state.end(job_id, requeue=rng.random() < 0.3, now=now)
    return outcome


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), walk=st.booleans())
def test_remembered_candidates_change_nothing(seed: int, walk: bool) -> None:
    remembered, computed = both(history, seed, walk=walk, switch=(tiresias_memo, "REMEMBER"))
    assert remembered == computed


def answers(seed: int) -> list[Any]:
    """Every preemptor's `group_eligible`, `narrow` and `protection_end` for every group, at
    instants a few seconds to an hour apart with nothing changed between them (the fresh
    candidates and the protections that end are read against `now`), then after checkpoints."""
    rng = random.Random(seed)
    state = state_of(nodes(2, 8), queues(("a", 4), ("b", 4)))
    for i in range(16):
        if rng.random() < 0.7:
            occupy(
                state, f"r{i}", f"n{i // 8:02d}", [i % 8], queue=rng.choice("ab"),
                priority=rng.choice(["normal", "high"]), now=rng.choice([0.0, 500.0, 1500.0, 1900.0]),
            )  # fmt: skip
            if rng.random() < 0.5:
                state.record_checkpoint(JobId(f"r{i}"), rng.choice([1600.0, 1900.0]))
    pending: list[PendingJob] = [
        state.submit(
            job(f"p{i}", rng.choice("ab"), gpus=rng.choice([1, 2]), priority=rng.choice(["normal", "high"])),
            attained=rng.choice([0.0, 2000.0, 20_000.0]),
        )
        for i in range(8)
    ]
    args = {"thresholds": [1500.0, 15_000.0], "patience": 1000.0, "max_lost": rng.choice([300.0, 600.0])}
    plugin: Any = load_policy("tiresias", {"tiresias": args}).victims
    out: list[Any] = []
    now = 2000.0
    for _ in range(6):
        now += rng.choice([0.0, 10.0, 200.0, 3600.0])
        if rng.random() < 0.3:
            running = sorted(state.running)
            if running:
                state.record_checkpoint(rng.choice(running), now)
        state.occupancy.settle(now)
        groups = sorted(state.occupancy.members)
        for p in pending:
            narrowed = [plugin.narrow(p, g, state, now) for g in groups]
            out.append(
                (
                    [plugin.group_eligible(p, q, c, state, now) for q, c in groups],
                    [None if n is None else [a.spec.id for a in n] for n in narrowed],
                    plugin.protection_end(p, state, now),
                )
            )
    return out


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_remembered_answers_follow_the_time_and_the_checkpoints(seed: int) -> None:
    remembered, computed = both(answers, seed, switch=(tiresias_memo, "REMEMBER"))
    assert remembered == computed
