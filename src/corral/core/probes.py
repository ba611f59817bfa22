"""The tentative placements of a reservation search (`reserve`), release by release: a probe
answers where the gang places after the releases up to one (`Probe.fits_after`), and `gallop`
finds the first release after which it fits. Probes are classes, not closures, so that the
compiled core calls them as compiled code.
"""

from __future__ import annotations

from collections.abc import Sequence

from corral.core.counted import place_counts
from corral.core.first_release import ReleaseCounts, WholeNodes
from corral.core.model import JobId
from corral.core.placement import Request, place
from corral.core.state import ClusterState


def placed_counts(state: ClusterState, req: Request) -> list[tuple[int, int]] | None:
    """(node, GPUs) of where the gang places now (nothing taken); None if nowhere."""
    placed = place(state, req, explain=False, take=False)
    if not isinstance(placed, list):
        return None
    counts: dict[int, int] = {}
    for node, mask in placed:
        counts[node] = counts.get(node, 0) + mask.bit_count()
    return sorted(counts.items())


def release(state: ClusterState, job_id: JobId) -> None:
    attempt = state.running[job_id]
    spec, exclusive = attempt.spec, attempt.exclusive
    cpus, memory = spec.cpus_per_replica, spec.memory_gib_per_replica
    for node, mask in attempt.placement:
        state.give_back(node, mask, cpus, memory, exclusive)


class Probe:
    """Where the gang places after the releases up to `last` (None: nowhere), for `gallop`."""

    def fits_after(self, last: int) -> list[tuple[int, int]] | None:
        raise NotImplementedError


class CountedProbe(Probe):
    """`reserve._counted`'s probe: the counts moved to `last` releases (never back before the first)."""

    def __init__(
        self,
        state: ClusterState,
        req: Request,
        ends: Sequence[tuple[float, int, JobId]],
        counts: ReleaseCounts,
        first: int,
    ) -> None:
        self.state, self.req, self.ends, self.counts = state, req, ends, counts
        self.at = first  # the last release counted

    def fits_after(self, last: int) -> list[tuple[int, int]] | None:
        counts, ends = self.counts, self.ends
        while self.at > last:
            counts.undo()
            self.at -= 1
        while self.at < last:
            self.at += 1
            counts.release(ends[self.at][2])
        return place_counts(self.state, self.req, counts.avail)


class WholeProbe(Probe):
    """`reserve._whole_nodes`' probe: the nodes wholly released by `last`."""

    def __init__(self, state: ClusterState, req: Request, nodes: WholeNodes) -> None:
        self.state, self.req, self.nodes = state, req, nodes

    def fits_after(self, last: int) -> list[tuple[int, int]] | None:
        return place_counts(self.state, self.req, self.nodes.avail(last), whole=True)


class ReleasedProbe(Probe):
    """`reserve._search`'s probe: the attempts after `first` released through the plan up to `last`."""

    def __init__(
        self, state: ClusterState, req: Request, ends: Sequence[tuple[float, int, JobId]], first: int
    ) -> None:
        self.state, self.req, self.ends, self.first = state, req, ends, first
        self.marks: list[int] = []  # marks[i]: plan checkpoint before release first + 1 + i
        self.g = max(1, req.gpus_per_replica)

    def fits_after(self, last: int) -> list[tuple[int, int]] | None:
        state, req, marks = self.state, self.req, self.marks
        beyond = last - self.first  # releases needed after the first step
        if len(marks) > beyond:
            state.plan.rollback(marks[beyond])
            del marks[beyond:]
        while len(marks) < beyond:
            marks.append(state.plan.checkpoint())
            release(state, self.ends[self.first + len(marks)][2])
        if state.index.capacity(0, req.classes, self.g)[0] < req.replicas:
            return None
        return placed_counts(state, req)


def gallop(probe: Probe, n: int, first: int) -> tuple[int, list[tuple[int, int]]] | None:
    """The first release at or after `first` (of `n`) after which the gang fits, and where:
    galloping (1, 2, 4, ... more releases), then binary search over the last stretch."""
    failed, step, at = first - 1, 1, first
    while True:
        found = probe.fits_after(at)
        if found is not None or at == n - 1:
            break
        failed, at, step = at, min(at + step, n - 1), step * 2
    if found is None:
        return None
    lo, hi = failed, at  # fails after lo releases (-1: none), fits after hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        result = probe.fits_after(mid)
        if result is not None:
            hi, found = mid, result
        else:
            lo = mid
    return hi, found
