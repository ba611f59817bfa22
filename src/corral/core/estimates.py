"""Run-time estimates learned from history: pure (no clock, no I/O), bounded memory.

For every finished job the estimator remembers its run time under keys of decreasing detail:
(queue, user, name, GPUs, GPU model), (queue, user, GPUs), (queue, GPUs), (queue), and the whole
cluster. A job's estimate comes from the most detailed key with enough history: the median of
the run times there that exceed what the job has already run (the conditional distribution
given its attained time), so that a job running past its estimate gets a later one. Each key
keeps its `keep` newest run times (sorted), and at most `max_keys` keys are kept (the oldest
learned are forgotten first).

A key's run times are kept sorted only while it is read (`UNREAD_KEPT`). A job's keys are
resolved once into a `Chain` (shared by the jobs with the same fields):
its keys' samples, held while they are remembered, and its last estimate, reused while the
samples it was read from are unchanged (`_Runs.changed`). The keys nest (jobs that share a
key share every less detailed one), so any change to a more detailed key of the chain, or to a
key missing then, also changes the key the estimate was read from (the cluster's, when no key
had a longer run): checking that one key is enough.

Estimates are never limits: the scheduler uses them to place reservations and order jobs, and
never stops a job for running past one.
"""

from __future__ import annotations

from bisect import bisect_right, insort
from dataclasses import dataclass

from corral.core.model import JobSpec

MIN_DRAWN = 5  # a key's history is used when it holds at least this many run times above the attained
# a key's run times are kept sorted while it is read at least once in this many changes (else
# sorted when next read: a sort costs about as much as this many insertions)
UNREAD_KEPT = 16
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
    """One key's run times: `newest` a ring of the `keep` newest (`head`: the oldest once full),
    and the same sorted (`ordered`; None: not kept, sorted again when read: a key read less than
    once in `UNREAD_KEPT` changes is not kept sorted); `changed`: the estimator's `observed` at
    its last change; `live` False once forgotten (`max_keys`)."""

    __slots__ = ("changed", "head", "live", "newest", "ordered", "unread")

    def __init__(self) -> None:
        self.newest: list[float] = []
        self.head = 0
        self.ordered: list[float] | None = []
        self.unread = 0  # changes since it was last read
        self.changed = 0
        self.live = True

    def in_order(self) -> list[float]:
        """The run times, sorted (sorted again if not kept; kept from now on)."""
        ordered = self.ordered
        if ordered is None:
            ordered = self.ordered = sorted(self.newest)
        self.unread = 0
        return ordered


Keys = tuple[tuple[object, ...], ...]
_NONE = ()  # no key at this level: the job has nothing to tell it from the next level


