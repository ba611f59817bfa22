"""Passing over jobs that repeat an answer gives every job what looking at each would give.

The same random cluster, backlog and sequence of cycles runs twice: once with `repeats.Walk`
(families of jobs passed over by bisection, jobs that no backfill window can hold passed with
them) and the one-job shortcut, and once looking at every job in order; starts, preemptions,
nominations, reservations, rejections and every job's reason must be identical.
"""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from corral.core import cycle as cycle_module
from corral.core import limits as limits_module
from corral.core import order, repeats
from corral.core.cycle import schedule
from corral.core.decisions import CycleResult
from corral.core.estimates import Estimator
from corral.core.jobs import PendingJob
from corral.core.model import JobId, JobSpec, NodeName, NodeSpec, QueueName, QueueSpec
from corral.core.plugins import Profile
from corral.core.state import ClusterState
from corral.policies.registry import load_policy
from tests.helpers import check_no_double_allocation

CLASSES = [(0, "low"), (100, "normal"), (1000, "high")]


def play(seed: int, policy: str, limits: int = 0, budget: bool = False) -> list[tuple[Any, ...]]:
    """A backlog of few shapes over a busy cluster, cycles with endings, holds and backoffs between.

    `limits`: 0, time limits of None, 10 minutes or an hour; else up to that many distinct ones
    (the jobs of one family then differ by their time limits, as on a real backlog). `budget`:
    tight queue limits (most jobs are kept out by their own queue's budget), attained services on
    every level, and two time limits (a verdict key's jobs span levels: `Verdict.part`).
    """
    rng = random.Random(seed)
    nodes = [
        NodeSpec(NodeName(f"n{i}"), 8, "H100-80GB", labels={"leaf": f"l{i // 4}"})
        for i in range(rng.randint(2, 8))
    ]
    total = 8 * len(nodes)
    queues = [
        QueueSpec(
            QueueName(f"q{i}"),
            quota=rng.choice([0, total // 4]) if not budget else rng.choice([0, total // 8]),
            limit=rng.choice([None, total // 2]) if not budget else rng.choice([total // 8, total // 4]),
            cohort="c",
        )
        for i in range(3)
    ]
    state = ClusterState.build(("leaf",), nodes, queues)
    profile = load_policy("tiresias" if policy == "tiresias_estimated" else policy)
    tiresias = {"thresholds": [3600.0, 36000.0], "starve": 1200.0, "patience": 900.0}
    if policy == "tiresias":  # levels that the services below cross, promotions, checkpoints
        profile = load_policy(policy, {"tiresias": tiresias})
    names = [""]
    if policy == "tiresias_estimated":  # and inside a level by estimates, which a family's names
        # set apart (so its jobs are met out of submit order), and reservations on estimated ends
        estimated = {"estimate_weight": 1.0, "estimate_cap": 3600.0, "hold_after": 600.0}
        profile = load_policy("tiresias", {"tiresias": {**tiresias, **estimated}})
        state.estimator = Estimator(min_drawn=1)
        names = ["short", "mid", "long"]
        for name, seconds in zip(names, (60.0, 1800.0, 7200.0), strict=True):
            for replicas, gpus in ((1, 1), (1, 2), (1, 4), (1, 8), (2, 8), (3, 8)):
                for queue in ("q0", "q1", "q2"):
                    past = JobSpec(JobId("past"), QueueName(queue), replicas=replicas, gpus_per_replica=gpus)
                    past = replace(past, name=name, user="u")
                    state.estimator.observe(past, seconds)
    shapes = [(1, 1), (1, 2), (1, 4), (1, 8), (2, 8), (3, 8)]
    outcome: list[tuple[Any, ...]] = []
    now, seq = 0.0, 0
    choices: list[float | None] = [None, 600.0, 3600.0]
    if limits:
        choices = [None, *(300.0 * rng.randint(1, 48) for _ in range(limits))]
    services = [0.0, 5000.0, 50000.0]
    if budget:
        choices, services = [None, 3600.0], [0.0, 2000.0, 5000.0, 20000.0, 50000.0]
    for _ in range(rng.randint(3, 8)):
        for _ in range(rng.choice([1, rng.randint(0, 60 + 2 * limits)])):  # often one job: the shortcut
            seq += 1
            replicas, gpus = rng.choice(shapes)
            prio, name = rng.choice(CLASSES)
            queue = rng.choice(queues).name
            spec = JobSpec(
                JobId(f"j{seq}"), queue, replicas=replicas, gpus_per_replica=gpus,
                priority=prio, priority_class=name, submit_time=now, seq=seq,
                time_limit=rng.choice(choices), preemptible=rng.random() > 0.1,
                name=rng.choice(names) if len(names) > 1 else "", user="u" if len(names) > 1 else "",
            )  # fmt: skip
            state.submit(spec, attained=rng.choice(services))
        for job in list(state.jobs.values()):
            if rng.random() < 0.05:
                job.held = not job.held
            if rng.random() < 0.05:
                job.not_before = now + rng.choice([-10.0, 0.0, 100.0])
        result = schedule(state, profile, now)
        check_no_double_allocation(state)
        outcome.append(summary(result))
        now += rng.choice([1.0, 300.0, 900.0])
        for job_id in list(state.running):
            attempt = state.running[job_id]
            if policy.startswith("tiresias") and rng.random() < 0.3:
                state.record_checkpoint(job_id, now - rng.choice([0.0, 100.0]))
            if attempt.preempting_deadline is not None and attempt.preempting_deadline <= now:
                state.end(job_id, requeue=True, now=now)
            elif rng.random() < 0.3 or attempt.limit_end <= now:
                state.end(job_id, requeue=False, now=now)
    return outcome


def summary(result: CycleResult) -> tuple[Any, ...]:
    return (
        [(s.job, s.placement, s.backfilled) for s in result.starts],
        [(p.job, p.by) for p in result.preemptions],
        [(n.job, n.placement, n.victims) for n in result.nominations],
        [(r.job, r.start, r.capacity) for r in result.reservations],
        [(r.job, r.reason) for r in result.rejections],
        sorted((j, r.code.value, r.message) for j, r in result.reasons.items()),
        result.others,
        result.considered,
        result.next_wake,
    )


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1),
    policy=st.sampled_from(["default", "las", "tiresias", "tiresias_estimated"]),
)
@example(seed=12, policy="las")  # a later job of a verdict key passed at another level repeats its answer
@example(seed=822, policy="default")  # the walk nominated j32 over j7; the long way started j21
def test_passing_over_repeats_changes_nothing(seed: int, policy: str) -> None:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(repeats, "FEW_JOBS", 0)  # walk even over a handful of jobs
        walked = play(seed, policy)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(repeats, "MANY_SHAPES", -1)  # look at every job
        patch.setattr(order, "ONE_JOB_SHORTCUT", False)  # even when only one waits
        looked = play(seed, policy)
    assert walked == looked


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1),
    policy=st.sampled_from(["default", "las", "default", "tiresias", "tiresias_estimated"]),
    limits=st.sampled_from([4, 12, 40]),
)
# a budget preemption's admission check (`Preemption._admitted`) answered from borrowing rooms
# that an earlier look had remembered at the same use version, without the GPUs its victims free
@example(seed=796, policy="default", limits=12)
def test_passing_over_jobs_no_backfill_window_holds_changes_nothing(
    seed: int, policy: str, limits: int
) -> None:
    """Families whose jobs differ by their time limits: the walk passes over the jobs that no
    backfill window can hold, and looks at the rest; nothing differs from looking at each. Small
    blocks of the families' time limits (`limits.FamilyLimits`), so that a family spans many."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(repeats, "FEW_JOBS", 0)
        patch.setattr(limits_module, "BLOCK", 2)
        walked = play(seed, policy, limits)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(repeats, "MANY_SHAPES", -1)
        patch.setattr(order, "ONE_JOB_SHORTCUT", False)
        looked = play(seed, policy, limits)
    assert walked == looked


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), policy=st.sampled_from(["las", "tiresias", "tiresias_estimated"]))
def test_passing_over_jobs_kept_out_by_their_queues_budget_changes_nothing(seed: int, policy: str) -> None:
    """Families kept out by their own queue's budget, whose victims read a part beyond the family
    (las: below the top level; tiresias: the level): the walk passes each part's jobs as one run,
    each told its verdict key's first answer (a key's first job may be of another part), and
    nothing differs from looking at each."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(repeats, "FEW_JOBS", 0)
        walked = play(seed, policy, budget=True)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(repeats, "MANY_SHAPES", -1)
        patch.setattr(order, "ONE_JOB_SHORTCUT", False)
        looked = play(seed, policy, budget=True)
    assert walked == looked


