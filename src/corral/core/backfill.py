"""The cycle's backfill and reservations (DESIGN.md 2): EASY backfill of a job that ends before
every reservation it would touch (`attempt`), the latest reservation start from which such an
attempt can change anything (`backfill_end`), a reservation for the first capacity-blocked job of
each queue (`reserve_for`, `hold`), and the reservations searched again when a nomination takes
GPUs they counted on (`displace`). The cycle passes itself to each call (`Booking`), so that
nothing here refers to it.
"""

from __future__ import annotations

from typing import Protocol

from corral.core import reasons as why_text
from corral.core import reserve
from corral.core.decisions import CycleResult, Reason, Reserve
from corral.core.estimated_holds import confident, estimated_hold
from corral.core.jobs import PendingJob
from corral.core.model import JobId
from corral.core.placement import NodeMask, Request, place
from corral.core.plugins import Profile
from corral.core.state import ClusterState

SKIP_VAIN_BACKFILL = True  # False: every backfill attempt is made (tests compare: `attempt`)
REMEMBER_ENDS = True  # False: `backfill_end` computed anew at every question (tests compare)
TOUCHED_ONLY = True  # False: `backfill_end` checks every node lifted so far at each start (tests compare)


class Ends:
    """`backfill_end`'s answer and the epoch and base id it was computed at, compared field by
    field (natively, in the compiled core: no tuple built per question; the walk asks it tens of
    times per cycle). (A class written out: the compiled core builds it natively.)"""

    __slots__ = ("base_id", "deferred", "end", "gen", "version")

    def __init__(self, version: int, gen: int, deferred: bool, base_id: int, end: float | None) -> None:
        self.version = version  # the queues' use version
        self.gen = gen  # the cycle's reservations made or moved
        self.deferred = deferred  # preemption deferred
        self.base_id = base_id  # `ClusterState.base_id`: no node changed either
        self.end = end

    def holds(self, version: int, gen: int, deferred: bool, base_id: int) -> bool:
        """Whether `end` is still the answer (nothing it read changed)."""
        same = self.version == version and self.gen == gen
        return same and self.deferred == deferred and self.base_id == base_id


class Booking(Protocol):
    """The cycle, as its backfill and reservations see it."""

    state: ClusterState
    profile: Profile
    now: float
    result: CycleResult
    reservations: list[reserve.Reservation]
    reserved_queues: set[str]
    reservation_gen: int
    reserved_for: dict[JobId, tuple[PendingJob, Request, Reason]]
    ends: Ends | None

    def epoch(self) -> tuple[int, int, bool]: ...

    def backfill_end(self) -> float | None: ...

    def start_job(
        self, job: PendingJob, placed: list[NodeMask], backfilled: bool, allocated: bool = True
    ) -> None: ...


def backfill_end(cycle: Booking) -> float | None:
    """The latest reservation start S such that lifting every reservation that starts at S or
    later changes what some node offers (None: none does). A job that ends after S and whose
    placement misses is tried for backfill (`attempt`) in vain and without a trace: what it
    lifts changes nothing, so it misses again. Changes nothing itself."""
    state, found = cycle.state, None
    version, gen, deferred = cycle.epoch()
    ends = cycle.ends
    if ends is not None and ends.holds(version, gen, deferred, state.base_id):
        return ends.end
    free, reserved, avail = state.free_count, state.reserved, state.index.avail
    reservations = cycle.reservations
    by_start = reservations if len(reservations) < 2 else sorted(reservations, key=_start, reverse=True)
    lifted: dict[int, int] = {}
    touched_only = TOUCHED_ONLY
    i = 0
    while i < len(by_start) and found is None:
        start, first = by_start[i].start, i
        while i < len(by_start) and by_start[i].start == start:
            for node, gpus in by_start[i].capacity:
                lifted[node] = lifted.get(node, 0) + gpus
            i += 1
        if not touched_only:
            for n, gpus in lifted.items():  # `available_lifting` from the free counts
                offers = free[n] - reserved[n] + gpus if state.is_schedulable(n) else 0
                if (offers if offers > 0 else 0) != avail[n]:
                    found = start
                    break
            continue
        # a node this start's reservations do not touch offers what it offered when the later
        # starts were lifted (nothing else changed): found equal then, it is equal now; checking
        # only the touched nodes keeps the cost with the reservations, not their running sum
        for j in range(first, i):
            for n, _ in by_start[j].capacity:
                offers = free[n] - reserved[n] + lifted[n] if state.is_schedulable(n) else 0
                if (offers if offers > 0 else 0) != avail[n]:
                    found = start
                    break
            if found is not None:
                break
    if REMEMBER_ENDS:  # (else never kept: `_Cycle.backfill_end` finds none either)
        cycle.ends = Ends(version, gen, deferred, state.base_id, found)
    return found


