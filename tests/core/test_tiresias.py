"""The `tiresias` policy: jobs inside a queue by attained-service level then FIFO, level
preemption bounded by the victim's lost work, promotion of long waits, fair share kept."""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.core.errors import ConfigError
from corral.core.jobs import PendingJob
from corral.core.model import INFINITY, JobId, NodeName, QueueSpec
from corral.core.plugins import Profile
from corral.core.state import ClusterState
from corral.policies.registry import load_policy, parse_plugin_args, policy_arguments
from tests.helpers import job, nodes, occupy, queues, run, state_of


def tiresias(**args: Any) -> Profile:
    return load_policy("tiresias", {"tiresias": args} if args else None)


def one_node(gpus: int = 1, *specs: QueueSpec) -> ClusterState:
    return state_of(nodes(1, gpus), list(specs))


def submit(state: ClusterState, job_id: str, attained: float = 0.0, **kw: Any) -> PendingJob:
    return state.submit(job(job_id, **kw), attained=attained)


def test_a_job_with_less_attained_service_goes_first_whatever_its_submit_time() -> None:
    state = one_node(1)
    submit(state, "served", attained=100_000.0, submit=0.0)  # level 1 (>= 57,600 GPU-s)
    submit(state, "fresh", submit=50.0)  # level 0
    assert [s.job for s in run(state, 100.0, tiresias()).starts] == ["fresh"]
    state = one_node(1)
    submit(state, "served", attained=100_000.0, submit=0.0)
    submit(state, "fresh", submit=50.0)
    assert [s.job for s in run(state, 100.0, "default").starts] == ["served"]  # default: FIFO


def test_inside_a_level_jobs_go_first_come_first_served() -> None:
    state = one_node(1)
    submit(state, "later", attained=1000.0, submit=20.0)
    submit(state, "earlier", attained=50_000.0, submit=10.0)  # more service, same level 0
    assert [s.job for s in run(state, 100.0, tiresias()).starts] == ["earlier"]


def test_thresholds_are_arguments_and_take_a_list() -> None:
    def first(profile: Profile) -> str:
        state = one_node(1)
        submit(state, "served", attained=5000.0, submit=0.0)
        submit(state, "fresh", submit=50.0)
        return run(state, 100.0, profile).starts[0].job

    assert first(tiresias()) == "served"  # 5,000 GPU-s: level 0 under the default threshold
    assert first(tiresias(thresholds=[3600.0])) == "fresh"
    from_cli = parse_plugin_args(["tiresias.thresholds=3600,57600", "tiresias.max_lost=60"])
    assert from_cli == {"tiresias": {"thresholds": [3600, 57600], "max_lost": 60}}
    assert first(load_policy("tiresias", from_cli)) == "fresh"
    assert policy_arguments("tiresias", parse_plugin_args(["tiresias.thresholds=3600"]))["tiresias"][
        "thresholds"
    ] == (3600,)
    assert parse_plugin_args(["tiresias.thresholds=[100, 200]"])["tiresias"]["thresholds"] == [100, 200]
    for bad in ([57600, 3600], [], [0]):
        with pytest.raises(ConfigError, match="thresholds"):
            tiresias(thresholds=bad)


def level_one_running(last_checkpoint: float | None) -> ClusterState:
    """A 4-GPU node run since t=0 by a job of class high (no minimum run time) that has reached
    level 1 (4 GPUs x 1,000 s > 3,600 GPU-s), and a fresh 4-GPU job of the same queue and class."""
    state = one_node(4)
    occupy(state, "old", "n00", range(4), priority="high", now=0.0)
    if last_checkpoint is not None:
        state.record_checkpoint(JobId("old"), last_checkpoint)
    submit(state, "new", gpus=4, priority="high", submit=900.0)
    return state


def test_a_better_level_preempts_only_a_victim_that_loses_at_most_max_lost() -> None:
    profile = tiresias(thresholds=[3600.0])
    assert not run(level_one_running(None), 1000.0, profile).preemptions  # 1,000 s of work lost
    assert not run(level_one_running(300.0), 1000.0, profile).preemptions  # 700 s > 600
    taken = run(level_one_running(500.0), 1000.0, profile).preemptions  # 500 s <= 600
    assert [(p.job, p.by) for p in taken] == [("old", "new")]
    assert run(level_one_running(None), 1000.0, tiresias(thresholds=[3600.0], max_lost=1000.0)).preemptions
    assert not run(level_one_running(500.0), 1000.0, "default").preemptions  # same class: never
    # a level no better than the victim's (its service is as high) preempts nobody
    state = one_node(4)
    occupy(state, "old", "n00", range(4), priority="high", now=0.0)
    state.record_checkpoint(JobId("old"), 999.0)
    submit(state, "new", attained=10_000.0, gpus=4, priority="high", submit=900.0)
    assert not run(state, 1000.0, profile).preemptions