def behind_backlog(now: float) -> tuple[ClusterState, list[JobId]]:
    """Two nodes; one runs a job for two hours, the other is free but held for a two-node gang's
    reservation; 40 one-GPU jobs, each with its own time limit, all ending after that start."""
    nodes = [NodeSpec(NodeName(f"n{i}"), 8, "H100-80GB", labels={"leaf": "l0"}) for i in range(2)]
    state = ClusterState.build(("leaf",), nodes, [QueueSpec(QueueName("q"))])
    state.submit(JobSpec(JobId("filler"), QueueName("q"), gpus_per_replica=8, time_limit=7200.0, seq=0))
    schedule(state, load_policy("default"), now)
    state.submit(JobSpec(JobId("gang"), QueueName("q"), replicas=2, gpus_per_replica=8, seq=1))
    small = [JobId(f"s{i}") for i in range(40)]
    for i, job in enumerate(small):
        state.submit(JobSpec(job, QueueName("q"), gpus_per_replica=1, time_limit=10800.0 + 60 * i, seq=2 + i))
    return state, small


def looks_and_outcome(
    build: Any, policy: str | Profile, walk: bool
) -> tuple[tuple[Any, ...], int, list[JobId]]:
    """Run one cycle on the state `build()` gives (at 60 s), walking or looking at every job;
    its summary and how many jobs it looked at."""
    looks: list[JobId] = []
    plain = cycle_module._Cycle.consider

    def counted(self: cycle_module._Cycle, job: PendingJob) -> bool:
        looks.append(job.spec.id)
        return plain(self, job)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cycle_module._Cycle, "consider", counted)
        if not walk:
            patch.setattr(repeats, "MANY_SHAPES", -1)
        state, jobs = build()
        looks.clear()
        result = schedule(state, load_policy(policy) if isinstance(policy, str) else policy, 60.0)
    return summary(result), len(looks), jobs


