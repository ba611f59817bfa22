"""Run-time estimates learned from history: pure (no clock, no I/O), bounded memory.

For every finished job the estimator remembers its run time under keys of decreasing detail:
(queue, user, name, GPUs, GPU model), (queue, user, GPUs), (queue, GPUs), (queue), and the whole
cluster. A job's estimate comes from the most detailed key with enough history: the median of
the run times there that exceed what the job has already run (the conditional distribution
given its attained time), so that a job running past its estimate gets a later one. Each key
keeps its `keep` newest run times (sorted), and at most `max_keys` keys are kept (the oldest
learned are forgotten first).

Estimates are never limits: the scheduler uses them to place reservations and order jobs, and
never stops a job for running past one.
"""

from __future__ import annotations

from bisect import bisect_right, insort
from collections import deque
from dataclasses import dataclass

from corral.core.model import JobSpec

MIN_DRAWN = 5  # a key's history is used when it holds at least this many run times above the attained
BASES = (
    "this user's jobs of this name and size",
    "this user's jobs of this size",
    "this queue and size",
    "this queue",
    "the cluster",
)


@dataclass(frozen=True, slots=True)
class Estimate:
    """`seconds` of run time in all (not remaining), from `drawn_on` past jobs described by `basis`
    (`drawn_on` 0: no history held a longer run; the estimate doubles the attained time)."""

    seconds: float
    drawn_on: int
    basis: str


class _Runs:
    __slots__ = ("newest", "ordered")

    def __init__(self) -> None:
        self.newest: deque[float] = deque()
        self.ordered: list[float] = []


Keys = tuple[tuple[object, ...], ...]
_NONE = ()  # no key at this level: the job has nothing to tell it from the next level


def keys_of(spec: JobSpec) -> Keys:
    """The history keys of a job, most detailed first (one per entry of `BASES`); the state
    builds them once per job (`PendingJob.history_keys`). A job without a name and a GPU model
    has no name key, one without a user no user key (`_NONE`): nothing would set their jobs
    apart from the next level (a trace without users or names, such as Philly's, keeps 3 keys)."""
    gpus = spec.replicas * spec.gpus_per_replica
    model = ",".join(spec.gpu_model)
    user = ("u", spec.queue, spec.user, gpus) if spec.user else _NONE
    return (
        ("n", spec.queue, spec.user, spec.name, gpus, model) if spec.name or model else _NONE,
        user,
        ("s", spec.queue, gpus),
        ("q", spec.queue),
        ("c",),
    )


class Estimator:
    """Per-key sorted samples of finished jobs' run times (seconds)."""

    def __init__(self, keep: int = 256, max_keys: int = 100_000, min_drawn: int = MIN_DRAWN) -> None:
        self.keep = keep
        self.max_keys = max_keys
        self.min_drawn = min_drawn
        self.runs: dict[tuple[object, ...], _Runs] = {}
        self.observed = 0

    def observe(self, spec: JobSpec, seconds: float, keys: Keys | None = None) -> None:
        """A job of this spec (and these `keys_of` it, when known) ran `seconds` in all."""
        self.observed += 1
        for key in keys_of(spec) if keys is None else keys:
            if not key:
                continue
            runs = self.runs.get(key)
            if runs is None:
                if len(self.runs) >= self.max_keys:
                    del self.runs[next(iter(self.runs))]
                runs = self.runs[key] = _Runs()
            runs.newest.append(seconds)
            insort(runs.ordered, seconds)
            if len(runs.newest) > self.keep:
                old = runs.newest.popleft()
                i = bisect_right(runs.ordered, old) - 1
                del runs.ordered[i]

    def estimate(self, spec: JobSpec, attained: float = 0.0, keys: Keys | None = None) -> Estimate | None:
        """The job's run time in all, given it has run `attained` seconds (None: no history at all);
        `keys`: `keys_of(spec)`, when known."""
        if not self.runs:
            return None
        for key, basis in zip(keys_of(spec) if keys is None else keys, BASES, strict=True):
            runs = self.runs.get(key) if key else None
            if runs is None:
                continue
            ordered = runs.ordered
            first = bisect_right(ordered, attained)
            above = len(ordered) - first
            if above >= self.min_drawn or (basis == BASES[-1] and above > 0):
                return Estimate(ordered[first + above // 2], above, basis)
        return Estimate(max(2.0 * attained, 1.0), 0, "no history of longer runs: twice the time run so far")