def test_the_cycle_wakes_when_a_victim_of_a_worse_level_leaves_its_min_runtime() -> None:
    """A victim of the preemptor's own queue and class inside its `min_runtime` (class low: 600 s)
    that will be in a worse level then: the cycle is due at the protection's end, and takes it."""
    profile = tiresias(thresholds=[1000.0])
    state = one_node(4)
    occupy(state, "old", "n00", range(4), priority="low", now=0.0)  # 2,400 GPU-s at t=600: level 1
    state.record_checkpoint(JobId("old"), 450.0)
    submit(state, "new", gpus=4, priority="low", submit=100.0)
    result = run(state, 500.0, profile)
    assert not result.preemptions and result.next_wake == 600.0
    assert "protected by min_runtime until t=600s" in result.reasons["new"].message
    state.record_checkpoint(JobId("old"), 590.0)
    assert [(p.job, p.by) for p in run(state, 600.0, profile).preemptions] == [("old", "new")]
    # one that will still be in the preemptor's level then is no reason to wake
    state = one_node(4)
    occupy(state, "old", "n00", range(4), priority="low", now=0.0)
    state.record_checkpoint(JobId("old"), 450.0)
    submit(state, "new", gpus=4, priority="low", submit=100.0)
    assert run(state, 500.0, tiresias(thresholds=[3600.0])).next_wake == INFINITY
    # nor one that will have more than `max_lost` to lose (no checkpoint, started 600 s before)
    state = one_node(4)
    occupy(state, "old", "n00", range(4), priority="low", now=0.0)
    submit(state, "new", gpus=4, priority="low", submit=100.0)
    assert run(state, 500.0, tiresias(thresholds=[1000.0], max_lost=300.0)).next_wake == INFINITY


def test_a_job_waiting_longer_than_starve_is_promoted_to_the_first_level() -> None:
    def first_started(now: float, profile: Profile) -> tuple[str, float]:
        state = one_node(1)
        occupy(state, "busy", "n00", [0], priority="urgent", now=0.0)
        submit(state, "served", attained=100_000.0, submit=0.0)
        submit(state, "fresh", submit=10.0)
        wake = run(state, 20.0, profile).next_wake
        state.end(JobId("busy"), requeue=False, now=now)
        return run(state, now, profile).starts[0].job, wake

    assert first_started(400.0, tiresias(starve=500.0)) == ("fresh", 500.0)  # waits for the promotion
    assert first_started(600.0, tiresias(starve=500.0))[0] == "served"
    assert first_started(600.0, tiresias())[0] == "fresh"  # starve 0: never promoted


def test_a_requeued_job_waits_again_from_its_requeue_before_promotion() -> None:
    state = one_node(1)
    profile = tiresias(starve=500.0, thresholds=[100.0])
    submit(state, "a", submit=0.0)
    assert [s.job for s in run(state, 0.0, profile).starts] == ["a"]
    state.end(JobId("a"), requeue=True, now=1000.0)  # 1,000 GPU-s: level 1, queued again at 1,000
    requeued = state.jobs[JobId("a")]
    assert requeued.queued_at == 1000.0 and not requeued.promoted
    occupy(state, "busy", "n00", [0], priority="urgent", now=1000.0)
    assert run(state, 1400.0, profile).next_wake == 1500.0
    run(state, 1500.0, profile)
    assert state.jobs[JobId("a")].promoted


def test_fair_share_between_queues_is_kept() -> None:
    """Levels order jobs inside a queue only: the queue under its quota is served first, and a
    better level never preempts across queues (only reclaim does, as in `default`)."""
    qa, qb = queues(("a", 4), ("b", 4))
    state = state_of(nodes(1, 8), [qa, qb])
    occupy(state, "a-run", "n00", range(4), queue="a", priority="high", now=0.0)
    occupy(state, "b-run", "n00", range(4, 7), queue="b", priority="high", now=0.0)
    state.record_checkpoint(JobId("b-run"), 990.0)
    submit(state, "a-fresh", queue="a", priority="high", submit=10.0)  # level 0, queue at its quota
    submit(state, "b-served", queue="b", attained=1e6, priority="high", submit=20.0)  # level 1
    result = run(state, 1000.0, tiresias(thresholds=[3600.0]))
    assert [s.job for s in result.starts] == ["b-served"] and not result.preemptions
    state = state_of(nodes(1, 8), [qa, qb])
    occupy(state, "a-run", "n00", range(4), queue="a", priority="high", now=0.0)
    occupy(state, "b-run", "n00", range(4, 8), queue="b", priority="high", now=0.0)
    state.record_checkpoint(JobId("b-run"), 990.0)  # level 1, 10 s to lose: but b is at its quota
    submit(state, "a-fresh", queue="a", gpus=4, priority="high", submit=10.0)
    assert not run(state, 1000.0, tiresias(thresholds=[3600.0])).preemptions


