"""Victim searches known to find no candidates before a look (`_Cycle.family_verdict(ahead=True)`).

Most victim searches of an oversubscribed cycle find no running attempt that could be a victim
at all (`preempt.NO_CANDIDATES`): no (queue, class) group is eligible (`preempt.eligible_groups`,
what `select_victims` asks first). Such a search changes only the preemption phase's counts and
memory (a try counted, the queue found to have no victims for the job's class and size): a walk
may then tell the job its verdict without a look, provided it makes that same search when telling
it (`_Cycle.tell` calls `Preemption.preempt`, which answers at once), after which the rest of its
family is known to have no victims and passes as a run.
"""

from __future__ import annotations

from corral.core import preemption as memo
from corral.core.jobs import PendingJob
from corral.core.preempt import eligible_groups
from corral.core.preemption import Host, Preemption

AHEAD = True  # False: a job whose victim search may run is always looked at (tests compare)


def finds_none(host: Host, pre: Preemption, job: PendingJob) -> bool:
    """Whether `Preemption.preempt` would, for the job now, count a try and find no candidates at
    all (neither capped nor deferred; as its own memory or a search would answer: exactly)."""
    if not AHEAD:
        return False
    plugin = host.profile.victims
    assert plugin is not None
    if pre.tries >= host.profile.max_preemption_tries or (
        len(host.result.nominations) >= host.profile.max_nominations
    ):
        return False  # a look would set `deferred` (or, set already, search nothing)
    pkey = plugin.preemptor_key(job, host.now)
    if pkey is not None and memo.REMEMBER:
        found = pre.fruitless.get((pkey, job.family, job.avoid_nodes))
        if found is not None and found[0] == host.epoch():
            return found[1]  # (found False: candidates without a set; each look counts a try)
        if memo.NONE_BY_KEY and not hasattr(plugin, "narrow") and pre.no_candidates.get(pkey) == (
            host.state.use_version
        ):
            return True
    return not eligible_groups(host.state, plugin, job, host.now)
