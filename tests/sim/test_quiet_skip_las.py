"""`las` cycles after arrivals alone told without running (`core/quiet_las.py`): random small
traces replayed under `las` with the skip on and off give the same event log, the same reasons,
`next_wake` and `others` in every cycle and the same number of cycles, and the same log with no
reader; the traces reach the skip; deliberate breaks of its checks are caught."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corral.core import cycle, quiet_las
from corral.core.jobs import PendingJob
from corral.core.state import ClusterState
from corral.policies.registry import load_policy
from corral.sim.engine import SimOptions, Simulation
from corral.sim.eventlog import EventLog
from tests.helpers import ran_interpreted
from tests.sim.test_quiet_skip import cluster, recorded, trace

# attained-service thresholds (GPU-seconds): the defaults, and low ones that jobs cross often
LEVELS = [(3600.0, 36000.0), (600.0, 6000.0)]


def simulation(seed: int, skip: bool, nodes: int, count: int, levels: int) -> Simulation:
    thresholds = list(LEVELS[levels])
    profile = load_policy(
        "las", {"las": {"thresholds": thresholds}, "attained_service": {"thresholds": thresholds}}
    )
    return Simulation(cluster(nodes), trace(seed, count), profile, EventLog([]), SimOptions(skip_quiet=skip))


def replay(
    seed: int, skip: bool, nodes: int = 2, count: int = 120, levels: int = 0, read: bool = True
) -> tuple[list[str], list[str], int, int]:
    """`recorded` of the random trace `seed` under `las` on `nodes` nodes."""
    return recorded(simulation(seed, skip, nodes, count, levels), read=read)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1),
    nodes=st.integers(2, 3),
    count=st.integers(40, 140),
    levels=st.integers(0, len(LEVELS) - 1),
)
def test_the_las_skip_decides_and_tells_what_the_cycles_do(
    seed: int, nodes: int, count: int, levels: int
) -> None:
    on = replay(seed, True, nodes, count, levels)
    off = replay(seed, False, nodes, count, levels)
    assert off[3] == 0
    assert on[0] == off[0]
    assert on[1] == off[1]
    assert on[2] == off[2]
    assert replay(seed, True, nodes, count, levels, read=False)[0] == off[0]


def test_the_las_traces_skip_cycles() -> None:
    """The random traces above do reach the skip (else the property shows nothing)."""
    skipped = [replay(seed, True, levels=levels)[3] for levels in range(len(LEVELS)) for seed in range(6)]
    assert sum(skipped) > 60
    assert sum(1 for n in skipped if n) >= len(skipped) - 2


def test_the_las_traces_take_both_routes() -> None:
    """A new job is told its key's recorded answer, or what a look at it would say, both often
    (interpreted: the count wraps the module's `told`)."""
    if ran_interpreted(__file__, "test_the_las_traces_take_both_routes"):
        return
    routes = {"key": 0, "look": 0}
    told = quiet_las.told

    def counted(state: ClusterState, quiet: quiet_las.LasQuiet, job: PendingJob, *rest: Any) -> Any:
        said = told(state, quiet, job, *rest)
        found = quiet.verdicts.get(job.verdict_key)
        if said is not None:
            routes["key" if found is not None and found[0] == quiet.version else "look"] += 1
        return said

    quiet_las.told = counted
    try:
        for levels in range(len(LEVELS)):
            for seed in range(6):
                replay(seed, True, levels=levels)
    finally:
        quiet_las.told = told
    assert routes["key"] > 10 and routes["look"] > 10, routes


def _no_levels(state: ClusterState, thresholds: tuple[float, ...], now: float) -> float:
    return state.occupancy.next_settle()


_TOLD = quiet_las.told


def _key_first(state: ClusterState, quiet: Any, job: PendingJob, now: float, fresh: Any) -> Any:
    """`told`, with any recorded answer of the job's key."""
    found = quiet.verdicts.get(job.verdict_key)
    if found is not None and found[0] == quiet.version and not job.is_flagged(now):
        return found[1]
    return _TOLD(state, quiet, job, now, fresh)


def _unproven(self: Any, job: PendingJob) -> Any:
    """`told_later` without its proof that the job's victim search would find nothing."""
    pre = self.preemption
    saved = (pre.fruitless, pre.no_candidates)
    pkey = self.profile.victims.preemptor_key(job, self.now)
    pre.fruitless = {**pre.fruitless, (pkey, job.family, job.avoid_nodes): (self.epoch(), False)}
    try:
        return _TOLD_LATER(self, job)
    finally:
        pre.fruitless, pre.no_candidates = saved


_TOLD_LATER = cycle._Cycle.told_later

BREAKS: dict[str, list[tuple[object, str, Callable[..., Any]]]] = {
    # the horizon forgets that running attempts' levels cross the thresholds
    "levels": [(quiet_las, "changes", _no_levels)],
    # a new job is told its key's recorded answer though no job of its key that the cycle saw
    # comes before it (the first comes after it, in a higher level, or is itself)
    "key first": [(quiet_las, "told", _key_first)],
    # a new job looked at is told a capacity sentence though its victim search may find a set
    "search": [(cycle._Cycle, "told_later", _unproven)],
}


@contextmanager
def broken(name: str) -> Iterator[None]:
    saved = [(owner, attr, getattr(owner, attr)) for owner, attr, _ in BREAKS[name]]
    for owner, attr, fn in BREAKS[name]:
        setattr(owner, attr, fn)
    try:
        yield
    finally:
        for owner, attr, fn in saved:
            setattr(owner, attr, fn)


def test_deliberate_las_breaks_are_caught() -> None:
    """Each break changes the decisions of some replay among the first seeds (interpreted: a
    compiled module calls the checks directly)."""
    if ran_interpreted(__file__, "test_deliberate_las_breaks_are_caught"):
        return
    for name in BREAKS:
        seen = None
        for levels in range(len(LEVELS)):
            for seed in range(40):
                off = replay(seed, False, levels=levels)
                with broken(name):
                    on = replay(seed, True, levels=levels)
                if on[:3] != off[:3]:
                    seen = (seed, levels, on[0] != off[0])
                    break
            if seen is not None:
                break
        assert seen is not None, f"the break {name!r} went unseen"
        assert seen[2], f"the break {name!r} changed only reasons ({seen})"
