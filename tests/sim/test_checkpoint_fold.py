"""Periodic checkpoints folded into the next instant (`sim/timeline.py`'s `FOLD_CHECKPOINTS`):
random traces with checkpoints, node failures, preemptions and `fresh` cycle wakes, replayed with
the fold on and off, give the same event log, the same reasons in every cycle, the same number of
cycles and the same end; every instant the fold plays leaves the state the instant left with the
fold off (each running attempt's last checkpoint, the per-node sums of `Occupancy.groups`)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corral.core.decisions import CycleResult
from corral.policies.registry import load_policy
from corral.sim import timeline
from corral.sim.engine import SimOptions, Simulation
from corral.sim.eventlog import EventLog
from corral.sim.jobmodel import PreemptionCost
from tests.sim.test_quiet_skip import cluster, trace

POLICIES = ["default", "las", "tiresias"]


@contextmanager
def fold(on: bool) -> Iterator[None]:
    before = timeline.FOLD_CHECKPOINTS
    timeline.FOLD_CHECKPOINTS = on
    try:
        yield
    finally:
        timeline.FOLD_CHECKPOINTS = before


def replay(
    seed: int, policy: str, on: bool, count: int, interval: float, mtbf: float | None
) -> tuple[list[str], list[str], dict[float, str], tuple[int, float], int]:
    """The event log, every cycle's reasons (with its `next_wake` and `checkpoint_wakes`), the state
    after every instant played (by time), the cycles and the end, and how many cycles asked for a
    `fresh` wake."""
    profile = (
        load_policy("tiresias", {"tiresias": {"max_lost": 300.0, "patience": 900.0}})
        if policy == "tiresias"
        else load_policy(policy)
    )
    options = SimOptions(
        min_interval=interval,
        node_mtbf=mtbf,
        node_repair=1800.0,
        seed=seed,
        preemption=PreemptionCost(default_interval=900.0 if seed % 2 else None),
    )
    events: list[str] = []
    cycles: list[str] = []
    fresh = [0]

    def cycle(result: CycleResult) -> None:
        told = sorted((job, r.code.value, r.message, r.at) for job, r in result.reasons.items())
        wakes = sorted(result.checkpoint_wakes.items())
        fresh[0] += bool(wakes)
        cycles.append(repr((result.now, result.next_wake, wakes, told)))

    sim = Simulation(cluster(3), trace(seed, count), profile, EventLog([]), options)
    sim.log.sinks.append(lambda e: events.append(repr(sorted(e.items()))))
    sim.on_cycle = cycle
    states: dict[float, str] = {}
    sim.begin()
    with fold(on):  # (read as each checkpoint is queued)
        while sim.step():
            running = sorted((str(j), a.attempt, a.last_checkpoint) for j, a in sim.state.running.items())
            states[sim.stats.end_time] = repr((running, sim.state.occupancy.groups))
    return events, cycles, states, (sim.stats.cycles, sim.stats.end_time), fresh[0]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1),
    policy=st.sampled_from(POLICIES),
    count=st.integers(30, 100),
    interval=st.sampled_from([0.0, 0.0, 60.0, 400.0]),
    mtbf=st.sampled_from([None, 20_000.0, 60_000.0]),
)
def test_folded_checkpoints_decide_as_instants_of_their_own(
    seed: int, policy: str, count: int, interval: float, mtbf: float | None
) -> None:
    on = replay(seed, policy, True, count, interval, mtbf)
    off = replay(seed, policy, False, count, interval, mtbf)
    assert on[0] == off[0]
    assert on[1] == off[1]
    assert on[3] == off[3]
    assert set(on[2]) <= set(off[2])  # the fold plays fewer instants, each as it was played
    assert all(state == off[2][t] for t, state in on[2].items())


def test_the_traces_fold_checkpoints_and_ask_for_fresh_wakes() -> None:
    """The random traces above fold checkpoints, fail nodes, preempt and ask for `fresh` wakes
    (else the property shows nothing)."""
    folded = fresh = preempted = lost = 0
    for seed in range(6):
        on = replay(seed, "tiresias", True, 80, 60.0, 20_000.0)
        off = replay(seed, "tiresias", False, 80, 60.0, 20_000.0)
        folded += len(off[2]) - len(on[2])
        fresh += on[4]
        preempted += sum("'preempt'" in e for e in on[0])
        lost += sum("'lost'" in e for e in on[0])
    assert folded > 100 and fresh > 5 and preempted > 5 and lost > 5