def _start(r: reserve.Reservation) -> float:
    return r.start


def attempt(cycle: Booking, job: PendingJob, req: Request) -> bool:
    """Start a job that ends before every reservation it would touch (EASY backfill)."""
    state = cycle.state
    ends_by = cycle.now + (job.spec.time_limit or 0.0)
    if SKIP_VAIN_BACKFILL:
        end = cycle.backfill_end()  # (`backfill_end`, answered at once while it holds)
        if end is None or ends_by > end:
            return False  # what it would lift changes nothing: it would miss again, leaving no trace
    lifted = [r for r in cycle.reservations if r.start >= ends_by]
    if not lifted or reserve.misses_lifted(state, req, lifted, job.avoid_nodes):
        return False
    checkpoint = state.plan.checkpoint()
    reserve.lift(state, lifted, ends_by)
    placed = place(state, req, job.avoid_nodes)
    if not isinstance(placed, list):
        state.plan.rollback(checkpoint)
        return False
    for r in lifted:
        reserve.hold(state, r)
    cycle.start_job(job, placed, backfilled=True)
    return True


def reserve_for(cycle: Booking, job: PendingJob, req: Request, why: Reason) -> Reason:
    """Reserve capacity for the first capacity-blocked job of its queue; the reason it waits."""
    queue, profile = job.spec.queue, cycle.profile
    if (
        profile.backfill
        and queue not in cycle.reserved_queues
        and len(cycle.reservations) < profile.max_reservations
    ):
        cycle.reserved_queues.add(queue)
        return hold(cycle, job, req, why)
    return why


def hold(cycle: Booking, job: PendingJob, req: Request, why: Reason) -> Reason:
    """Search the earliest capacity for the job and hold it (a reservation); the reason."""
    state, now, result = cycle.state, cycle.now, cycle.result
    found, estimate = reserve.earliest_fit(state, req, now), None
    hold_after = cycle.profile.hold_after
    if found is None and hold_after is not None and state.want_estimates(now):
        found, estimate = estimated_hold(state, job, req, now)
        hold_at = job.spec.submit_time + hold_after
        if found is not None and hold_at > now and not confident(estimate):
            result.wake_at(hold_at)  # aging: a poor estimate holds GPUs once it has waited
            return why_text.hold_later(why, hold_at, now)
    if found is None:
        text = "; no reservation: the GPUs it needs are held by jobs without a time limit"
        return Reason(why.code, why.message + text, why.at)
    found = reserve.Reservation(job.spec.id, found.start, found.capacity)
    reserve.hold(state, found)
    cycle.reservations.append(found)
    cycle.reservation_gen += 1
    cycle.reserved_for[job.spec.id] = (job, req, why)
    capacity = tuple((state.specs[n].name, c) for n, c in found.capacity)
    result.reservations.append(Reserve(job.spec.id, found.start, capacity))
    result.wake_at(found.start)
    if estimate is not None:
        return why_text.with_estimated_reservation(why, found.start, now, estimate)
    return why_text.with_reservation(why, found.start, now)


def displace(cycle: Booking, held: list[NodeMask]) -> None:
    """A nomination holds these GPUs from now on: every reservation of this cycle on their
    nodes is searched again with them held (it stays where it was if it still fits; it moves
    later, or goes, if it counted on them), and its job's reason follows. A reservation never
    counts on GPUs nominated to another job (DESIGN section 2: nobody else gets them)."""
    nodes = {n for n, _ in held}
    hit = [r for r in cycle.reservations if any(n in nodes for n, _ in r.capacity)]
    if not hit:
        return
    state, result = cycle.state, cycle.result
    for r in hit:
        cycle.reservations.remove(r)
        for node, gpus in r.capacity:
            state.set_reserved(node, state.reserved[node] - gpus)
        result.reservations[:] = [x for x in result.reservations if x.job != r.job]
    cycle.reservation_gen += 1
    for r in hit:
        job, req, why = cycle.reserved_for.pop(JobId(r.job))
        result.reasons[job.spec.id] = hold(cycle, job, req, why)