def test_jobs_held_behind_a_reservation_are_passed_each_told_its_own_end() -> None:
    """The jobs held behind the gang's reservation are told the same but for when each would end:
    the walk looks at a few of them and gives every one its own sentence, as looking at each does."""
    walked, walked_looks, small = looks_and_outcome(lambda: behind_backlog(0.0), "default", True)
    looked, looked_looks, _ = looks_and_outcome(lambda: behind_backlog(0.0), "default", False)
    assert walked == looked
    assert looked_looks == 41 and walked_looks <= 3
    reasons = {job: message for job, code, message in walked[5]}
    assert all(reasons[job].count("it would run until") == 1 for job in small)
    assert len({reasons[job] for job in small}) == len(small)  # each names its own end
    assert {code for job, code, _ in walked[5] if job in small} == {"behind_reservation"}


def protected_backlog() -> tuple[ClusterState, list[JobId]]:
    """Two full nodes whose jobs are inside their `min_runtime`; 40 one-GPU jobs of one family,
    half below las's top attained-service level (they could preempt later), half at the top."""
    nodes = [NodeSpec(NodeName(f"n{i}"), 8, "H100-80GB", labels={"leaf": "l0"}) for i in range(2)]
    state = ClusterState.build(("leaf",), nodes, [QueueSpec(QueueName("q"))])
    for i in range(2):
        state.submit(JobSpec(JobId(f"run{i}"), QueueName("q"), gpus_per_replica=8, seq=i), attained=1e6)
    schedule(state, load_policy("las"), 0.0)
    waiting = [JobId(f"w{i}") for i in range(40)]
    for i, job in enumerate(waiting):
        spec = JobSpec(job, QueueName("q"), gpus_per_replica=1, time_limit=3600.0 + 60 * i, seq=10 + i)
        state.submit(spec, attained=0.0 if i % 2 else 50000.0)
    return state, waiting


def test_las_passes_the_jobs_of_one_attained_service_part_together() -> None:
    """Under las, when the jobs' victims are protected, the sentence depends on whether the job
    is below the top attained-service level: the walk looks at one job per part, not each."""
    walked, walked_looks, waiting = looks_and_outcome(protected_backlog, "las", True)
    looked, looked_looks, _ = looks_and_outcome(protected_backlog, "las", False)
    assert walked == looked
    assert looked_looks == 40 and walked_looks <= 4
    reasons = {job: message for job, code, message in walked[5]}
    protected = {job for job in waiting if "protected by min_runtime" in reasons[job]}
    assert protected == {job for i, job in enumerate(waiting) if i % 2}  # below the top level only


