"""Cycles after arrivals alone told without running (`core/quiet.py`, `SimOptions.skip_quiet`):
random small traces replayed with the skip on and off give the same event log and the same
reasons in every cycle (job, code, sentence, the time it names), the same `next_wake` and the
same number of cycles; deliberate breaks of the skip's checks are caught."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corral.config.cluster_file import ClusterConfig, parse_cluster_config
from corral.core import quiet
from corral.core.decisions import CycleResult, Reason
from corral.core.jobs import PendingJob
from corral.core.state import ClusterState
from corral.policies.registry import load_policy
from corral.sim.engine import SimOptions, Simulation
from corral.sim.eventlog import EventLog
from corral.sim.trace import TraceJob
from tests.helpers import ran_interpreted


def cluster(nodes: int) -> ClusterConfig:
    """`nodes` 8-GPU nodes on leaves of two; queues a and b guaranteed 8 GPUs each in one cohort,
    c guaranteed none; the default classes (low and normal protect an attempt for 600 s)."""
    return parse_cluster_config(
        {
            "topology": ["leaf"],
            "nodes": [{"name": f"n{i}", "gpus": 8, "labels": {"leaf": f"l{i // 2}"}} for i in range(nodes)],
            "queues": [
                {"name": "a", "quota": 8, "cohort": "lab"},
                {"name": "b", "quota": 8, "cohort": "lab"},
                {"name": "c", "quota": 0, "cohort": "lab"},
            ],
        },
        source="t",
    )


def trace(seed: int, count: int) -> list[TraceJob]:
    """An overloaded mix: one-GPU jobs and gangs, few time limits (so keys repeat) and some
    without, two classes mostly `normal`, arrivals often at the same instant."""
    rng = random.Random(seed)
    t, jobs = 0.0, []
    for i in range(count):
        t += rng.choice([0.0, 0.0, 5.0, 30.0, 60.0, 120.0, 300.0])
        gpus = rng.choice([1, 1, 1, 1, 1, 1, 2, 8, 16])
        replicas, per = (gpus // 8, 8) if gpus > 8 else (1, gpus)
        duration = rng.choice([300.0, 900.0, 2400.0, 5000.0, 9000.0, 20_000.0])
        limit = rng.choice([None, 1200.0, 3600.0, 3600.0, 3600.0, 10_000.0, 10_000.0])
        jobs.append(
            TraceJob(job_id=f"j{i:03d}", submit_time=t, duration=duration, gpus=gpus, replicas=replicas,
                     gpus_per_replica=per, queue=rng.choice("aaaabbbc"), time_limit=limit,
                     priority=rng.choice(["normal"] * 6 + ["low", "high"]),
                     preemptible=rng.random() < 0.95,
                     checkpoint_interval=rng.choice([None, 600.0, 1800.0]))
        )  # fmt: skip
    return jobs


def recorded(
    sim: Simulation, read: bool = True, horizon: float | None = None
) -> tuple[list[str], list[str], int, int]:
    """Play `sim` to its end (or `horizon`): the event log, every cycle's reasons (as
    `bench/replay_hashes.py --reasons` reads them; none when not `read`: then no one reads them),
    the number of cycles and how many of them were told without running."""
    events: list[str] = []
    cycles: list[str] = []

    def cycle(result: CycleResult) -> None:
        told = sorted((job, r.code.value, r.message, r.at) for job, r in result.reasons.items())
        others = None if result.others is None else result.others.message
        cycles.append(repr((result.now, result.next_wake, others, told)))

    sim.log.sinks.append(lambda e: events.append(repr(sorted(e.items()))))
    if read:
        sim.on_cycle = cycle
    sim.begin()
    while sim.step() and (horizon is None or sim.stats.end_time < horizon):
        pass
    return events, cycles, sim.stats.cycles, sim.stats.skipped


def simulation(seed: int, skip: bool, nodes: int, count: int) -> Simulation:
    return Simulation(
        cluster(nodes), trace(seed, count), load_policy("default"), EventLog([]), SimOptions(skip_quiet=skip)
    )


def replay(seed: int, skip: bool, nodes: int = 2, count: int = 120) -> tuple[list[str], list[str], int, int]:
    """`recorded` of the random trace `seed` on `nodes` nodes."""
    return recorded(simulation(seed, skip, nodes, count))


def log_only(seed: int, skip: bool, nodes: int = 2, count: int = 120) -> list[str]:
    """The event log of a replay that nobody reads the reasons of (no `on_cycle`)."""
    return recorded(simulation(seed, skip, nodes, count), read=False)[0]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), nodes=st.integers(2, 3), count=st.integers(40, 140))
def test_the_skip_decides_and_tells_what_the_cycles_do(seed: int, nodes: int, count: int) -> None:
    on = replay(seed, True, nodes, count)
    off = replay(seed, False, nodes, count)
    assert off[3] == 0
    assert on[0] == off[0]
    assert on[1] == off[1]
    assert on[2] == off[2]
    assert log_only(seed, True, nodes, count) == off[0]


def test_the_traces_skip_cycles() -> None:
    """The random traces above do reach the skip (else the property shows nothing)."""
    skipped = [replay(seed, True)[3] for seed in range(8)]
    assert sum(skipped) > 40
    assert all(skipped)


def test_only_a_simulation_that_skips_has_its_cycles_build_the_summary() -> None:
    """The summary costs a cycle something: the live scheduler (a `ClusterState` as built, which
    no simulator flags) and a replay with the skip off never build it; one with the skip on does."""
    assert ClusterState().quiet_kept is False
    for skip in (False, True):
        left: list[bool] = []
        sim = Simulation(
            cluster(2),
            trace(3, 120),
            load_policy("default"),
            EventLog([]),
            SimOptions(skip_quiet=skip),
        )
        sim.on_cycle = lambda result, left=left: left.append(result.quiet is not None)
        sim.run()
        assert sim.state.quiet_kept is skip
        assert any(left) is skip


def _same_family(
    state: ClusterState, q: quiet.Quiet, job: PendingJob, *, class_too: bool
) -> tuple[Reason, float] | None:
    """A verdict of the job's (shape, queue, class or not, time limit or not), ignoring the rest."""
    spec = job.spec
    for key, n in list(state._interned.items()):
        if (
            n not in q.verdicts
            or q.verdicts[n][0] != q.version
            or len(key) != 2
            or not isinstance(key[0], tuple)
            or len(key[0]) != 4
        ):
            continue
        (shape, queue, priority, limit), preemptible = key
        if (shape, queue, preemptible) != (job.shape, spec.queue, spec.preemptible):
            continue
        if class_too and priority != spec.priority:
            continue
        if not class_too and limit != spec.time_limit:
            continue
        return q.verdicts[n][1], q.now
    return None


