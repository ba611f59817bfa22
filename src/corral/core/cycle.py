"""One scheduling cycle: the single entry point that the simulator and the control plane call.

Phases, least disruptive first (DESIGN.md 2): order queues and jobs; admit against quotas;
allocate whole gangs; for a job still blocked, preempt or reclaim (nominating it to the freed
GPUs); reserve capacity for the head of each queue blocked by capacity; backfill later jobs
that do not delay a reservation; reject jobs that can never fit. Starts stay applied to the
state; reservations are dropped at the end (they are recomputed every cycle).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Hashable

from corral.core import aging, backfill, order, quiet, quiet_las, repeats, reserve
from corral.core import reasons as why_text
from corral.core.capacity_reasons import CapacityReasons
from corral.core.decisions import CycleResult, Reason, Start, Why
from corral.core.estimated_holds import ESTIMATES_KEPT
from corral.core.fairshare import advance_usage, note_reclaiming
from corral.core.families import ADMISSION, CAPACITY, Epoch, Verdict
from corral.core.jobs import PartOf, PendingJob, QueueState
from corral.core.model import JobId, Placement, QueueName
from corral.core.placement import NodeMask, Request, place, sure_miss, to_placement
from corral.core.plugins import Profile
from corral.core.preemption import Preemption
from corral.core.rejections import reject_never_fitting
from corral.core.request import request_for
from corral.core.same_queue import SameQueue
from corral.core.state import ClusterState


def schedule(state: ClusterState, profile: Profile, now: float) -> CycleResult:
    """Run one cycle at time `now` and return its decisions; starts are applied to `state`."""
    result = CycleResult(now)
    state.set_order(profile.job_order.key)
    aging.promote(state, profile.promote_after, now, result)
    if profile.usage_half_life:
        advance_usage(state, now, profile.usage_half_life)
    if state.estimating and now - state.estimates_used_at > ESTIMATES_KEPT:
        state.forget_estimates()
    if state.by_estimate:
        state.refresh_estimates(now)
    reject_never_fitting(state, result)
    note_reclaiming(state)
    cycle = _Cycle(state, profile, now, result)
    try:
        cycle.run()
    finally:
        cycle.walk_of.clear()  # walks refer to the cycle: no garbage cycle left behind
        state.plan.commit()
        reserve.clear(state, cycle.reservations)
    cycle.remove_started()
    deferred = cycle.preemption.deferred
    if profile.name in quiet_las.POLICIES:
        tries = cycle.preemption.tries
        result.quiet = quiet_las.leave(
            state, profile, now, cycle.verdicts, deferred, result, cycle.told_later, tries
        )
    else:
        result.quiet = quiet.leave(state, profile, now, cycle.verdicts, deferred, cycle.quiet_ends, result)
    # a lazy reason of the result refers to its walk, which refers to the cycle: the cycle lets go
    # of the result, so that no garbage cycle holds each cycle's objects until a collection (its
    # next wake kept: `told_later` reads it)
    cycle.result = CycleResult(now, next_wake=result.next_wake)
    cycle.reasons = cycle.result.reasons
    return result


_OWN_BUDGET = (Why.LIMIT, Why.QUOTA, Why.COHORT)  # admission reasons that the queue's own jobs cause
_DEFERRED = "; preemption deferred to a later cycle (per-cycle cap reached)"


class _Cycle:
    def __init__(self, state: ClusterState, profile: Profile, now: float, result: CycleResult) -> None:
        self.state = state
        self.profile = profile
        self.now = now
        self.result = result
        self.reasons = result.reasons
        self.reservations: list[reserve.Reservation] = []
        self.reserved_queues: set[str] = set()
        # changes whenever a reservation is made or moved (the memories below are keyed by it)
        self.reservation_gen = 0
        # a reservation's job -> (its job, request, reason before the reservation): to search
        # again when a nomination takes GPUs it counted on (`backfill.displace`)
        self.reserved_for: dict[JobId, tuple[PendingJob, Request, Reason]] = {}
        # (shape, queue, class, time limit) -> what its first job blocked by capacity was told;
        # a walk records the jobs it passes lazily (`first_told.FirstTold.first_blocked`)
        self.blocked: dict[Hashable, Reason] = {}
        self.walk_of: dict[QueueName, repeats.Walk] = {}
        self.ends: backfill.Ends | None = None  # see `backfill.backfill_end`
        # (blocked shape, preemptible) -> (queues' use version, reason): while no queue's counted
        # GPUs change, admission answers jobs of one shape alike, so a repeat skips it too
        self.verdicts: dict[int, tuple[int, Reason]] = {}  # keyed by `PendingJob.verdict_key`
        self.started: dict[QueueName, list[JobId]] = {}
        self.preemption = Preemption()
        self.why = CapacityReasons(state, now, self.reservations)  # capacity sentences
        # per queue, what a new job of its families would be told after it (`core/quiet.py`;
        # None: the policy skips no cycle, or this cycle decided something)
        self.quiet_ends: dict[QueueName, quiet.QueueEnd] | None = (
            {} if state.quiet_kept and profile.name in quiet.POLICIES else None
        )

    def run(self) -> None:
        order.run(self)

    # ---- one job ----------------------------------------------------------------------------
    def consider(self, job: PendingJob) -> bool:
        spec = job.spec
        reasons = self.result.reasons
        if job.is_flagged(self.now):  # held, backing off or nominated: rare
            if job.held:
                reasons[spec.id] = why_text.held()
                return False
            if job.not_before > self.now:
                reasons[spec.id] = why_text.backoff(job.not_before, self.now)
                self.result.wake_at(job.not_before)
                return False
            if job.nomination is not None and self.preemption.nominated(self, job):
                return True
            if job.nomination is not None:
                return False
        verdict_key, version = job.verdict_key, self.state.use_version
        verdict = self.verdicts.get(verdict_key)
        if verdict is not None and verdict[0] == version:
            reasons[spec.id] = verdict[1]  # what admission and the blocked shape said, unchanged
            return False
        queue = self.state.queues[spec.queue]
        for admit in self.profile.admits:
            why = admit.admit(job, queue, self.state)
            if why is not None:
                if why.code in _OWN_BUDGET and self.profile.victims is not None:
                    outcome = self.preemption.for_budget(self, job, queue)
                    if outcome is not None:
                        return outcome  # nominated (or started) after preempting its own queue's jobs
                    why = self.preemption.protected(self, job, why, SameQueue(self.profile.victims))
                reasons[spec.id] = why
                self.verdicts[verdict_key] = (version, why)
                return False
        req = self.request(job)
        shape = (job.shape, spec.queue, spec.priority, spec.time_limit)  # both set when it was queued
        cached = self._blocked(job, shape)
        if cached is not None:
            reasons[spec.id] = cached
            self.verdicts[verdict_key] = (version, cached)
            return False
        placed = place(self.state, req, job.avoid_nodes)
        if isinstance(placed, list):
            self.start_job(job, placed, backfilled=False)
            return True
        if self.reservations and spec.time_limit is not None and backfill.attempt(self, job, req):
            return True
        if self.profile.victims is not None:
            outcome = self.preemption.preempt(self, job, req)
            if outcome is not None:
                return outcome  # started at once, or nominated and waiting for its victims
        why = self.why.reason(job, req, placed, self.reservation_gen)
        if self.profile.victims is not None:
            why = self.preemption.protected(self, job, why, self.profile.victims)
            if self.preemption.deferred:
                why = Reason(why.code, why.message + _DEFERRED, why.at)
        self.blocked[shape] = why  # later jobs of this shape wait alike, without a reservation
        reasons[spec.id] = backfill.reserve_for(self, job, req, why)
        if self.state.use_version == version:  # what the next job of this shape will be told
            self.verdicts[verdict_key] = (version, self.blocked[shape])
        return False

    def _blocked(self, job: PendingJob, shape: Hashable) -> Reason | None:
        """What the first job of this (shape, queue, class, time limit) blocked by capacity in this
        cycle was told (None: none was yet)."""
        found = self.blocked.get(shape)
        if found is None and self.walk_of:
            walk = self.walk_of.get(job.spec.queue)
            if walk is not None:
                found = walk.told.first_blocked(job, shape)
        return found

    def told_later(self, job: PendingJob) -> Reason | None:
        """What looking at `job` would tell it, a job submitted after this cycle (`core/quiet_las.py`)
        that comes after every job of its victims' preemptor key, repeats no verdict and whose
        (shape, queue, class, time limit) no other job has, if it would start, search, defer and
        wake nothing (None: it may, or that is not known here): it is admitted, misses its
        placement on counts, and a job of its preemptor key found no candidates at the queues' use
        version, or one of its family and nodes avoided found no set in this epoch
        (`Preemption.no_candidates`, `fruitless`); and its victims' protection ends no earlier
        than the cycle's next wake."""
        state, victims = self.state, self.profile.victims
        queue = state.queues[job.spec.queue]
        if victims is None or any(a.admit(job, queue, state) is not None for a in self.profile.admits):
            return None
        req = self.request(job)
        if req.gpus_per_replica == 0 or req.per_node:
            return None
        placed = sure_miss(state, req)  # what `place` answers, known on counts
        pkey = victims.preemptor_key(job, self.now)
        if placed is None or pkey is None:
            return None
        pre = self.preemption
        found = pre.fruitless.get((pkey, job.family, job.avoid_nodes))
        if (found is None or found[0] != self.epoch()) and pre.no_candidates.get(pkey) != state.use_version:
            return None
        why = self.why.reason(job, req, placed, self.reservation_gen)
        return pre.unchanged_protected(self, job, why, victims)

    # ---- what a walk may pass over (repeats.Walk) ----------------------------------------------
    def epoch(self) -> Epoch:
        """What every answer below depends on, besides static capacity: it changes when any
        queue's counted GPUs change, a reservation is made, or preemption is deferred."""
        return (self.state.use_version, self.reservation_gen, self.preemption.deferred)

    def family_verdict(self, job: PendingJob, ahead: bool = False) -> Verdict | None:
        """What `consider` would tell an ordinary job of `job`'s family that repeats no verdict and
        whose (shape, time limit) is not blocked yet, if it cannot start (None: it may start, or
        looking at it would change the cycle's memory: a victim search, a reservation, the next
        wake). A sentence that names when the job would end comes with a `PerLimit` that gives
        each job its own. Changes nothing. Admission plugins do not read the time limit
        (`plugins.Admit`). `ahead` (asked before a look, `repeats.Walk._ahead`): None at once
        while a victim search may still run for the job (the usual None, told cheaply)."""
        state, profile, spec = self.state, self.profile, job.spec
        queue = state.queues[spec.queue]
        victims = profile.victims
        if victims is not None and not victims.groups_by_family and not hasattr(victims, "family_part"):
            return None  # a plugin that cannot say what else it reads: look at every job
        if (
            ahead
            and victims is not None
            and self.preemption.may_search_later(self, self.preemption.no_victims, job)
        ):
            return None
        for admit in profile.admits:
            why = admit.admit(job, queue, state)
            if why is not None:
                if why.code in _OWN_BUDGET and victims is not None:
                    if self.preemption.may_search_later(self, self.preemption.no_budget_victims, job):
                        return None
                    found = self.preemption.unchanged_protected(self, job, why, SameQueue(victims))
                    # (its protection sentence may read its part: told per part and verdict key)
                    return None if found is None else Verdict(ADMISSION, found, part=self._part(job))
                return Verdict(ADMISSION, why)
        req = self.request(job)
        if req.gpus_per_replica == 0 or req.per_node:
            return None  # placed by scanning nodes: no count bounds its backfill
        if victims is not None and self.preemption.may_search_later(self, self.preemption.no_victims, job):
            return None
        if (
            profile.backfill
            and spec.queue not in self.reserved_queues
            and len(self.reservations) < profile.max_reservations
        ):
            return None  # it would take its queue's reservation
        placed = sure_miss(state, req)  # what `place` answers, known without touching the index
        if placed is None:
            return None
        why = self.why.reason(job, req, placed, self.reservation_gen, why_text.RUNS)
        if victims is not None:
            found = self.preemption.unchanged_protected(self, job, why, victims)
            if found is None:
                return None
            why = found
            if self.preemption.deferred:
                why = Reason(why.code, why.message + _DEFERRED, why.at)
        part = None if victims is None else self._part(job)
        if why.code is not Why.BEHIND_RESERVATION:
            return Verdict(CAPACITY, why, part=part)
        # the sentence names when each job would end: its own time limit, filled in when read
        per_limit = self.why.per_limit(why, spec.time_limit)
        return None if per_limit is None else Verdict(CAPACITY, per_limit.reason, per_limit, part)

    def tell(self, job: PendingJob, verdict: Verdict) -> None:
        """What `consider` does for a job whose `family_verdict` is `verdict` (asked just now)
        and that no backfill window could hold: the reason, and the verdict and blocked shape it
        records (a repeated answer comes first; `backfill.reserve_for` keeps the reason: the queue
        has its reservation, or none is taken)."""
        spec, version = job.spec, self.state.use_version
        why = verdict.reason  # (a `PerLimit`'s: the sentence of this job)
        if verdict.kind == CAPACITY:
            shape = (job.shape, spec.queue, spec.priority, spec.time_limit)
            cached = self._blocked(job, shape)
            if cached is None:
                self.blocked[shape] = why
            else:
                why = cached
        self.reasons[spec.id] = why
        self.verdicts[job.verdict_key] = (version, why)

    def _part(self, job: PendingJob) -> int | None:
        """What a protection sentence reads of `job` beyond its family (None: nothing more)."""
        victims = self.profile.victims
        if victims is None or victims.groups_by_family or not self.preemption.protection:
            return None
        return self.family_part(job)

    def family_part(self, job: PendingJob) -> int:
        """`Victims.family_part` (0 when the victims plugin reads only the family)."""
        victims = self.profile.victims
        return 0 if victims is None or victims.groups_by_family else victims.family_part(job)

    def part_source(self) -> tuple[object, PartOf]:
        """The victims plugin and its `family_part` (read only when it reads more than families)."""
        victims = self.profile.victims
        assert victims is not None
        return victims, victims.family_part

    def queue_end(self, queue: QueueState, walk: repeats.Walk) -> None:
        """A queue's walk is over (`order._run_fair`): its families' verdicts hold at this point."""
        result, ends = self.result, self.quiet_ends
        if ends is None:
            return
        if result.starts or result.preemptions or result.nominations or self.preemption.deferred:
            self.quiet_ends = None
            return
        end = self.backfill_end() if self.reservations else None
        ends[queue.spec.name] = quiet.QueueEnd(walk.passive, bool(self.reservations), end)

    def backfill_end(self) -> float | None:
        """`backfill.backfill_end` (`families.Judge`, `backfill.Booking`); its memory read here."""
        ends, state = self.ends, self.state
        if ends is not None and ends.holds(
            state.use_version, self.reservation_gen, self.preemption.deferred, state.base_id
        ):
            return ends.end
        return backfill.backfill_end(self)

    def request(self, job: PendingJob) -> Request:
        req = job.request
        if not isinstance(req, Request) or job.request_generation != self.state.generation:
            req = request_for(self.state, job.spec, job.shape)
            job.request, job.request_generation = req, self.state.generation
        return req

    def placement_of(self, placed: list[NodeMask]) -> Placement:
        return to_placement(self.state, placed)

    def start_job(
        self, job: PendingJob, placed: list[NodeMask], backfilled: bool, allocated: bool = True
    ) -> None:
        attempt = self.state.start(job, placed, self.now, allocated)
        self.result.starts.append(
            Start(job.spec.id, attempt.attempt, to_placement(self.state, placed), backfilled)
        )
        self.started.setdefault(job.spec.queue, []).append(job.spec.id)
        self.result.reasons.drop(job.spec.id)

    def displace(self, held: list[NodeMask]) -> None:
        backfill.displace(self, held)  # (`preemption.Host`)

    def remove_started(self) -> None:
        for name, ids in self.started.items():
            queue = self.state.queues[name]
            keys = queue.pending_keys
            for job_id in ids:
                job = queue.pending.pop(job_id)
                del self.state.jobs[job_id]
                self.state.unqueue(queue, job)
                del keys[bisect_left(keys, job.key)]
                job.key = ()