def keys_of(spec: JobSpec) -> Keys:
    """The history keys of a job, most detailed first (one per entry of `BASES`); a `Chain`
    holds them once per job (`PendingJob.history_keys`). A job without a name and a GPU model
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


class Chain:
    """A job's keys that are not `_NONE` (the cluster's last), their `BASES`, their samples
    (None, or no longer `live`: looked up again) and the last estimate: `memo` for `memo_attained`
    seconds run, read from `memo_from` when its `changed` was `memo_at`."""

    __slots__ = ("bases", "keys", "memo", "memo_at", "memo_attained", "memo_from", "runs")

    def __init__(self, keys: Keys) -> None:
        self.keys = [k for k in keys if k]
        self.bases = [b for k, b in zip(keys, BASES, strict=True) if k]
        self.runs: list[_Runs | None] = [None] * len(self.keys)
        self.memo: Estimate | None = None
        self.memo_attained = 0.0
        self.memo_from: _Runs | None = None
        self.memo_at = 0


class Estimator:
    """Per-key sorted samples of finished jobs' run times (seconds)."""

    def __init__(self, keep: int = 256, max_keys: int = 100_000, min_drawn: int = MIN_DRAWN) -> None:
        if keep < 1 or max_keys < 1:
            raise ValueError("keep and max_keys must be >= 1")
        self.keep = keep
        self.max_keys = max_keys
        self.min_drawn = min_drawn
        self.runs: dict[tuple[object, ...], _Runs] = {}
        self.chains: dict[tuple[object, ...], Chain] = {}  # by the fields `keys_of` reads
        self.observed = 0

    def chain(self, spec: JobSpec) -> Chain:
        """The job's `Chain`, shared with the jobs of the same fields (the state asks once per
        job: `PendingJob.history_keys`); at most `max_keys` are kept (then all forgotten)."""
        fields = (spec.queue, spec.user, spec.name, spec.replicas * spec.gpus_per_replica, spec.gpu_model)
        found = self.chains.get(fields)
        if found is None:
            if len(self.chains) >= self.max_keys:
                self.chains.clear()
            found = self.chains[fields] = Chain(keys_of(spec))
        return found

    def observe(self, spec: JobSpec, seconds: float, chain: Chain | None = None) -> None:
        """A job of this spec (and this `chain` of it, when known) ran `seconds` in all."""
        self.observed += 1
        stamp = self.observed
        if chain is None:
            chain = self.chain(spec)
        held = chain.runs
        keep = self.keep
        for i in range(len(held)):
            runs = held[i]
            if runs is None or not runs.live:
                key = chain.keys[i]
                runs = self.runs.get(key)
                if runs is None:
                    if len(self.runs) >= self.max_keys:
                        self.runs.pop(next(iter(self.runs))).live = False
                    runs = self.runs[key] = _Runs()
                held[i] = runs
            newest, ordered = runs.newest, runs.ordered
            if ordered is not None:
                runs.unread += 1
                if runs.unread > UNREAD_KEPT:
                    ordered = runs.ordered = None
            if len(newest) < keep:
                newest.append(seconds)
            else:
                head = runs.head
                if ordered is not None:
                    del ordered[bisect_right(ordered, newest[head]) - 1]
                newest[head] = seconds
                runs.head = head + 1 if head + 1 < keep else 0
            if ordered is not None:
                insort(ordered, seconds)
            runs.changed = stamp

    def estimate(self, spec: JobSpec, attained: float = 0.0, chain: Chain | None = None) -> Estimate | None:
        """The job's run time in all, given it has run `attained` seconds (None: no history at all);
        `chain`: its `chain`, when known. It writes the chain's memo: not concurrently with
        another call on this estimator (the server estimates holding `History.lock`)."""
        if not self.runs:
            return None
        if chain is None:
            chain = self.chain(spec)
        memo, source = chain.memo, chain.memo_from
        if (
            memo is not None
            and source is not None
            and source.changed == chain.memo_at  # unchanged since (see the module's doc)
            and source.live
            and chain.memo_attained == attained
        ):
            return memo
        held = chain.runs
        last = len(held) - 1
        runs: _Runs | None = None
        for i in range(last + 1):
            runs = held[i]
            if runs is None or not runs.live:
                runs = held[i] = self.runs.get(chain.keys[i])
                if runs is None:
                    continue
            ordered = runs.in_order()
            if not ordered:
                continue
            # all of them when the first is above (a new job: one run time read, not a search)
            first = 0 if ordered[0] > attained else bisect_right(ordered, attained)
            above = len(ordered) - first
            if above >= self.min_drawn or (i == last and above > 0):
                found = Estimate(ordered[first + above // 2], above, chain.bases[i])
                return _remember(chain, found, attained, runs)
        found = Estimate(max(2.0 * attained, 1.0), 0, "no history of longer runs: twice the time run so far")
        return _remember(chain, found, attained, runs)  # `runs`: the cluster's, or None


def _remember(chain: Chain, found: Estimate, attained: float, source: _Runs | None) -> Estimate:
    """Keep `found` as the chain's estimate for `attained`, read from `source` (its last change)."""
    chain.memo, chain.memo_attained, chain.memo_from = found, attained, source
    chain.memo_at = source.changed if source is not None else 0
    return found
