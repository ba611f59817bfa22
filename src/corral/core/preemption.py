"""The preemption phase of a cycle: victim searches for blocked jobs, with the cycle's memory of
them, and nominations (a preemptor waits for exactly the GPUs its victims free).

Per cycle it remembers, per queue, the highest class found to have no victims (candidates only
shrink during a cycle), and counts searches and nominations against the profile's caps; a job
that skipped a search because of a cap makes `deferred` true, which the capacity reasons then
say. `may_search_later` tells, without counting, whether a job of a class could still search
(a walk passes over jobs only when none could: `repeats`).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Protocol

from corral.core import reasons as why_text
from corral.core.decisions import CycleResult, Nominate, Preempt, Reason, Why
from corral.core.jobs import PendingJob, QueueState, RunningAttempt
from corral.core.model import Placement, QueueName
from corral.core.occupancy import Group
from corral.core.placement import NodeMask, Request
from corral.core.plugins import Profile, Victims
from corral.core.preempt import NO_CANDIDATES, Miss, Ranked, Selection, ranked_candidates, select_victims
from corral.core.same_queue import SameQueue
from corral.core.state import ClusterState
from corral.core.victim_nodes import NodesMemo, too_few

REMEMBER = True  # False: every search, ranking and protection end computed anew (tests compare)
SAME_SENTENCES = True  # False: every protection sentence formatted anew (tests compare)
NONE_BY_KEY = True  # False: no search answered from another family's (tests compare)
EARLIER_ONLY = True  # False: `_until` asks every protected group whether it is eligible (tests compare)
BUDGET_FEW = True  # False: `for_budget` searches even where its candidates are too few (tests compare)


class Host(Protocol):
    """The cycle, as its preemption phase sees it."""

    state: ClusterState
    profile: Profile
    now: float
    result: CycleResult

    def consider(self, job: PendingJob) -> bool: ...

    def request(self, job: PendingJob) -> Request: ...

    def start_job(
        self, job: PendingJob, placed: list[NodeMask], backfilled: bool, allocated: bool = True
    ) -> None: ...

    def placement_of(self, placed: list[NodeMask]) -> Placement: ...

    def epoch(self) -> tuple[int, int, bool]: ...

    def displace(self, held: list[NodeMask]) -> None: ...


class Preemption:
    """One cycle's preemption phase and its memory (the cycle passes itself to each call, so
    that the two do not refer to each other: no garbage cycle per scheduling cycle)."""

    def __init__(self) -> None:
        # queue -> class -> fewest GPUs of a job of that class found to have no candidates: none
        # for a job of that class or lower needing as many GPUs or more (reclaim lets a smaller
        # job take what a larger one may not: the taker must stay within its quota). One entry
        # per class, so a check costs the number of classes, not the number of jobs looked at
        self.no_victims: dict[QueueName, dict[int, int]] = {}
        self.no_budget_victims: dict[QueueName, dict[int, int]] = {}  # the same, own queue
        self.tries = 0
        self.deferred = False  # a job skipped preemption because of the per-cycle caps
        self.protection: dict[Group, float] | None = None  # per group, when its first protection ends
        self.until: dict[Hashable, tuple[int, float | None]] = {}  # see `_until`
        self.ranked: Ranked = {}  # the cycle's rankings of candidates (`preempt.ranked_candidates`)
        self.on_nodes = NodesMemo()  # where their candidates are (`victim_nodes.on_nodes`)
        # (preemptor key, family, nodes avoided) -> (the cycle's epoch, no candidates at all): a
        # search that found nothing, answered again while the epoch holds (no start, preemption,
        # nomination or reservation since: the search reads only the state and those)
        self.fruitless: dict[Hashable, tuple[tuple[int, int, bool], bool]] = {}
        # (id of a reason, protection end) -> (that reason, kept alive so that its id is not
        # reused; the reason naming that end): one sentence per pair in a cycle (one `now`), not
        # one per job told it (`reasons.with_protection` formats a clock; a walk's jobs of one
        # family are told the same reason object)
        self.with_protection: dict[tuple[int, float], tuple[Reason, Reason]] = {}
        # preemptor key -> the queues' use version at which a search for a job of that key found
        # no candidates at all: so for every job of that key while it holds (whether a running
        # attempt is a candidate, and which groups the plugin allows, depend on the preemptor
        # through its key alone: `Victims.preemptor_key`; not for a plugin that narrows groups,
        # which reads the preemptor beyond it), whatever its shape, nodes avoided or the
        # reservations (the families `fruitless` tells apart)
        self.no_candidates: dict[Hashable, int] = {}

    def may_search(self, host: Host, none_up_to: dict[QueueName, dict[int, int]], job: PendingJob) -> bool:
        """Whether to search victims for the job: not when its queue was found to have none for
        its class or a higher one and as many GPUs or fewer (candidates only shrink during a
        cycle), nor past the per-cycle caps (counted here; the reason then says preemption was
        deferred)."""
        if _known_none(none_up_to, job):
            return False
        if self.tries >= host.profile.max_preemption_tries or (
            len(host.result.nominations) >= host.profile.max_nominations
        ):
            self.deferred = True
            return False
        self.tries += 1
        return True

    def preempt(self, host: Host, job: PendingJob, req: Request) -> bool | None:
        """Nominate the job to GPUs freed by preempting whole gangs, if the policy allows.

        None: no preemption; False: nominated, waiting for the victims; True: started.
        """
        victims_plugin = host.profile.victims
        assert victims_plugin is not None
        if not self.may_search(host, self.no_victims, job):
            return None
        pkey = victims_plugin.preemptor_key(job, host.now)
        # the job's family fixes its placement request (its shape) and its queue and class
        memo = None if pkey is None or not REMEMBER else (pkey, job.family, job.avoid_nodes)
        if memo is not None:
            found = self.fruitless.get(memo)
            if found is not None and found[0] == host.epoch():
                if found[1]:
                    _none_up_to(self.no_victims, job)
                return None
        outcome = self._search(host, victims_plugin, job, req)
        if outcome is None or outcome is NO_CANDIDATES:
            if memo is not None:
                self.fruitless[memo] = (host.epoch(), outcome is NO_CANDIDATES)
            return None
        assert isinstance(outcome, bool)
        return outcome

    def _search(self, host: Host, plugin: Victims, job: PendingJob, req: Request) -> bool | Miss | None:
        """`preempt`'s search: NO_CANDIDATES or None when it found nothing (changing nothing)."""
        state = host.state
        by_key = REMEMBER and NONE_BY_KEY and not hasattr(plugin, "narrow")
        pkey = plugin.preemptor_key(job, host.now) if by_key else None
        if pkey is not None and self.no_candidates.get(pkey) == state.use_version:
            selection: Selection | Miss | None = NO_CANDIDATES  # as a search would find again
        else:
            selection = select_victims(state, plugin, job, req, host.now, self._ranked(), self._nodes())
        if selection is NO_CANDIDATES:
            if pkey is not None:
                self.no_candidates[pkey] = state.use_version
            _none_up_to(self.no_victims, job)
            return NO_CANDIDATES
        refused = isinstance(selection, Selection) and not plugin.permit(
            job, selection.victims, state, host.now
        )
        if (
            refused
        ):  # the set mixes queues in a way reclaim forbids: its own queue's lower classes may still do
            same = SameQueue(plugin)
            selection = select_victims(state, same, job, req, host.now, self._ranked(), self._nodes())
        if not isinstance(selection, Selection) or not selection.victims:
            return None
        if not plugin.permit(job, selection.victims, state, host.now):
            return None
        return self._nominate(host, job, selection.placement, selection.victims, "to free its GPUs")

    def for_budget(self, host: Host, job: PendingJob, queue: QueueState) -> bool | None:
        """A job its own queue's quota or limit keeps out: preempt lower-class jobs of that queue
        (only) until it is admitted, and free a placement for it (Kueue's withinClusterQueue).

        None: no such preemption; False: nominated, waiting for the victims; True: started.
        """
        victims_plugin = host.profile.victims
        assert victims_plugin is not None
        state, spec, now = host.state, job.spec, host.now
        if not self.may_search(host, self.no_budget_victims, job):
            return None
        narrowed = SameQueue(victims_plugin)
        pkey = narrowed.preemptor_key(job, now)
        memo = None if pkey is None or not REMEMBER else ("budget", pkey, job.family, job.avoid_nodes)
        if memo is not None:
            found = self.fruitless.get(memo)
            if found is not None and found[0] == host.epoch():
                return None  # its candidates free no placement for it, as for the last of its key
        ranked = ranked_candidates(state, narrowed, job, now, memo=self._ranked())
        if not ranked:
            _none_up_to(self.no_budget_victims, job)
            return None
        req = host.request(job)
        # the free GPUs and its candidates' together too few for its replicas: no set (`BUDGET_FEW`)
        few = (
            BUDGET_FEW
            and not req.per_node
            and too_few(state, ranked, req.replicas, max(1, req.gpus_per_replica))
        )
        selection = (
            None if few else select_victims(state, narrowed, job, req, now, self._ranked(), self._nodes())
        )
        if not isinstance(selection, Selection):
            if memo is not None:  # (a key of its own: `SameQueue`'s)
                self.fruitless[memo] = (host.epoch(), False)
            return None  # even its queue's lower classes do not free a placement for it
        victims = list(selection.victims)
        taken = {id(v) for v in victims}
        freed = sum(v.spec.gpus for v in victims)
        for candidate in ranked:
            if self._admitted(host, job, queue, freed):
                break
            if id(candidate) not in taken:
                taken.add(id(candidate))
                victims.append(candidate)
                freed += candidate.spec.gpus
        else:
            if not self._admitted(host, job, queue, freed):
                return None
        if not victims or not victims_plugin.permit(job, victims, state, now):
            return None
        return self._nominate(host, job, selection.placement, victims, f"to make room in queue {spec.queue}")

    def _admitted(self, host: Host, job: PendingJob, queue: QueueState, freed: int) -> bool:
        """Whether every admission plugin admits the job once `freed` GPUs of its queue have left.
        The queues' use changes here without `use_version` (nothing else is to see it): what the
        admission remembers per use version is set aside meanwhile, so that it neither answers
        from the state without `freed` nor keeps what it computed with it."""
        caches = host.state.caches
        rooms, reclaiming = caches.borrow_rooms, caches.reclaiming
        caches.borrow_rooms = None
        queue.leaving_gpus += freed
        try:
            return all(admit.admit(job, queue, host.state) is None for admit in host.profile.admits)
        finally:
            queue.leaving_gpus -= freed
            caches.borrow_rooms, caches.reclaiming = rooms, reclaiming

    def _ranked(self) -> Ranked | None:
        return self.ranked if REMEMBER else None

    def _nodes(self) -> NodesMemo | None:
        return self.on_nodes if REMEMBER else None

    def _nominate(
        self, host: Host, job: PendingJob, placed: list[NodeMask], victims: list[RunningAttempt], why: str
    ) -> bool:
        """Preempt the victims and nominate the job to `placed` (it starts at once when nothing it
        waits for is running)."""
        state = host.state
        placement = host.placement_of(placed)
        ids = tuple(v.spec.id for v in victims)
        for v in victims:
            deadline = host.now + v.spec.checkpoint_grace
            state.mark_preempting(v.spec.id, deadline, job.spec.id)
            reason = (
                f"preempted by {job.spec.id}"
                if v.spec.queue == job.spec.queue
                else f"reclaimed by queue {job.spec.queue} for {job.spec.id}"
            )
            host.result.preemptions.append(Preempt(v.spec.id, v.attempt, job.spec.id, deadline, reason))
        state.nominate(job, placed, frozenset(ids), host.now)
        held = job.nomination.held if job.nomination is not None else placed
        host.displace(held)  # the reservations that counted on these GPUs are searched again
        host.result.nominations.append(Nominate(job.spec.id, placement, ids))
        host.result.reasons[job.spec.id] = Reason(
            Why.NOMINATED, f"preempting {', '.join(ids)} {why}; starts when they stop"
        )
        if not any(state.alloc[n] & m for n, m in held):
            return self.nominated(host, job)
        return False

    def nominated(self, host: Host, job: PendingJob) -> bool:
        """Start a nominated job once its victims have stopped (all of them: some may have been
        taken to make room in its queue's quota or limit, away from its GPUs) and its GPUs are
        free; drop a nomination that cannot come true."""
        state = host.state
        nomination = job.nomination
        assert nomination is not None
        broken = any(
            not state.is_schedulable(n) or state.healthy[n] & mask != mask for n, mask in nomination.placement
        )
        # a victim is left while the attempt preempted for this job runs: one that stopped and
        # started again (a new attempt, elsewhere) is gone, else the job would wait for its end
        running, me = state.running, job.spec.id
        left = [
            v
            for v in nomination.victims
            if (a := running.get(v)) is not None
            and a.preempting_deadline is not None
            and a.preempted_by == me
        ]
        busy = any(state.alloc[n] & mask for n, mask in nomination.held)
        if broken or (busy and not left):
            state.drop_nomination(job)
            return host.consider(job)
        if left:
            host.result.reasons[job.spec.id] = Reason(
                Why.NOMINATED, f"preempted {', '.join(sorted(left))} for it; starts when they stop"
            )
            return False
        state.drop_nomination(job)
        host.start_job(job, nomination.placement, backfilled=False, allocated=False)
        return True

    def protected(self, host: Host, job: PendingJob, why: Reason, plugin: Victims) -> Reason:
        """A job that found no victims: when the first attempt it might take leaves its
        `min_runtime` (the cycle is due again then; the reason says so)."""
        if self.protection is None:
            self.protection = host.state.occupancy.protection_ends(host.now)
        state, now, result = host.state, host.now, host.result
        later = plugin.eligible_from(job, state, now)  # e.g. `tiresias`' patience ends
        if later is not None:
            result.wake_at(later)
        fresh = plugin.fresh_groups(job, state, now)  # a checkpoint there may give it a victim
        if fresh:
            within, wakes = plugin.fresh_for(job), result.checkpoint_wakes
            for group in fresh:
                if wakes.get(group, within + 1.0) > within:
                    wakes[group] = within
        until = self._until(host, job, plugin)
        if until is None:
            return why
        result.wake_at(until)
        return self._with_protection(why, until, now)

    def unchanged_protected(self, host: Host, job: PendingJob, why: Reason, plugin: Victims) -> Reason | None:
        """What `protected` answers, when calling it would change nothing in the cycle (its time
        is no earlier than the cycle's next wake, or there is none); None otherwise (then the
        job must be looked at: a walk passes over it only if looking at it changes nothing)."""
        if self.protection is None:
            return None  # computing it now could see other attempts than the long way would
        # (when its victims' protection ends may depend on the job beyond its family: a walk
        # tells the answer only to jobs of the same `Victims.family_part`, `Verdict.part`)
        state, now, result = host.state, host.now, host.result
        later = plugin.eligible_from(job, state, now)
        if later is not None and result.now < later < result.next_wake:
            return None
        fresh = plugin.fresh_groups(job, state, now)
        if fresh:
            within, wakes = plugin.fresh_for(job), result.checkpoint_wakes
            if any(wakes.get(group, within + 1.0) > within for group in fresh):
                return None  # looking at it would add a checkpoint wake
        until = self._until(host, job, plugin)
        if until is None:
            return why
        if result.now < until < result.next_wake:
            return None
        return self._with_protection(why, until, now)

    def _with_protection(self, why: Reason, until: float, now: float) -> Reason:
        """`reasons.with_protection`, remembered for the cycle (its `now` never changes)."""
        if not (REMEMBER and SAME_SENTENCES):
            return why_text.with_protection(why, until, now)
        key = (id(why), until)
        found = self.with_protection.get(key)
        if found is None:
            found = self.with_protection[key] = (why, why_text.with_protection(why, until, now))
        return found[1]

    def _until(self, host: Host, job: PendingJob, plugin: Victims) -> float | None:
        """When the first protection of the groups the plugin allows the job ends (remembered per
        preemptor key while no queue's counted GPUs change: `group_eligible` reads no more)."""
        protection = self.protection
        assert protection is not None
        state, now = host.state, host.now
        pkey = plugin.preemptor_key(job, now) if REMEMBER else None
        if pkey is not None:
            found = self.until.get(pkey)
            if found is not None and found[0] == state.use_version:
                return found[1]
        until: float | None = None
        for (q, p), t in protection.items():  # the earliest end of an eligible group (a loop:
            # no generator per question in the compiled core; a group ending no earlier than the
            # earliest found so far is not asked, `group_eligible` only answers)
            if until is not None and t >= until and EARLIER_ONLY:
                continue
            if plugin.group_eligible(job, q, p, state, now) and (until is None or t < until):
                until = t
        # a plugin whose `group_eligible` reads only today's candidates (`tiresias`' levels) says
        # itself when one inside its minimum run time would become a victim
        later = plugin.protection_end(job, state, now)
        if later is not None and (until is None or later < until):
            until = later
        if pkey is not None:
            self.until[pkey] = (state.use_version, until)
        return until

    def may_search_later(
        self, host: Host, none_up_to: dict[QueueName, dict[int, int]], job: PendingJob
    ) -> bool:
        """Whether `may_search` could still search victims for the job, or set `deferred`."""
        if _known_none(none_up_to, job):
            return False
        capped = self.tries >= host.profile.max_preemption_tries or (
            len(host.result.nominations) >= host.profile.max_nominations
        )
        return not (capped and self.deferred)


def _known_none(none_up_to: dict[QueueName, dict[int, int]], job: PendingJob) -> bool:
    """Whether a job of the same queue, of this class or a higher one, needing as many GPUs or
    fewer, was found to have no candidates this cycle."""
    known = none_up_to.get(job.spec.queue)
    if known is None:
        return False
    priority, gpus = job.spec.priority, job.spec.gpus
    return any(priority <= p and gpus >= g for p, g in known.items())


def _none_up_to(none_up_to: dict[QueueName, dict[int, int]], job: PendingJob) -> None:
    """Remember that the job's queue has no victims for its class and size (nor, so, for any
    lower class needing as many GPUs or more)."""
    known = none_up_to.setdefault(job.spec.queue, {})
    priority, gpus = job.spec.priority, job.spec.gpus
    fewest = known.get(priority)
    known[priority] = gpus if fewest is None else min(fewest, gpus)
