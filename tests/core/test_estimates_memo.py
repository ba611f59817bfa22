"""The estimator's shortcuts (keys resolved once per chain, run times sorted only while read, the
last estimate reused while its samples are unchanged) against the long way: every key looked up,
every key kept sorted, every estimate read afresh (the estimator as it was before issue 16's
ninth pass, kept here). Same estimates, same samples, same keys forgotten."""

from __future__ import annotations

from bisect import bisect_right, insort
from collections import deque

from hypothesis import given, settings
from hypothesis import strategies as st

from corral.core.estimates import BASES, UNREAD_KEPT, Chain, Estimate, Estimator, keys_of
from corral.core.model import JobId, JobSpec


class LongWay:
    """Per-key sorted samples, looked up and read afresh on every call."""

    def __init__(self, keep: int, max_keys: int, min_drawn: int) -> None:
        self.keep, self.max_keys, self.min_drawn = keep, max_keys, min_drawn
        self.runs: dict[tuple[object, ...], tuple[deque[float], list[float]]] = {}

    def observe(self, spec: JobSpec, seconds: float) -> None:
        for key in keys_of(spec):
            if not key:
                continue
            runs = self.runs.get(key)
            if runs is None:
                if len(self.runs) >= self.max_keys:
                    del self.runs[next(iter(self.runs))]
                runs = self.runs[key] = (deque(), [])
            newest, ordered = runs
            newest.append(seconds)
            insort(ordered, seconds)
            if len(newest) > self.keep:
                del ordered[bisect_right(ordered, newest.popleft()) - 1]

    def estimate(self, spec: JobSpec, attained: float) -> Estimate | None:
        if not self.runs:
            return None
        for key, basis in zip(keys_of(spec), BASES, strict=True):
            runs = self.runs.get(key) if key else None
            if runs is None:
                continue
            ordered = runs[1]
            first = bisect_right(ordered, attained)
            above = len(ordered) - first
            if above >= self.min_drawn or (basis == BASES[-1] and above > 0):
                return Estimate(ordered[first + above // 2], above, basis)
        return Estimate(max(2.0 * attained, 1.0), 0, "no history of longer runs: twice the time run so far")


def spec(i: int, queue: str, user: str, name: str, gpus: int, model: bool) -> JobSpec:
    return JobSpec(
        id=JobId(f"j{i}"), queue=queue, user=user, name=name, gpus_per_replica=gpus,
        gpu_model=("A100",) if model else (),
    )  # fmt: skip


specs = st.builds(
    spec,
    st.integers(0, 3),
    st.sampled_from(["a", "b"]),
    st.sampled_from(["", "u", "v"]),
    st.sampled_from(["", "x"]),
    st.sampled_from([1, 2]),
    st.booleans(),
)
SECONDS = [0.0, 1.0, 5.0, 10.0, 60.0, 600.0, 3600.0]
seconds = st.one_of(st.sampled_from(SECONDS), st.floats(0.0, 10_000.0))
# (observe?, job, seconds ran or attained, through the job's chain?)
ops = st.tuples(st.booleans(), st.integers(0, 7), seconds, st.booleans())


@settings(max_examples=300, deadline=None)
@given(
    st.lists(specs, min_size=8, max_size=8),
    st.lists(ops, max_size=240),
    st.integers(1, 6),
    st.integers(1, 8),
    st.integers(1, 4),
)
def test_shortcuts_estimate_as_the_long_way(
    jobs: list[JobSpec], steps: list[tuple[bool, int, float, bool]], keep: int, max_keys: int, min_drawn: int
) -> None:
    fast, slow = Estimator(keep, max_keys, min_drawn), LongWay(keep, max_keys, min_drawn)
    chains: dict[int, Chain] = {}  # one per job, as `PendingJob.history_keys`
    for observe, j, value, held in steps:
        job = jobs[j]
        chain = chains.setdefault(j, fast.chain(job)) if held else None
        if observe:
            fast.observe(job, value, chain)
            slow.observe(job, value)
        else:
            assert fast.estimate(job, value, chain) == slow.estimate(job, value)
    assert list(fast.runs) == list(slow.runs)  # the same keys, forgotten in the same order
    for key, (_, ordered) in slow.runs.items():
        assert fast.runs[key].in_order() == ordered


def test_a_memo_is_read_again_after_any_change_it_was_read_from() -> None:
    """Direct cases: a new run of the key read, a key forgotten, a more detailed key that now has
    enough runs, another attained time."""
    est = Estimator(keep=3, max_keys=100, min_drawn=2)
    a = JobSpec(id=JobId("a"), queue="q", user="u", name="x")
    chain = est.chain(a)
    for s in (10.0, 20.0):
        est.observe(JobSpec(id=JobId("o"), queue="q", user="u", name="other"), s)
    first = est.estimate(a, 0.0, chain)
    assert first is not None and first.basis == BASES[1] and first.seconds == 20.0
    assert est.estimate(a, 0.0, chain) is first  # reused: nothing changed
    est.observe(JobSpec(id=JobId("o"), queue="q", user="u", name="other"), 30.0)
    again = est.estimate(a, 0.0, chain)
    assert again is not None and again.seconds == 20.0 and again.drawn_on == 3 and again is not first
    for s in (100.0, 200.0):  # its own name now has enough
        est.observe(JobSpec(id=JobId("b"), queue="q", user="u", name="x"), s)
    own = est.estimate(a, 0.0, chain)
    assert own is not None and own.basis == BASES[0] and own.seconds == 200.0
    later = est.estimate(a, 150.0, chain)
    assert later is not None and later.drawn_on == 1 and later.basis == BASES[-1]


def test_a_key_read_rarely_is_sorted_when_read() -> None:
    est = Estimator(keep=4, min_drawn=1)
    a = JobSpec(id=JobId("a"), queue="q")
    for i in range(UNREAD_KEPT + 3):
        est.observe(a, float(100 - i))
    runs = est.runs[("q", "q")]
    assert runs.ordered is None  # not kept sorted: nobody read it
    assert runs.in_order() == [82.0, 83.0, 84.0, 85.0]
    est.observe(a, 50.0)  # kept sorted again once read
    assert runs.ordered == [50.0, 82.0, 83.0, 84.0]  # 85, the oldest, gone
