"""Reservations of concrete capacity for blocked jobs, and backfill around them (EASY).

A job blocked by capacity gets the earliest time its gang fits when running attempts end at
their time limits (or preemption deadlines): attempts are released through the plan in order
of expected end until the job places; the placement's (node, GPU count) pairs are reserved
from then on. Reserved GPUs are subtracted from what the index offers, so later jobs avoid
them unless they end (by their time limit) before every reservation they would touch.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Sequence
from heapq import merge

from corral.core.counted import NeedsAll, countable, place_counts, replicas_with
from corral.core.estimates import Estimate
from corral.core.first_release import ReleaseCounts, WholeNodes, first_possible
from corral.core.fit_reads import NEVER, Reads
from corral.core.model import INFINITY, JobId
from corral.core.placement import Request
from corral.core.probes import CountedProbe, Probe, ReleasedProbe, WholeProbe, gallop, placed_counts
from corral.core.state import ClusterState


class Reservation:
    """Concrete capacity held for `job` from `start` on: (node id, GPUs) pairs. A value (equal and
    hashed by its fields, as the frozen dataclass it was); a class written out, so that the
    compiled core builds it natively (a dataclass's generated `__init__` runs interpreted)."""

    __slots__ = ("capacity", "job", "start")

    def __init__(self, job: str, start: float, capacity: tuple[tuple[int, int], ...]) -> None:
        self.job = job
        self.start = start
        self.capacity = capacity  # (node id, GPUs)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Reservation):
            return NotImplemented
        return self.job == other.job and self.start == other.start and self.capacity == other.capacity

    def __hash__(self) -> int:
        return hash((self.job, self.start, self.capacity))

    def __repr__(self) -> str:
        return f"Reservation(job={self.job!r}, start={self.start!r}, capacity={self.capacity!r})"


# (base id, reserved GPUs, answer, what its search read or None): `ClusterState.fit_memo`
Remembered = tuple[int, tuple[tuple[int, int], ...], object, object]


_MEMO_SIZE = 4096  # requests remembered at most (the memory is emptied when full)
_PER_REQUEST = 4  # answers remembered per request, for as many sets of reserved GPUs (the latest)
# a backfill attempt's miss told by counting the cluster's whole replicas first (`misses_lifted`;
# False: `place_counts` always: tests compare)
REPLICA_BOUND = True
REMEMBER = True  # bench/replay_hashes.py --search-again turns the memory off (interpreted) to compare
WHOLE_NODES = True  # tests turn the search by wholly released nodes off to compare it with the walk
READS = True  # False: an answer is remembered only while the state is the same (tests compare)


def earliest_fit(
    state: ClusterState,
    req: Request,
    now: float,
    remember: bool = True,
    ends: Sequence[tuple[float, int, JobId]] | None = None,
) -> Reservation | None:
    """When and where the gang first fits as attempts end; None if never (no time limits).

    `ends`: the (end, seq, job) of the attempts to release, in order (default: those with an
    expected end, `ClusterState.by_end`; `estimated_fit` adds estimated ends, and is not
    remembered here: `estimated_holds` bounds how often it searches).

    Remembered per request and reserved GPUs (the latest few) while the state is the same
    (`ClusterState.base_id`): the search is a function of the state alone (the index keeps no
    trace of tentative work), and of `now` only through `max(end, now)`. The answer of a gang of
    whole nodes that may spread over the cluster holds further, with the same reserved GPUs,
    while no change since reaches what its search read (`fit_reads.Reads`).
    """
    if ends is not None:
        return _earliest_fit(state, req, now, ends)
    base, key = state.base_id, tuple(state.reserved_at.items())
    entries = state.fit_memo.get(req)
    known: Remembered | None = None
    if entries is not None and remember and REMEMBER:
        for entry in entries:
            if entry[1] == key:
                known = entry
                break
    found: Reservation | None
    if known is not None and (
        known[0] == base or (READS and isinstance(known[3], Reads) and known[3].unchanged(state))
    ):
        found = known[2] if isinstance(known[2], Reservation) else None
        if known[0] != base:
            assert entries is not None
            entries[entries.index(known)] = (base, key, found, known[3])
    else:
        reads: list[Reads] = []
        found = _earliest_fit(state, req, -INFINITY, reads=reads)
        if len(state.fit_memo) >= _MEMO_SIZE:
            state.fit_memo.clear()
            entries = None
        if state.base_id == base:  # (the search leaves the state as it found it)
            if entries is None:
                entries = state.fit_memo[req] = []
            elif known is not None:
                entries.remove(known)
            elif len(entries) >= _PER_REQUEST:
                del entries[0]
            entries.append((base, key, found, reads[0] if reads else None))
    if found is None:
        return None
    return found if found.start >= now else Reservation(found.job, now, found.capacity)


def _earliest_fit(
    state: ClusterState,
    req: Request,
    now: float,
    ends: Sequence[tuple[float, int, JobId]] | None = None,
    reads: list[Reads] | None = None,
) -> Reservation | None:
    """`earliest_fit`, searched (`reads`, when given, gets what a search of whole nodes read).

    Attempts are released in order of expected end. A count of free GPUs kept outside the state
    (`first_release.first_possible`) finds the first release after which some domain the gang may use (one
    node, one leaf, ...) has GPUs enough for it by count: nothing fits before. Only the attempts
    that touch that domain are released and the gang placed once: only that domain can hold it
    then. A gang that may spread over the cluster (or when that placement fails: NVLink groups,
    CPUs, memory) has every attempt released in order and the gang placed after the first
    release at which the count suffices (the cluster's, for a gang that may spread over it), then
    1, 2, 4, ... more releases, then a binary search over the last stretch finds the first
    release after which it fits: O(log n) placements, not one per release. (Where placing is not
    monotone in releases, the answer depends on where the galloping starts.)
    """
    whole = ends is None and WHOLE_NODES
    if ends is None:
        ends, n = state.by_end, bisect_left(state.by_end, (INFINITY,))  # attempts without an end last
        ends = ends if n == len(ends) else ends[:n]  # (not copied when all have one: the search keeps it)
    if not ends:
        return None
    last = len(state.topology.span_names) - 1
    if req.gpus_per_replica == 0:
        return _search(state, req, now, ends, 0, _releases(state, [ends[0][2]]))
    counted = countable(req)
    if whole and counted and WholeNodes.applies(state, req):
        try:
            return _whole_nodes(state, req, now, ends, reads)
        except NeedsAll:
            pass  # (domains compared by free GPUs: the walk counts every node)
    first, where, releases, counts = first_possible(state, req, ends, not counted)
    if first is None:
        return None  # even once every attempt with an end has ended, no domain has GPUs enough
    if counted:
        return _counted(state, req, now, ends, first, where, counts)
    if releases is None:
        releases = _releases(state, [j for _, _, j in ends[: first + 1]])
    if req.max_span >= last:  # anywhere: nothing fits before the cluster has GPUs enough by count
        return _search(state, req, now, ends, first, releases)
    if where is not None:
        found = _fits_inside(state, req, ends[: first + 1], where)
        if found is not None:
            return Reservation("", max(ends[first][0], now), tuple(found))
    return _search(state, req, now, ends, first, releases)


def _counted(
    state: ClusterState,
    req: Request,
    now: float,
    ends: Sequence[tuple[float, int, JobId]],
    first: int,
    where: frozenset[int] | None,
    counts: ReleaseCounts | None,
) -> Reservation | None:
    """`_earliest_fit` for a gang that placement decides on counts alone (`counted.countable`):
    the same releases and placements, counted outside the state (`first_release.ReleaseCounts`,
    `counted.place_counts`), which is left untouched."""
    if req.max_span < len(state.topology.span_names) - 1 and where is not None:
        inside, running = ReleaseCounts(state, req.classes), state.running
        for _, _, job_id in ends[: first + 1]:
            if any(node in where for node, _ in running[job_id].placement):
                inside.release(job_id)
        found = place_counts(state, req, inside.avail)
        if found is not None:
            return Reservation("", max(ends[first][0], now), tuple(found))
    if counts is None:
        counts = ReleaseCounts(state, req.classes)
        for _, _, job_id in ends[: first + 1]:
            counts.release(job_id)
    return _gallop(CountedProbe(state, req, ends, counts, first), ends, now, first)


def _whole_nodes(
    state: ClusterState,
    req: Request,
    now: float,
    ends: Sequence[tuple[float, int, JobId]],
    reads: list[Reads] | None = None,
) -> Reservation | None:
    """`_counted` for a gang of whole nodes that may spread over the cluster: the first release
    and the nodes it may take read from the nodes wholly released (`first_release.WholeNodes`);
    `reads` gets what it read when the gang fits at that first release (the usual case: counts
    decide where it fits), or never fits."""
    nodes = WholeNodes(state, req, ends)
    first = nodes.first()
    if first is None:
        if reads is not None:
            reads.append(Reads(state, req, NEVER, nodes.counted))
        return None
    avail = nodes.avail(first)  # (`_gallop`'s first probe, made here)
    found = place_counts(state, req, avail, whole=True)
    if found is None:
        return _gallop(WholeProbe(state, req, nodes), ends, now, first)
    if reads is not None and nodes.reached is not None:
        reads.append(Reads(state, req, nodes.reached, list(avail)))
    return Reservation("", max(ends[first][0], now), tuple(found))


def _releases(state: ClusterState, job_ids: Iterable[JobId]) -> list[tuple[int, int, int, float, bool]]:
    """What releasing these attempts in turn gives back: (node, mask, CPUs, memory, exclusive)."""
    out: list[tuple[int, int, int, float, bool]] = []
    running = state.running
    for job_id in job_ids:
        attempt = running[job_id]
        spec, exclusive = attempt.spec, attempt.exclusive
        cpus, memory = spec.cpus_per_replica, spec.memory_gib_per_replica
        for node, mask in attempt.placement:
            out.append((node, mask, cpus, memory, exclusive))
    return out


def _fits_inside(
    state: ClusterState, req: Request, ends: Sequence[tuple[float, int, JobId]], nodes: frozenset[int]
) -> list[tuple[int, int]] | None:
    """Release (tentatively) the attempts that touch these nodes and place the gang."""
    running = state.running
    touching = [j for _, _, j in ends if any(node in nodes for node, _ in running[j].placement)]
    released = state.give_back_many(_releases(state, touching))
    try:
        return placed_counts(state, req)
    finally:
        state.restore(released)


def _search(
    state: ClusterState,
    req: Request,
    now: float,
    ends: Sequence[tuple[float, int, JobId]],
    first: int,
    releases: Sequence[tuple[int, int, int, float, bool]],
) -> Reservation | None:
    """Release the attempts up to `first` (before which nothing fits by count: `releases`, what
    they give back) in one step, then one at a time: galloping, then binary search."""
    base = state.plan.checkpoint()
    released = state.give_back_many(releases)
    try:
        return _gallop(ReleasedProbe(state, req, ends, first), ends, now, first)
    finally:
        state.plan.rollback(base)
        state.restore(released)


def _gallop(
    probe: Probe, ends: Sequence[tuple[float, int, JobId]], now: float, first: int
) -> Reservation | None:
    """The reservation at the first release at or after `first` after which the gang fits
    (`probes.gallop`)."""
    found = gallop(probe, len(ends), first)
    return None if found is None else Reservation("", max(ends[found[0]][0], now), tuple(found[1]))


def hold(state: ClusterState, reservation: Reservation) -> None:
    """Subtract a reservation's GPUs from what the index offers (through the plan)."""
    state.add_reserved(reservation.capacity, 1)


def lift(state: ClusterState, reservations: list[Reservation], ends_by: float) -> None:
    """Give back (through the plan) the reservations that start at or after `ends_by`."""
    for r in reservations:
        if r.start >= ends_by:
            state.add_reserved(r.capacity, -1)


def misses_lifted(
    state: ClusterState, req: Request, lifted: list[Reservation], avoid: frozenset[int]
) -> bool:
    """Whether the gang surely misses even with these reservations lifted, told on counts
    (`counted.place_counts`) without lifting them; False when it may place, or when counts alone
    cannot tell (then `lift` and `place` decide). Remembered while no node changes
    (`ClusterState.node_version`): the jobs of a family tried for backfill in one cycle lift the
    same reservations."""
    if avoid or not countable(req):
        return False
    version, memo = state.lift_memo
    if version != state.node_version:  # (every change of what placing reads bumps it)
        memo = {}
        state.lift_memo = (state.node_version, memo)
    key = (req, tuple((r.job, r.start) for r in lifted))
    known = memo.get(key)
    if known is not None:
        return known
    gpus: dict[int, int] = {}
    for r in lifted:
        for node, count in r.capacity:
            gpus[node] = gpus.get(node, 0) + count
    avail = {node: state.available_lifting(node, count) for node, count in gpus.items()}
    if REPLICA_BOUND and replicas_with(state, req, avail) < req.replicas:
        missed = memo[key] = True  # (what `place_counts` finds first: too few replicas anywhere)
        return missed
    missed = memo[key] = place_counts(state, req, avail) is None
    return missed


def clear(state: ClusterState, reservations: list[Reservation]) -> None:
    """Drop every reservation at the end of a cycle (they are recomputed each cycle); trim the
    log of changed nodes (`fit_reads`)."""
    for r in reservations:
        state.drop_reserved(r.capacity)
    state.trim_log()


def estimated_fit(
    state: ClusterState, req: Request, now: float
) -> tuple[Reservation | None, Estimate | None]:
    """`earliest_fit` where attempts without a time limit end when history says they will
    (`estimates`); with the estimate of the last attempt released when the start rests on one."""
    known = state.by_end[: bisect_left(state.by_end, (INFINITY,))]
    ends = list(merge(known, state.by_estimate)) if state.by_estimate else known
    found = earliest_fit(state, req, now, ends=ends if state.by_estimate else None)
    if found is None or not state.by_estimate:
        return found, None
    estimate = None
    for end, seq, job_id in ends:  # the latest estimated end at or before the start decides it
        if end > found.start:
            break
        if seq < 0:
            estimate = state.running[job_id].estimate
    return found, estimate
