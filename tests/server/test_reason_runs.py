"""The reason book reads the core's runs of jobs sharing one reason (`Reasons.runs`, issue 15) and
compares what was written with a reason once per stretch of jobs that share both. What it writes
must be exactly what a look at every job writes, in the same order: checked against the long way
(the book as it was, one job at a time) on random sequences of cycles, made up and real."""

from __future__ import annotations

import random

import pytest

from corral.core import reasons as text
from corral.core.cycle import schedule
from corral.core.decisions import CycleResult, Reason, Reasons, Why
from corral.core.model import JobId
from corral.core.state import ClusterState
from corral.policies.registry import load_policy
from corral.server import reasons as book_module
from corral.server.reasons import _TIMES as TIMES
from corral.server.reasons import ReasonBook, ReasonChange, _Look
from tests.helpers import job, nodes, state_of

T0 = 1_800_000_000.0


class LongBook(ReasonBook):
    """The book as it was before runs: every reason of the cycle unfolded and compared per job."""

    def changes(self, state: ClusterState, result: CycleResult) -> list[ReasonChange]:
        known = self.known
        for job_id in self.fresh:
            known.pop(job_id, None)
        if len(known) > 2 * len(state.jobs) + 1000:
            for job_id in [j for j in known if j not in state.jobs]:
                del known[job_id]
        others = (result.others.code.value, result.others.message) if result.others is not None else None
        pairs: list[tuple[str, Reason]]
        if others != self.others:
            pairs = [(j, r) for j in state.jobs if (r := result.reason_of(JobId(j))) is not None]
        else:
            reasons = result.reasons
            pairs = [(j, reasons[j]) for j in reasons]
            if result.others is not None:
                pairs += [(j, result.others) for j in self.fresh if j in state.jobs and j not in reasons]
        self.others = others
        self.fresh.clear()
        return self._compare(pairs, result.now)

    def _compare(self, pairs: list[tuple[str, Reason]], now: float) -> list[ReasonChange]:
        known = self.known
        stale = now - book_module.REFRESH
        refreshes = book_module.REFRESH_PER_LOOK
        out: list[ReasonChange] = []
        for job_id, reason in pairs:
            message, at = reason.message, reason.at
            code = reason.code.value
            seen = known.get(job_id)
            if seen is not None and seen[1] == message and seen[2] == at and seen[0] == code:
                continue
            fig = TIMES.sub("", message)
            if seen is not None:
                old = seen[4] if seen[4] is not None else TIMES.sub("", seen[1])
                current = seen[2] is None or seen[2] >= now
                if seen[0] == code and current and old == fig:
                    if seen[3] > stale or refreshes <= 0:
                        continue
                    refreshes -= 1
            known[job_id] = (code, message, at, now, fig)
            out.append(ReasonChange(job_id, code, message, at, seen is None or seen[0] != code))
        return out


def protected(until: float, free: int = 0) -> Reason:
    capacity = Reason(Why.CAPACITY, f"needs 4 GPUs; {free} GPUs are free in the cluster")
    return text.with_protection(capacity, until, T0)


POOL = [
    lambda t: protected(t + 60),
    lambda t: protected(t + 60, free=2),
    lambda t: protected(T0 + 300),
    lambda t: protected(T0 + 5),
    lambda t: Reason(Why.CAPACITY, "needs 4 GPUs; 0 GPUs are free in the cluster"),
    lambda t: text.with_reservation(Reason(Why.CAPACITY, "needs 8 GPUs"), t + 600, t),
    lambda t: Reason(Why.HELD, "held by a user or an admin; `corral release` lets it run"),
]


class Made:
    """A made-up cycle's reasons: runs, lazy runs (a reason per job) and jobs of their own."""

    def __init__(self, rng: random.Random, ids: list[str], now: float) -> None:
        self.runs: list[tuple[list[str], int]] = []
        self.lazy: list[tuple[list[str], dict[str, int]]] = []
        self.own: dict[str, int] = {}
        order = ids[:]
        rng.shuffle(order)
        i = 0
        while i < len(order):
            size = rng.choice((1, 3, 8, 20))
            part, i = order[i : i + size], i + size
            kind = rng.random()
            if kind < 0.5:
                self.runs.append((sorted(part), rng.randrange(len(POOL))))
            elif kind < 0.8:
                self.lazy.append((sorted(part), {j: rng.randrange(3) for j in part}))
            elif kind < 0.95:
                self.own.update({j: rng.randrange(len(POOL)) for j in part})
            # else: not reached by this cycle
        self.now = now

    def mutate(self, rng: random.Random, now: float) -> None:
        self.now = now
        for k in range(len(self.runs)):
            if rng.random() < 0.2:
                self.runs[k] = (self.runs[k][0], rng.randrange(len(POOL)))
        for _keys, per in self.lazy:
            for j in per:
                if rng.random() < 0.1:
                    per[j] = rng.randrange(3)
        if self.runs and rng.random() < 0.3:  # a run loses its first job to a job of its own
            keys, pick = self.runs[0]
            if len(keys) > 1:
                self.runs[0] = (keys[1:], pick)
                self.own[keys[0]] = pick

    def result(self, others: Reason | None) -> CycleResult:
        now = self.now
        reasons = Reasons({JobId(j): POOL[p](now) for j, p in self.own.items()})
        for keys, pick in self.runs:
            reasons.add_run([(k, JobId(k)) for k in keys], POOL[pick](now))
        for keys, per in self.lazy:
            made = {j: POOL[p](now) for j, p in per.items()}  # equal reasons, distinct objects
            reasons.add_lazy_run([(k, JobId(k)) for k in keys], lambda j, made=made: made[j])
        return CycleResult(now, reasons=reasons, others=others)