def borrowed(checkpoint: float | None = None) -> ClusterState:
    """Queue b (quota 4) runs 8 GPUs since t=0 (two 4-GPU jobs, class high: no minimum run time);
    queue a (quota 4) has a 4-GPU job waiting since t=1,000."""
    qa, qb = queues(("a", 4), ("b", 4))
    state = state_of(nodes(1, 8), [qa, qb])
    occupy(state, "b-x", "n00", range(4), queue="b", priority="high", now=0.0)
    occupy(state, "b-y", "n00", range(4, 8), queue="b", priority="high", now=0.0)
    if checkpoint is not None:
        state.record_checkpoint(JobId("b-y"), checkpoint)
    submit(state, "a-job", queue="a", gpus=4, priority="high", submit=1000.0)
    return state


def test_patience_reclaims_only_from_borrowers_with_little_to_lose_until_it_ends() -> None:
    patient = tiresias(patience=3600.0)
    assert [p.job for p in run(borrowed(), 1000.0, tiresias(patience=0.0)).preemptions] == ["b-x"]  # at once
    assert not run(borrowed(), 1000.0, tiresias()).preemptions  # six hours by default
    assert not run(borrowed(), 1000.0, patient).preemptions  # each would lose 1,000 s > 600
    assert not run(borrowed(), 4599.0, patient).preemptions
    assert len(run(borrowed(), 4600.0, patient).preemptions) == 1  # patience over: the guarantee
    # one that checkpointed within `max_lost` is taken at once, patience or not
    assert [p.job for p in run(borrowed(checkpoint=900.0), 1000.0, patient).preemptions] == ["b-y"]
    with pytest.raises(ConfigError, match="patience"):
        tiresias(patience=-1.0)


def test_only_fresh_candidates_are_read_for_level_preemption() -> None:
    """`Occupancy.fresh` keeps the candidates by last checkpoint, as checkpoints come."""
    state = state_of(nodes(1, 8), [])
    for i in range(4):
        occupy(state, f"r{i}", "n00", [i], priority="high", now=float(i))
    group = ("default", 1000)
    state.occupancy.settle(10.0)
    assert [i for _, i in state.occupancy.fresh(group)] == ["r0", "r1", "r2", "r3"]  # type: ignore[arg-type]
    state.record_checkpoint(JobId("r0"), 9.0)
    state.end(JobId("r2"), requeue=False, now=10.0)
    assert [(t, i) for t, i in state.occupancy.fresh(group)] == [(1.0, "r1"), (3.0, "r3"), (9.0, "r0")]  # type: ignore[arg-type]
    assert state.running[JobId("r1")].job.spec.queue == "default"
    assert NodeName("n00") in state.node_ids


def test_victim_selection_reads_only_the_narrowed_attempts_of_the_own_group() -> None:
    """`narrow`: of its own queue and class, only the candidates in a worse level that checkpointed
    within `max_lost`; of another queue, while its patience lasts, only those that checkpointed
    within `max_lost`; a lower class of its own queue whole (None); `default` has no such method."""
    profile = tiresias(thresholds=[1500.0])
    state = state_of(nodes(2, 8), queues(("default", 8), ("other", 8)))
    occupy(state, "stale", "n00", range(4), priority="high", now=0.0)  # level 1, 1,000 s to lose
    occupy(state, "fresh", "n00", range(4, 6), priority="high", now=0.0)  # level 1, checkpointed
    occupy(state, "young", "n00", [6], priority="high", now=900.0)  # level 0
    occupy(state, "lower", "n00", [7], priority="normal", now=0.0)  # another class
    state.record_checkpoint(JobId("fresh"), 950.0)
    preemptor = submit(state, "new", gpus=8, priority="high", submit=900.0)
    state.occupancy.settle(1000.0)
    plugin = profile.victims
    narrow = getattr(plugin, "narrow")  # noqa: B009
    assert [a.spec.id for a in narrow(preemptor, ("default", 1000), state, 1000.0)] == ["fresh"]
    assert narrow(preemptor, ("default", 100), state, 1000.0) is None  # a lower class: the whole group
    occupy(state, "borrower", "n01", range(8), queue="other", now=0.0)  # 1,000 s to lose
    assert narrow(preemptor, ("other", 100), state, 1000.0) == []  # patience: only the fresh
    whole = getattr(tiresias(patience=0.0).victims, "narrow")  # noqa: B009
    assert whole(preemptor, ("other", 100), state, 1000.0) is None  # no patience: the whole group
    assert not hasattr(load_policy("default").victims, "narrow")


