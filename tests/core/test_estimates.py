"""Run-time estimates from history: the estimator alone, then in the state and a cycle."""

from __future__ import annotations

import dataclasses

from corral.core.cycle import schedule
from corral.core.estimated_holds import CONFIDENT_DRAWN, ESTIMATES_KEPT, REFRESH, estimated_hold
from corral.core.estimates import BASES, Estimate, Estimator, keys_of
from corral.core.jobs import PendingJob
from corral.core.model import INFINITY, JobId, JobSpec, NodeSpec, QueueSpec
from corral.core.plugins import Profile
from corral.core.request import request_for
from corral.core.state import ClusterState
from corral.policies.ordering import ShortestEstimated, ShortestEstimatedArgs
from corral.policies.registry import load_policy


def job(queue: str = "a", user: str = "u", name: str = "train", gpus: int = 1, jid: str = "j") -> JobSpec:
    return JobSpec(id=JobId(jid), queue=queue, user=user, name=name, gpus_per_replica=gpus)


def test_no_history_no_estimate() -> None:
    assert Estimator().estimate(job()) is None


def test_the_most_detailed_key_with_enough_history_decides() -> None:
    est = Estimator(min_drawn=3)
    for seconds in (100.0, 110.0, 120.0):
        est.observe(job(name="train"), seconds)
    for seconds in (5000.0, 6000.0, 7000.0):
        est.observe(job(name="eval"), seconds)
    found = est.estimate(job(name="train"))
    assert found is not None and found.seconds == 110.0 and found.drawn_on == 3 and found.basis == BASES[0]
    # a new name of this user falls back to the user's jobs of this size: all six
    other = est.estimate(job(name="new"))
    assert other is not None and other.drawn_on == 6 and other.basis == BASES[1]
    # a new queue falls back to the cluster's history
    cluster = est.estimate(job(queue="b"))
    assert cluster is not None and cluster.basis == BASES[-1] and cluster.drawn_on == 6


def test_a_job_past_its_estimate_gets_a_later_one_from_longer_runs() -> None:
    est = Estimator(min_drawn=2)
    for seconds in (10.0, 20.0, 30.0, 1000.0, 2000.0):
        est.observe(job(), seconds)
    first = est.estimate(job())
    assert first is not None and first.seconds == 30.0
    later = est.estimate(job(), attained=40.0)  # only the runs longer than 40 s count now
    assert later is not None and later.seconds == 2000.0 and later.drawn_on == 2
    beyond = est.estimate(job(), attained=5000.0)  # longer than anything seen: twice the time run
    assert beyond is not None and beyond.seconds == 10000.0 and beyond.drawn_on == 0


def test_memory_is_bounded_per_key_and_in_keys() -> None:
    est = Estimator(keep=4, max_keys=12, min_drawn=1)
    for i in range(10):
        est.observe(job(), float(i))
    runs = est.runs[("q", "a")]
    assert runs.in_order() == [6.0, 7.0, 8.0, 9.0]  # the newest four, sorted
    for i in range(20):
        est.observe(job(name=f"n{i}"), 1.0)
    assert len(est.runs) <= 12


def _cluster() -> ClusterState:
    state = ClusterState.build([], [NodeSpec("n1", gpus=8)], [QueueSpec("a", quota=8)])
    state.estimator = Estimator(min_drawn=1)
    return state


def test_a_gang_behind_unlimited_jobs_is_reserved_from_their_estimated_ends() -> None:
    state = _cluster()
    profile = dataclasses.replace(load_policy("default"), hold_after=0.0)  # holds at once
    assert state.estimator is not None
    for _ in range(3):
        state.estimator.observe(job(gpus=4, name="small"), 600.0)
    for i in range(2):
        state.submit(JobSpec(id=JobId(f"s{i}"), queue="a", name="small", user="u", gpus_per_replica=4))
    schedule(state, profile, 0.0)
    assert all(a.limit_end == INFINITY for a in state.running.values())
    assert not state.by_estimate  # no search wants estimated ends yet: none kept
    state.submit(JobSpec(id=JobId("big"), queue="a", user="u", gpus_per_replica=8, submit_time=1.0, seq=1))
    result = schedule(state, profile, 1.0)
    assert all(a.estimated_end == 600.0 for a in state.running.values())
    assert [r.start for r in result.reservations] == [600.0]
    text = result.reasons[JobId("big")].message
    assert "reserved to start at about t=600s (estimated from 3 finished jobs of" in text
    # past its estimate, a running job is estimated again and is never stopped for it
    result = schedule(state, profile, 700.0)
    assert len(state.running) == 2 and all(a.estimated_end > 700.0 for a in state.running.values())


def test_finished_jobs_teach_the_state_estimator() -> None:
    state = _cluster()
    state.submit(JobSpec(id=JobId("x"), queue="a", user="u", name="t", gpus_per_replica=2))
    schedule(state, load_policy("default"), 0.0)
    state.end(JobId("x"), requeue=False, now=250.0)
    assert state.estimator is not None and state.estimator.observed == 1
    found = state.estimator.estimate(
        JobSpec(id=JobId("y"), queue="a", user="u", name="t", gpus_per_replica=2)
    )
    assert found is not None and found.seconds == 250.0


