"""The quiet skip (`core/quiet.py`) attacked where `test_quiet_skip.py` does not draw: random
clusters (GPU models, node sizes, queues with limits, lending limits, weights, default time
limits, one or two cohorts), every priority class, jobs pinned to a GPU model, jobs that never
fit, non-preemptible jobs, many jobs at one instant, fair share with and without usage decay,
few reservations or none, backfill off, node failures, a minimum interval between cycles; and
the other policies, which must be untouched by the switch. Skip on and off must give the same
event log, the same reasons in every cycle and the same number of cycles."""

from __future__ import annotations

import dataclasses
import random
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corral.config.cluster_file import ClusterConfig, parse_cluster_config
from corral.core.plugins import Profile
from corral.policies.registry import load_policy
from corral.sim.engine import SimOptions, Simulation
from corral.sim.eventlog import EventLog
from corral.sim.trace import TraceJob
from tests.sim.test_quiet_skip import recorded

# a guard: with node failures, a replay whose waiting jobs no cycle can admit (a queue's
# `lending_limit` may keep a borrower out for ever) once went on for ever; it now rejects them
# (`Simulation._only_failures_due`), and both sides stop here at the latest
HORIZON = 30 * 86400.0
DURATIONS = [600.0, 2400.0, 9000.0, 20_000.0, 50_000.0]
CLASSES = ["low", "normal", "normal", "normal", "high", "urgent"]


def random_cluster(rng: random.Random) -> ClusterConfig:
    nodes = []
    for i in range(rng.randint(2, 4)):
        node: dict[str, Any] = {
            "name": f"n{i}",
            "gpus": rng.choice([4, 8, 8]),
            "labels": {"leaf": f"l{i // 2}"},
        }
        if rng.random() < 0.5:
            node["gpu_model"] = rng.choice(["a100", "h100"])
        nodes.append(node)
    total = sum(n["gpus"] for n in nodes)
    queues = []
    names = "abcd"[: rng.randint(2, 4)]
    cohorts = ["x", "x"] if rng.random() < 0.6 else ["x", "y"]
    left = {c: total for c in cohorts}
    for i, name in enumerate(names):
        cohort = cohorts[i % 2]
        quota = min(left[cohort], rng.choice([0, 0, 4, 8, 8, 12]))
        left[cohort] -= quota
        q: dict[str, Any] = {
            "name": name,
            "quota": quota,
            "cohort": cohort,
            "weight": rng.choice([1, 1, 2, 3]),
        }
        if rng.random() < 0.4:
            q["limit"] = max(quota, rng.choice([4, 8, 12, 16]))
        if rng.random() < 0.3:
            q["lending_limit"] = rng.choice([0, 2, 4])
        if rng.random() < 0.3:
            q["default_time_limit"] = rng.choice(["1h", "3h"])
        queues.append(q)
    return parse_cluster_config({"topology": ["leaf"], "nodes": nodes, "queues": queues}, source="t")


def random_trace(rng: random.Random, config: ClusterConfig, count: int) -> list[TraceJob]:
    queues = [q.name for q in config.queues]
    largest = max(n.gpus for n in config.nodes)
    t, jobs = 0.0, []
    burst = rng.random() < 0.3  # many jobs at one instant
    for i in range(count):
        t += rng.choice([0.0] * (8 if burst else 2) + [1.0, 5.0, 30.0, 60.0, 120.0, 300.0])
        kind = rng.random()
        if kind < 0.6:
            replicas, per = 1, rng.choice([1, 1, 1, 2, 4])
        elif kind < 0.8:
            replicas, per = rng.choice([2, 3]), rng.choice([largest, 4, 2])
        elif kind < 0.97:
            replicas, per = 1, largest
        else:
            replicas, per = rng.choice([1, 8]), rng.choice([16, largest])  # may never fit
        model: tuple[str, ...] = ()
        if rng.random() < 0.2:
            model = (rng.choice(["a100", "a100", "h100", "h100", "v100"]),)
        jobs.append(
            TraceJob(job_id=f"j{i:03d}", submit_time=t, duration=rng.choice(DURATIONS),
                     gpus=replicas * per, replicas=replicas, gpus_per_replica=per, queue=rng.choice(queues),
                     time_limit=rng.choice([None, None, 1800.0, 3600.0, 3600.0, 10_000.0]),
                     priority=rng.choice(CLASSES), gpu_model=model, preemptible=rng.random() < 0.85,
                     checkpoint_interval=rng.choice([None, 300.0, 1800.0]))
        )  # fmt: skip
    return jobs


def random_profile(rng: random.Random, name: str) -> Profile:
    args: dict[str, dict[str, Any]] = {}
    if name in ("default", "estimated", "tiresias"):
        args["fair_share"] = {"half_life": rng.choice([None, 300.0, 3600.0, 86400.0])}
        if name != "tiresias":
            reclaim: dict[str, Any] = {"surplus": rng.random() < 0.3}
            reclaim["spare_after"] = rng.choice([0.0, 0.0, 120.0, 300.0, 1200.0])
            args["priority_reclaim"] = reclaim
    profile = load_policy(name, args)
    changes: dict[str, Any] = {}
    if rng.random() < 0.3:
        changes["max_reservations"] = rng.choice([0, 1, 2])
    if rng.random() < 0.3:
        changes["backfill"] = False
    return dataclasses.replace(profile, **changes) if changes else profile


def replay(seed: int, policy: str, skip: bool, count: int, read: bool = True) -> tuple[Any, ...]:
    rng = random.Random(seed)
    config = random_cluster(rng)
    jobs = random_trace(rng, config, count)
    profile = random_profile(rng, policy)
    options = SimOptions(
        skip_quiet=skip,
        node_mtbf=rng.choice([None, None, None, 20_000.0]),
        min_interval=rng.choice([0.0, 0.0, 0.0, 10.0]),
        seed=seed,
    )
    return recorded(Simulation(config, jobs, profile, EventLog([]), options), read, HORIZON)