def random_cluster(seed: int) -> tuple[ClusterState, list[PendingJob], Any, float]:
    """Two queues that borrow, two classes, candidates that checkpointed or not, preemptors of
    several levels, some of whose `patience` is over."""
    rng = random.Random(seed)
    qa, qb = queues(("a", 4), ("b", 4))
    state = state_of(nodes(2, 8), [qa, qb])
    for i in range(16):
        if rng.random() < 0.6:
            occupy(
                state, f"r{i}", f"n{i // 8:02d}", [i % 8], queue=rng.choice("ab"),
                priority=rng.choice(["normal", "high"]), now=rng.choice([0.0, 500.0, 1500.0]),
            )  # fmt: skip
            if rng.random() < 0.5:
                state.record_checkpoint(JobId(f"r{i}"), rng.choice([1600.0, 1900.0]))
    pending = [
        submit(
            state,
            f"p{i}",
            attained=rng.choice([0.0, 2000.0, 20_000.0]),
            queue=rng.choice("ab"),
            gpus=rng.choice([1, 2]),
            priority=rng.choice(["normal", "high"]),
            submit=rng.choice([0.0, 1500.0]),
        )
        for i in range(12)
    ]
    plugin: Any = tiresias(thresholds=[1500.0, 15_000.0], patience=1000.0).victims
    now = 2000.0
    state.occupancy.settle(now)
    return state, pending, plugin, now


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_preemptors_of_one_key_are_told_the_same_victims(seed: int) -> None:
    """`preemptor_key` holds all that the victims plugin reads of a preemptor at `now` (a cycle's
    memory of victim searches is keyed by it): two preemptors with equal keys get the same
    `group_eligible`, `narrow`, `eligible` and `rank` answers, on random clusters where queues
    borrow, candidates checkpoint, preemptors differ by level and by whether `patience` is over."""
    state, pending, plugin, now = random_cluster(seed)
    groups = sorted(state.occupancy.members)
    attempts = list(state.running.values())

    def seen(p: PendingJob) -> tuple[Any, ...]:
        narrowed = [plugin.narrow(p, g, state, now) for g in groups]
        return (
            [plugin.group_eligible(p, q, c, state, now) for q, c in groups],
            [None if n is None else sorted(a.spec.id for a in n) for n in narrowed],
            [plugin.eligible(p, a, state, now) for a in attempts],
            [a.spec.id for a in plugin.rank(p, attempts, state, now)],
        )

    by_key: dict[Any, tuple[Any, ...]] = {}
    for p in pending:
        key = plugin.preemptor_key(p, now)
        assert by_key.setdefault(key, seen(p)) == seen(p), key


def test_a_higher_class_preempts_a_lower_class_of_its_own_queue_during_its_patience() -> None:
    """`patience` bounds reclaim from other queues only: a job of a higher class takes the GPUs of
    a lower class of its own queue at once, as `default` does, even a victim without a recent
    checkpoint (the candidates of its own queue's lower classes are not narrowed to fresh ones)."""

    def lower_class_running() -> ClusterState:
        state = one_node(1)
        occupy(state, "low", "n00", [0], priority="low", now=0.0)  # no checkpoint since t=0
        submit(state, "high", priority="high", submit=1000.0)
        return state

    assert [(p.job, p.by) for p in run(lower_class_running(), 1000.0, "default").preemptions] == [
        ("low", "high")
    ]
    for profile in (tiresias(), tiresias(patience=3600.0), tiresias(estimate_weight=0.0)):
        taken = run(lower_class_running(), 1000.0, profile).preemptions
        assert [(p.job, p.by) for p in taken] == [("low", "high")]


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_narrow_never_drops_a_victim_that_eligible_allows(seed: int) -> None:
    """`narrow` only spares the victim search reading candidates `eligible` would refuse: every
    candidate of a group that `eligible` allows is among the narrowed ones (it failed for a lower
    class of the preemptor's own queue, narrowed to the fresh ones during its patience)."""
    state, pending, plugin, now = random_cluster(seed)
    for p in pending:
        for group, members in state.occupancy.members.items():
            narrowed = plugin.narrow(p, group, state, now)
            if narrowed is None:
                continue
            allowed = {i for i, a in members.items() if plugin.eligible(p, a, state, now)}
            assert allowed <= {a.spec.id for a in narrowed}, (p.spec.id, group)