def test_estimates_hold_gpus_only_for_a_job_that_has_waited_hold_after() -> None:
    state = _cluster()
    profile = dataclasses.replace(load_policy("default"), hold_after=3600.0)
    assert state.estimator is not None
    for _ in range(3):
        state.estimator.observe(job(gpus=4, name="small"), 600.0)
    for i in range(2):
        state.submit(JobSpec(id=JobId(f"s{i}"), queue="a", name="small", user="u", gpus_per_replica=4))
    schedule(state, profile, 0.0)
    state.submit(JobSpec(id=JobId("big"), queue="a", user="u", gpus_per_replica=8, submit_time=1.0, seq=1))
    early = schedule(state, profile, 1.0)
    assert early.reservations == [] and early.next_wake == 3601.0
    assert (
        "GPUs are reserved for it from their estimated ends at t=3601s" in early.reasons[JobId("big")].message
    )
    late = schedule(state, profile, 3601.0)  # past their estimates: estimated again, and held now
    assert [r.job for r in late.reservations] == ["big"]
    assert "reserved to start at about" in late.reasons[JobId("big")].message


def _two_small_running(state: ClusterState, profile: Profile, runs: int) -> None:
    """Two 4-GPU jobs without a time limit run on the 8-GPU node; history holds `runs` of 600 s."""
    assert state.estimator is not None
    for _ in range(runs):
        state.estimator.observe(job(gpus=4, name="small"), 600.0)
    for i in range(2):
        state.submit(JobSpec(id=JobId(f"s{i}"), queue="a", name="small", user="u", gpus_per_replica=4))
    schedule(state, profile, 0.0)
    state.submit(JobSpec(id=JobId("big"), queue="a", user="u", gpus_per_replica=8, submit_time=1.0, seq=1))


def test_a_confident_estimate_holds_gpus_at_once_a_thin_one_after_hold_after() -> None:
    profile = dataclasses.replace(load_policy("default"), hold_after=3600.0)
    thin = _cluster()
    _two_small_running(thin, profile, CONFIDENT_DRAWN - 1)
    assert schedule(thin, profile, 1.0).reservations == []  # 99 past jobs: it waits for hold_after
    firm = _cluster()
    _two_small_running(firm, profile, CONFIDENT_DRAWN)
    result = schedule(firm, profile, 1.0)
    assert [(r.job, r.start) for r in result.reservations] == [("big", 600.0)]
    assert f"estimated from {CONFIDENT_DRAWN} finished jobs of" in result.reasons[JobId("big")].message


def test_an_estimated_reservation_is_searched_again_only_after_refresh_or_once_its_start_passed() -> None:
    state = _cluster()
    profile = dataclasses.replace(load_policy("default"), hold_after=0.0)
    _two_small_running(state, profile, 3)
    big = state.queues["a"].pending[JobId("big")]
    req = request_for(state, big.spec)
    found, _ = estimated_hold(state, big, req, 1.0)
    assert found is not None and found.start == 600.0
    state.end(JobId("s0"), requeue=False, now=2.0)  # history now says 4 GPUs free at once...
    state.end(JobId("s1"), requeue=False, now=2.0)
    again, _ = estimated_hold(state, big, req, 3.0)  # ...but the search is remembered
    assert again is not None and again.start == 600.0
    assert estimated_hold(state, big, req, 1.0 + REFRESH) == (None, None)  # searched again: none runs
    state.submit(JobSpec(id=JobId("s2"), queue="a", name="small", user="u", gpus_per_replica=4))
    big.estimated_hold = (REFRESH, 700.0, ((0, 8),), None)  # a start that has passed by t=701
    assert estimated_hold(state, big, req, 701.0)[0] is None  # searched again (s2 is pending, not running)


def test_shortest_estimated_delays_a_job_by_at_most_cap() -> None:
    order = ShortestEstimated(ShortestEstimatedArgs(weight=1.0, cap=3600.0))
    spec = JobSpec(id=JobId("long"), queue="a", gpus_per_replica=1, submit_time=100.0)
    pending = PendingJob(spec)
    pending.estimate = Estimate(10 * 86400.0, 50, BASES[2])
    assert order.key(pending)[1] == 100.0 + 3600.0
    pending.estimate = Estimate(60.0, 50, BASES[2])
    assert order.key(pending)[1] == 160.0


def test_estimated_ends_are_kept_only_while_reservation_searches_use_them() -> None:
    state = _cluster()
    profile = dataclasses.replace(load_policy("default"), hold_after=0.0)
    _two_small_running(state, profile, 3)
    assert not state.estimating and not state.by_estimate  # nothing blocked yet: nothing estimated
    schedule(state, profile, 1.0)  # the gang is blocked: the running jobs get estimated ends
    assert state.estimating and len(state.by_estimate) == 2
    state.remove_pending(JobId("big"))
    schedule(state, profile, 2.0 + ESTIMATES_KEPT)  # no search wanted them for a while: dropped
    assert not state.estimating and not state.by_estimate
    assert all(a.estimate_key is None for a in state.running.values())
    state.submit(JobSpec(id=JobId("big2"), queue="a", user="u", gpus_per_replica=8, submit_time=5.0, seq=2))
    result = schedule(state, profile, 3.0 + ESTIMATES_KEPT)  # wanted again: estimated again
    assert len(state.by_estimate) == 2 and [r.job for r in result.reservations] == [JobId("big2")]


def test_a_job_without_a_user_or_name_is_estimated_from_its_queue_and_size() -> None:
    est = Estimator(min_drawn=1)
    anonymous = JobSpec(id=JobId("x"), queue="a", gpus_per_replica=2)
    assert [bool(k) for k in keys_of(anonymous)] == [False, False, True, True, True]
    est.observe(anonymous, 50.0)
    est.observe(job(gpus=2, name=""), 70.0)  # a user, no name: no name key either
    assert len(est.runs) == 4  # (a, 2 GPUs), a, the cluster, and u's user key
    found = est.estimate(anonymous)
    assert found is not None and found.basis == BASES[2] and found.drawn_on == 2
    named = est.estimate(job(gpus=2, name=""))
    assert named is not None and named.basis == BASES[1] and named.drawn_on == 1