@pytest.mark.parametrize("seed", range(40))
def test_a_look_by_runs_writes_what_a_look_at_every_job_writes(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(book_module, "REFRESH_PER_LOOK", 4)  # the cap, reached often
    rng = random.Random(seed)
    state = state_of(nodes(1, 8))
    ids = [f"j{i:02}" for i in range(60)]
    for j in ids:
        state.submit(job(j, gpus=1))
    by_runs, long = ReasonBook(), LongBook()
    now = T0
    made = Made(rng, ids, now)
    others: Reason | None = None
    for _ in range(60):
        now += rng.choice((0.5, 1.0, 3.0, 8.0, 16.0))
        roll = rng.random()
        if roll < 0.15:
            made = Made(rng, ids, now)
        elif roll < 0.75:
            made.mutate(rng, now)
        else:
            made.now = now  # the same runs and reasons
        if rng.random() < 0.3:
            fresh = set(rng.sample(ids, rng.randrange(1, 6)))
            by_runs.fresh |= fresh
            long.fresh |= fresh
        if rng.random() < 0.05:
            by_runs.look_at_all()
            long.look_at_all()
        if rng.random() < 0.08:
            others = None if others is not None else Reason(Why.HEAD_OF_LINE, "waiting behind job j00")
        assert by_runs.changes(state, made.result(others)) == long.changes(state, made.result(others))
        assert by_runs.known == long.known


def test_the_jobs_of_a_run_are_compared_once_per_run_not_per_job() -> None:
    """The point of runs: the jobs of a run share one reason, and one written tuple when one look
    wrote them, so a look compares sentences once for the run (`_Look._act`), not per job, whether
    the reason is unchanged or only its time moved."""
    state = state_of(nodes(1, 8))
    ids = [f"j{i}" for i in range(50)]
    for j in ids:
        state.submit(job(j, gpus=1))
    book = ReasonBook()

    def result(now: float, reason: Reason) -> CycleResult:
        reasons = Reasons()
        reasons.add_run([(j, JobId(j)) for j in ids], reason)
        return CycleResult(now, reasons=reasons)

    assert len(book.changes(state, result(T0, protected(T0 + 60)))) == 50
    acts: list[int] = []
    real = _Look._act

    def counting(look: _Look, seen: object, entry: object) -> int:
        acts.append(1)
        return real(look, seen, entry)  # type: ignore[arg-type]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_Look, "_act", counting)
        assert book.changes(state, result(T0 + 1, protected(T0 + 60))) == []
        assert book.changes(state, result(T0 + 2, protected(T0 + 90))) == []  # a time moved
        book.fresh.add("j7")  # requeued: its stored reason was cleared, it is written again
        assert [c.job for c in book.changes(state, result(T0 + 3, protected(T0 + 60)))] == ["j7"]
    assert len(acts) == 1 + 1 + 3  # j7 (nothing written) and j8 on: two more


@pytest.mark.parametrize("seed", range(3))
def test_real_cycles_by_runs_write_what_the_long_way_writes(seed: int) -> None:
    """Cycles of the core on a full cluster with a backlog of arrays (runs, lazy runs behind a
    reservation), jobs ending and arriving: both books, fed the same results, write the same."""
    rng = random.Random(seed)
    state = state_of(nodes(8, 8))
    profile = load_policy("default")
    now = T0
    count = 0

    def submit(n: int, gpus: int, limit: float, replicas: int) -> None:
        nonlocal count
        for _ in range(n):
            gang = replicas > 1 and gpus == 8
            replicas_of = replicas if gang else 1
            state.submit(job(f"p{count}", gpus=gpus, replicas=replicas_of, time_limit=limit, submit=now))
            count += 1

    for _ in range(16):
        shape = (rng.choice((1, 2, 4, 8)), 60.0 * rng.randrange(10, 600), rng.choice((1, 1, 2)))
        submit(rng.randrange(20, 80), *shape)
    by_runs, long = ReasonBook(), LongBook()
    runs = 0
    for _ in range(40):
        now += rng.choice((1.0, 5.0, 30.0, 300.0))
        if state.running and rng.random() < 0.4:
            for job_id in rng.sample(sorted(state.running), rng.randrange(1, 3)):
                state.end(job_id, requeue=False, now=now)
        if rng.random() < 0.3:
            before = set(state.jobs)
            shape = (rng.choice((1, 2, 4, 8)), 60.0 * rng.randrange(10, 600), rng.choice((1, 1, 2)))
            submit(rng.randrange(1, 30), *shape)
            new = set(state.jobs) - before
            by_runs.fresh |= new
            long.fresh |= new
        result = schedule(state, profile, now)
        runs += len(result.reasons.runs()[0])
        assert by_runs.changes(state, result) == long.changes(state, result)  # runs first: the
        assert by_runs.known == long.known  # long way unfolds what `runs` resolved
    assert runs > 0  # the core gave runs: the book's way was taken