def over_budget_backlog() -> tuple[ClusterState, list[JobId]]:
    """Four nodes; queue q, limited to 16 GPUs, runs two 8-GPU jobs of a worse level, one just
    checkpointed (a level-0 job could take it), one inside its `min_runtime`; 40 one-GPU jobs of
    one family wait, kept out by the limit: level 0, then level 1 (every other one with the time
    limit of a level-0 job: its verdict key), each time limit its job's own otherwise."""
    nodes = [NodeSpec(NodeName(f"n{i}"), 8, "H100-80GB", labels={"leaf": "l0"}) for i in range(4)]
    state = ClusterState.build(("leaf",), nodes, [QueueSpec(QueueName("q"), limit=16)])
    for i, at in enumerate((-600.0, 0.0)):
        spec = JobSpec(JobId(f"run{i}"), QueueName("q"), gpus_per_replica=8, seq=i, submit_time=at)
        state.submit(spec, attained=1e6)
        state.jobs[spec.id].not_before = at
        schedule(state, load_policy("tiresias"), at)
    state.record_checkpoint(JobId("run0"), 0.0)
    state.occupancy.settle(60.0)  # run0 is a candidate at 60 (a victim search settles it; none runs)
    waiting = [JobId(f"w{i}") for i in range(40)]
    for i, job in enumerate(waiting):
        top = i >= 20
        limit = 3600.0 + 60 * (i - 20 if top and i % 2 == 0 else i)
        spec = JobSpec(job, QueueName("q"), gpus_per_replica=1, time_limit=limit, seq=10 + i)
        state.submit(spec, attained=1e5 if top else 0.0)
    return state, waiting


def test_tiresias_passes_the_jobs_of_one_level_kept_out_by_their_queues_limit_together() -> None:
    """Kept out by their queue's limit with no victim search left to run (none allowed), level-0
    jobs are told when a victim leaves its `min_runtime` (their group has a candidate of a worse
    level), level-1 jobs not: the walk looks at one job per level, not each, and a level-1 job
    whose time limit a level-0 job had is told that job's answer (`consider` repeats a verdict
    key's first answer, and looks at no other job of it)."""
    profile = replace(load_policy("tiresias", {"tiresias": {"max_lost": 300.0}}), max_preemption_tries=0)
    walked, walked_looks, waiting = looks_and_outcome(over_budget_backlog, profile, True)
    looked, looked_looks, _ = looks_and_outcome(over_budget_backlog, profile, False)
    assert walked == looked
    assert looked_looks == 30 and walked_looks <= 4, walked_looks
    reasons = {job: message for job, code, message in walked[5]}
    protected = {job for job in waiting if "protected by min_runtime" in reasons[job]}
    # level 0, and the level-1 jobs that repeat a level-0 job's answer
    assert protected == {job for i, job in enumerate(waiting) if i < 20 or i % 2 == 0}
    assert {code for job, code, _ in walked[5] if job in waiting} == {"limit"}


def gangs_behind_their_head() -> tuple[ClusterState, list[JobId]]:
    """Two nodes, one busy for two hours; 30 two-node gangs of one family: the first takes a
    reservation (the walk's epoch changes right after it is looked at), the others repeat its
    verdict key's answer."""
    nodes = [NodeSpec(NodeName(f"n{i}"), 8, "H100-80GB", labels={"leaf": "l0"}) for i in range(2)]
    state = ClusterState.build(("leaf",), nodes, [QueueSpec(QueueName("q"))])
    state.submit(JobSpec(JobId("filler"), QueueName("q"), gpus_per_replica=8, time_limit=7200.0, seq=0))
    schedule(state, load_policy("default"), 0.0)
    gangs = [JobId(f"g{i}") for i in range(30)]
    for i, job in enumerate(gangs):
        state.submit(JobSpec(job, QueueName("q"), replicas=2, gpus_per_replica=8, seq=1 + i))
    return state, gangs


def test_a_family_repeating_an_answer_after_its_head_changed_the_epoch_is_passed_in_one_run() -> None:
    """The head's reservation changes the epoch before the walk can settle its family: the rest
    repeat the head's answer and are told it as one run, not one job at a time (each through the
    walk's heap: on Philly with reservations from estimates, 5.7 M heap pushes in 15,000 jobs)."""
    looked, _, _ = looks_and_outcome(gangs_behind_their_head, "default", False)
    state, gangs = gangs_behind_their_head()
    result = schedule(state, load_policy("default"), 60.0)
    one_by_one = len(result.reasons._one)  # jobs given a reason each (before any read unfolds runs)
    assert summary(result) == looked
    assert [r.job for r in result.reservations] == [JobId("g0")]
    assert one_by_one <= 2, one_by_one  # the head (and the job after it), the rest in one run
    assert len({result.reasons[job] for job in gangs[1:]}) == 1  # the head's first answer, repeated
