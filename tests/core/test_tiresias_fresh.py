"""`tiresias`' fresh candidates read from the candidates that reached the floor, and its own-queue
rankings read from what `narrow` keeps, decide as before.

- `tiresias_fresh.BY_REACHING`: a group's candidates that checkpointed within `max_lost` and whose
  service reached a floor are read from `served.Reaching` when fewer candidates may have reached
  the floor than checkpointed within `max_lost`: the same attempts in the same order.
- `tiresias_fresh.SERVING`: when the first attempt of a group inside its minimum run time becomes
  one a preemptor below the first level may take is read from the attempts whose service then
  reaches the first level (`Occupancy.serving`), not from every attempt inside it: the same time.
- `preemption.BUDGET_FEW`: a search for room in a queue's own quota (`Preemption.for_budget`)
  whose ranked candidates and the free GPUs together hold too few of its replicas finds no set
  without a search (`victim_nodes.too_few`), as the search would; histories of
  `test_repeats.play` with tight queue budgets, under `default` and `tiresias`.
- `preempt.AMONG`: the rankings of `SameQueue` (preemption to make room in a queue's quota, and
  own-queue searches after a refused set) read, of a group it does not narrow, only the attempts
  the inner plugin's `narrow` keeps (`SameQueue.among`): the same ranking.

Random clusters of `test_narrowed_bound.searched` (attempts of 1 to 16 GPUs, some with earlier
service, some checkpointed), asked directly at many floors and `max_lost`; and the histories of
`test_tiresias_memo.history` (levels crossed, checkpoints and ends between cycles, cycles at the
same instant), with each switch and without, with `tiresias_memo`'s memory and without.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corral.core import preempt, preemption
from corral.core.cycle import schedule
from corral.core.model import JobId, JobSpec, QueueName
from corral.core.preempt import ranked_candidates, select_victims
from corral.core.same_queue import SameQueue
from corral.policies import tiresias_fresh, tiresias_memo
from corral.policies.registry import load_policy
from tests.core.test_narrowed_bound import NOW, outcome, searched
from tests.core.test_preemption_memo import both
from tests.core.test_repeats import CLASSES, play
from tests.core.test_tiresias_memo import SHAPES, cluster, history
from tests.helpers import ran_interpreted

FLOORS = (1.0, 60.0, 5000.0, 20_000.0, 36_000.0, 60_000.0, 200_000.0)
LOST = (0.0, 10.0, 500.0, 4000.0, 10_000.0)


def fresh_answers(seed: int) -> tuple[list[Any], int]:
    """Per group, floor, cutoff and `every`: the answer of the checkpoints' suffix, of the
    candidates that reached the floor, and of `fresh` (which chooses); and how many questions
    `fresh` answered from the candidates that reached the floor."""
    state, _, _, _ = searched(seed)
    occupancy = state.occupancy
    occupancy.settle(NOW)
    out: list[Any] = []
    chose = 0
    for group in sorted(occupancy.members):
        for floor in FLOORS:
            for lost in LOST:
                cutoff = NOW - lost
                for every in (True, False):
                    by = tiresias_fresh._by_reaching(occupancy, group, NOW, cutoff, floor, every)
                    chosen = tiresias_fresh.fresh(occupancy, group, NOW, cutoff, floor, every)
                    with pytest.MonkeyPatch.context() as patch:
                        patch.setattr(tiresias_fresh, "BY_REACHING", False)
                        suffix = tiresias_fresh.fresh(occupancy, group, NOW, cutoff, floor, every)
                    entries = occupancy.fresh(group)
                    window = sum(1 for e in entries if e[0] >= cutoff)
                    chose += occupancy.reaching.count(floor, NOW) < window
                    out.append(
                        (
                            every,
                            [a.spec.id for a in suffix],
                            [a.spec.id for a in by],
                            [a.spec.id for a in chosen],
                        )
                    )
    return out, chose


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1))
def test_fresh_candidates_are_the_same_either_way(seed: int) -> None:
    answers, _ = fresh_answers(seed)
    for every, suffix, by, chosen in answers:
        if every:
            assert by == suffix
            assert chosen == suffix
        else:  # at most one, asked only whether there is one
            assert bool(by) == bool(suffix) == bool(chosen)
            assert len(by) <= 1 and len(chosen) <= 1


def test_fresh_reads_the_reaching_candidates_often() -> None:
    """The clusters draw questions that `fresh` answers from the candidates that reached the floor."""
    chose = sum(fresh_answers(seed)[1] for seed in range(20))
    assert chose > 100, chose


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1))
def test_own_queue_rankings_are_the_same_among_what_narrow_keeps(seed: int) -> None:
    state, plugin, job, req = searched(seed)
    same = SameQueue(plugin)
    with pytest.MonkeyPatch.context() as patch:
        shortcut = (
            [a.spec.id for a in ranked_candidates(state, same, job, NOW)],
            outcome(select_victims(state, same, job, req, NOW)),
        )
        patch.setattr(preempt, "AMONG", False)
        long_way = (
            [a.spec.id for a in ranked_candidates(state, same, job, NOW)],
            outcome(select_victims(state, same, job, req, NOW)),
        )
    assert shortcut == long_way


def protection_answers(seed: int) -> list[Any]:
    """`protection_end` of every group at several instants, floors and `max_lost`, on a cluster
    where jobs of every class (`low` and `normal`: 600 s of minimum run time) and of several
    earlier services start at two instants, some checkpoint, some end, and some start again."""
    rng = random.Random(seed)
    state = cluster(rng)
    profile = load_policy("tiresias", {"tiresias": {"thresholds": [1e9]}})  # nothing preempted
    queues = list(state.queues)
    out: list[Any] = []
    seq = 0
    for now in (0.0, 200.0, 500.0):
        for _ in range(rng.randint(0, 12)):
            seq += 1
            replicas, gpus = rng.choice(SHAPES)
            prio, name = rng.choice(CLASSES)
            spec = JobSpec(
                JobId(f"j{seq}"), QueueName(rng.choice(queues)), replicas=replicas, gpus_per_replica=gpus,
                priority=prio, priority_class=name, submit_time=now, seq=seq,
            )  # fmt: skip
            state.submit(spec, attained=rng.choice([0.0, 0.0, 1000.0, 5000.0, 50_000.0]))
        for job_id in list(state.running):
            if rng.random() < 0.3:
                state.record_checkpoint(job_id, now)
            elif rng.random() < 0.1:
                state.end(job_id, requeue=rng.random() < 0.5, now=now)
        schedule(state, profile, now)
        occupancy = state.occupancy
        for at in (now, now + 100.0, now + 599.0, now + 600.0, now + 2000.0):
            occupancy.settle(at)
            for group in [(q, p) for q in queues for p, _ in CLASSES]:
                for floor in (600.0, 1200.0, 5000.0, 20_000.0, 60_000.0):
                    for lost in (0.0, 300.0, 600.0, 1000.0):
                        with pytest.MonkeyPatch.context() as patch:
                            short = tiresias_fresh.protection_end(occupancy, group, at, floor, lost)
                            patch.setattr(tiresias_fresh, "SERVING", False)
                            long_way = tiresias_fresh.protection_end(occupancy, group, at, floor, lost)
                        out.append((short, long_way))
    return out


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1))
def test_protection_ends_are_the_same_either_way(seed: int) -> None:
    for short, long_way in protection_answers(seed):
        assert short == long_way


def test_protection_ends_are_drawn() -> None:
    """The clusters draw groups with an attempt that becomes a victim when its protection ends."""
    found = sum(long_way is not None for seed in range(30) for _, long_way in protection_answers(seed))
    assert found > 50, found


@pytest.mark.parametrize(
    "module,name", [(tiresias_fresh, "BY_REACHING"), (tiresias_fresh, "SERVING"), (preempt, "AMONG")]
)
@pytest.mark.parametrize("remember", [True, False])
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), walk=st.booleans())
def test_histories_decide_alike(module: Any, name: str, remember: bool, seed: int, walk: bool) -> None:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tiresias_memo, "REMEMBER", remember)
        shortcut, long_way = both(history, seed, walk=walk, switch=(module, name))
    assert shortcut == long_way


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1),
    policy=st.sampled_from(["default", "tiresias"]),
    limits=st.sampled_from([0, 3]),
)
def test_budget_searches_decide_alike(seed: int, policy: str, limits: int) -> None:
    shortcut, long_way = both(play, seed, policy, limits, True, switch=(preemption, "BUDGET_FEW"))
    assert shortcut == long_way


def test_budget_searches_take_the_shortcut() -> None:
    """The budget histories above draw searches answered without a search (counted interpreted:
    a compiled module calls `too_few` directly, so under the compiled core this runs interpreted)."""
    if ran_interpreted(__file__, "test_budget_searches_take_the_shortcut"):
        return
    seen = [0, 0]
    real = preemption.too_few

    def counted(*args: Any) -> bool:
        found = real(*args)
        seen[found] += 1
        return found

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(preemption, "too_few", counted)
        for seed in range(40):
            for policy in ("default", "tiresias"):
                play(seed, policy, 0, True)
    assert seen[True] > 0 and seen[False] > 0, seen