def _ignore_class(
    state: ClusterState, q: quiet.Quiet, job: PendingJob, *_: object
) -> tuple[Reason, float] | None:
    return _same_family(state, q, job, class_too=False)


def _ignore_limit(
    state: ClusterState, q: quiet.Quiet, job: PendingJob, *_: object
) -> tuple[Reason, float] | None:
    return _same_family(state, q, job, class_too=True)


BREAKS: dict[str, list[tuple[str, Callable[..., Any]]]] = {
    # a new job is told the verdict of its shape and queue in another class, and may go first
    "class": [("told", _ignore_class), ("last_in_families", lambda state, new: True)],
    # a new job is told the verdict of its shape, queue and class with another time limit
    "time limit": [("told", _ignore_limit)],
    # a new job is told its family's verdict though a backfill window may hold it
    "backfill window": [("window_may_hold", lambda end, limit, now: False)],
}


@contextmanager
def broken(name: str) -> Iterator[None]:
    saved = [(attr, getattr(quiet, attr)) for attr, _ in BREAKS[name]]
    for attr, fn in BREAKS[name]:
        setattr(quiet, attr, fn)
    try:
        yield
    finally:
        for attr, fn in saved:
            setattr(quiet, attr, fn)


def test_deliberate_breaks_are_caught() -> None:
    """Each break changes some replay among the first seeds (interpreted: a compiled module calls
    the checks directly, so under the compiled core this test runs itself interpreted)."""
    if ran_interpreted(__file__, "test_deliberate_breaks_are_caught"):
        return
    for name in BREAKS:
        seen = None
        for seed in range(60):
            off = replay(seed, False)
            with broken(name):
                on = replay(seed, True)
            if on[:3] != off[:3]:
                seen = on[0] != off[0]
                break
        assert seen is not None, f"the break {name!r} went unseen"
        if name != "time limit":  # it starts a job that the cycle would not start (or v.v.)
            assert seen, f"the break {name!r} changed only reasons"
