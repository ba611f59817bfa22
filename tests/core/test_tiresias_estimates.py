"""`tiresias`' options that read run times learned from history: the order inside a level by
estimated remaining run time (`estimate_weight`, `estimate_cap`), and reservations on the
estimated ends of jobs without a time limit (`hold_after`). The order is on by default
(`estimate_weight` 4: issue 16, ninth pass), the holds off."""

from __future__ import annotations

from typing import Any

import pytest

from corral.core.errors import ConfigError
from corral.core.estimates import BASES, Estimate, Estimator
from corral.core.jobs import PendingJob
from corral.core.model import INFINITY, JobId, JobSpec, NodeSpec, QueueSpec
from corral.core.plugins import Profile
from corral.core.state import ClusterState
from corral.policies.registry import load_policy, parse_plugin_args
from corral.policies.tiresias import Tiresias, TiresiasArgs
from tests.helpers import run


def tiresias(**args: Any) -> Profile:
    return load_policy("tiresias", {"tiresias": args} if args else None)


def learned(gpus: int = 8) -> ClusterState:
    """One node of `gpus` GPUs, one queue; history: jobs named `short` ran 60 s, `long` 36,000 s
    (on 1 and on 4 GPUs)."""
    state = ClusterState.build([], [NodeSpec("n1", gpus=gpus)], [QueueSpec("a", quota=gpus)])
    state.estimator = Estimator(min_drawn=1)
    for name, seconds in (("short", 60.0), ("long", 36_000.0)):
        for size in (1, 4):
            for _ in range(3):
                past = JobSpec(JobId("past"), "a", name=name, user="u", gpus_per_replica=size)
                state.estimator.observe(past, seconds)
    return state


def spec(job_id: str, name: str, submit: float, gpus: int = 1) -> JobSpec:
    return JobSpec(
        JobId(job_id), "a", name=name, user="u", gpus_per_replica=gpus, submit_time=submit, seq=int(submit)
    )


def test_the_order_by_estimates_is_on_by_default_and_the_holds_off() -> None:
    profile = tiresias()
    assert profile.uses_estimates and profile.hold_after is None
    assert profile.job_order.args.estimate_weight == 4.0  # type: ignore[attr-defined]
    assert not tiresias(estimate_weight=0.0).uses_estimates  # off: nothing is learned
    assert tiresias(hold_after=3600.0).hold_after == 3600.0
    from_cli = parse_plugin_args(["tiresias.estimate_weight=0.5", "tiresias.hold_after=86400"])
    profile = load_policy("tiresias", from_cli)
    assert profile.uses_estimates and profile.hold_after == 86_400.0
    for bad in ({"estimate_weight": -1.0}, {"estimate_cap": -1.0}, {"hold_after": -5.0}, {"hold_after": "x"}):
        with pytest.raises(ConfigError):
            tiresias(**bad)


def test_inside_a_level_the_shortest_estimated_job_goes_first() -> None:
    def first(profile: Profile) -> str:
        state = learned(gpus=1)
        state.submit(spec("long", "long", 0.0))
        state.submit(spec("short", "short", 10.0))
        return run(state, 20.0, profile).starts[0].job

    assert first(tiresias(estimate_weight=0.0)) == "long"  # first come, first served
    assert first(tiresias()) == "short"  # the default weight, 4
    assert first(tiresias(estimate_weight=1.0)) == "short"  # placed at 60 s against 36,000 s
    assert first(tiresias(estimate_weight=1.0, estimate_cap=5.0)) == "long"  # delayed 5 s at most
    # a level still comes first: a short job that has received much service waits behind
    state = learned(gpus=1)
    state.submit(spec("long", "long", 0.0))
    state.submit(spec("short", "short", 10.0), attained=100_000.0)  # level 1
    assert run(state, 20.0, tiresias(estimate_weight=1.0)).starts[0].job == "long"


def test_the_estimated_remaining_run_time_delays_a_job_and_its_patience() -> None:
    plugin = Tiresias(TiresiasArgs(estimate_weight=2.0, estimate_cap=3600.0, patience=100.0))
    job = PendingJob(JobSpec(JobId("j"), "a", gpus_per_replica=2, submit_time=50.0))
    assert plugin.placed_at(job) == 50.0  # no estimate: its submit time
    job.estimate = Estimate(1000.0, 10, BASES[2])
    job.attained = 1200.0  # 600 s run on 2 GPUs: 400 s remain
    assert plugin.placed_at(job) == 50.0 + 2 * 400.0
    assert plugin.key(job)[2] == 850.0
    job.estimate = Estimate(10 * 86_400.0, 10, BASES[2])
    assert plugin.placed_at(job) == 50.0 + 2 * 3600.0  # capped
    # patience counts from there: a job placed later never reclaims more than one placed earlier
    assert not plugin._patience_over(job, 50.0 + 100.0)
    assert plugin._patience_over(job, 50.0 + 7200.0 + 100.0)
    assert Tiresias(TiresiasArgs(patience=100.0, estimate_weight=0.0))._patience_over(
        job, 150.0
    )  # weight 0: from submit


def test_hold_after_reserves_from_the_estimated_ends_of_jobs_without_a_time_limit() -> None:
    def reservations(profile: Profile) -> list[float]:
        state = learned(gpus=8)
        for i in range(2):
            state.submit(spec(f"s{i}", "short", 0.0, gpus=4))
        run(state, 0.0, profile)
        assert len(state.running) == 2 and all(a.limit_end == INFINITY for a in state.running.values())
        state.submit(spec("big", "", 1.0, gpus=8))
        return [r.start for r in run(state, 1.0, profile).reservations]

    assert reservations(tiresias()) == []  # no time limits: nothing to reserve from
    assert reservations(tiresias(hold_after=0.0)) == [60.0]  # from the estimated ends