def same(seed: int, policy: str, count: int) -> int:
    on = replay(seed, policy, True, count)
    off = replay(seed, policy, False, count)
    assert off[3] == 0
    assert on[0] == off[0]
    for i, (a, b) in enumerate(zip(on[1], off[1], strict=False)):
        assert a == b, f"cycle {i}"
    assert on[1] == off[1]
    assert on[2] == off[2]
    assert replay(seed, policy, True, count, read=False)[0] == off[0]
    return on[3]


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), count=st.integers(30, 120))
def test_default_on_random_clusters(seed: int, count: int) -> None:
    same(seed, "default", count)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), count=st.integers(30, 120))
def test_las_on_random_clusters(seed: int, count: int) -> None:
    """`las` tells cycles too (`core/quiet_las.py`): the same on these clusters."""
    same(seed, "las", count)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1),
    policy=st.sampled_from(["fifo", "sjf", "tiresias", "estimated"]),
)
def test_other_policies_are_untouched(seed: int, policy: str) -> None:
    assert same(seed, policy, 60) == 0


def test_random_clusters_skip_cycles() -> None:
    """The random clusters reach the skip (else the properties above show nothing): each
    comparison also runs here on its own seeds."""
    skipped = [same(seed, "default", 120) for seed in range(20)]
    assert sum(skipped) > 30, skipped
    assert sum(1 for n in skipped if n) >= 15, skipped


def spare_replay(skip: bool, spare: float, second: float) -> tuple[list[str], list[str], int]:
    """Queue b borrows the whole 8-GPU node at 0 (min_runtime 600 s); a, owed its quota, asks at
    100 (victims protected until 600) and again at `second`: with `spare_after` the borrowers are
    spared from 300 on, a change with time alone that no wake-up marks."""
    config = parse_cluster_config(
        {
            "nodes": [{"name": "n0", "gpus": 8}],
            "queues": [{"name": "a", "quota": 8, "cohort": "x"}, {"name": "b", "quota": 0, "cohort": "x"}],
        },
        source="t",
    )
    jobs = [
        TraceJob(job_id=f"b{i}", submit_time=0.0, duration=5000.0, gpus=1, replicas=1, gpus_per_replica=1,
                 queue="b", time_limit=6000.0)
        for i in range(8)
    ] + [
        TraceJob(job_id=f"a{i}", submit_time=t, duration=500.0, gpus=1, replicas=1, gpus_per_replica=1,
                 queue="a", time_limit=6000.0)
        for i, t in enumerate([100.0, second])
    ]  # fmt: skip
    events: list[str] = []
    cycles: list[str] = []
    profile = load_policy("default", {"priority_reclaim": {"spare_after": spare}})
    sim = Simulation(config, jobs, profile, EventLog([lambda e: events.append(repr(sorted(e.items())))]),
                     SimOptions(skip_quiet=skip))  # fmt: skip
    sim.on_cycle = lambda r: cycles.append(repr((r.now, r.next_wake, sorted(r.reasons.items()))))
    sim.run()
    return events, cycles, sim.stats.skipped


def test_a_borrower_spared_between_two_arrivals() -> None:
    for spare, second in ((300.0, 400.0), (300.0, 200.0), (0.0, 400.0)):
        on, off = spare_replay(True, spare, second), spare_replay(False, spare, second)
        assert on[2] == 1 and off[2] == 0  # the second arrival's cycle is told
        assert on[:2] == off[:2]


def dated_replay(skip: bool, start: float) -> tuple[list[str], list[str], int]:
    """A (8 GPUs, 200,000 s limit) runs from `start`; B and B2 (8 GPUs each) wait from start + 10,
    B with a reservation at A's end; C arrives at start + 149,900. From 1e9 - 150,000 on, A's end
    lies after `reasons.UNIX_EPOCH_FLOOR` while the clock is below it: B's sentence names it as a
    time of day, with its date at start + 10 (a day or more away) and without it at C's instant."""
    config = parse_cluster_config(
        {"nodes": [{"name": "n0", "gpus": 8}], "queues": [{"name": "a"}]}, source="t"
    )
    jobs = [
        TraceJob(job_id=name, submit_time=start + t, duration=1e6, gpus=8, replicas=1, gpus_per_replica=8,
                 queue="a", time_limit=limit)
        for name, t, limit in [("A", 0.0, 200_000.0), ("B", 10.0, 3600.0), ("B2", 10.0, 3600.0),
                               ("C", 149_900.0, 3600.0)]
    ]  # fmt: skip
    events: list[str] = []
    cycles: list[str] = []
    log = EventLog([lambda e: events.append(repr(sorted(e.items())))])
    sim = Simulation(config, jobs, load_policy("default"), log, SimOptions(skip_quiet=skip))
    sim.on_cycle = lambda r: cycles.append(repr((r.now, r.next_wake, sorted(r.reasons.items()))))
    sim.run()
    return events, cycles, sim.stats.skipped


def test_a_time_of_day_named_before_the_clock_reaches_it() -> None:
    """The skip told B's old sentence (with the date) where the cycle writes it without."""
    on, off = dated_replay(True, 1e9 - 150_000.0), dated_replay(False, 1e9 - 150_000.0)
    assert on[:2] == off[:2]
    assert any("reserved to start at 15:40:00 UTC" in c for c in off[1])
    on, off = dated_replay(True, 0.0), dated_replay(False, 0.0)  # far from it: C's cycle is told
    assert on[2] == 1 and on[:2] == off[:2]
