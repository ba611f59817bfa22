"""`tiresias`' fresh candidates of a group: those that checkpointed (or started) within `max_lost`
and whose attained service has reached a floor (the level above the preemptor's).

`Occupancy.fresh` keeps a group's candidates sorted by their last checkpoint, so the ones within
`max_lost` are a suffix of it; but on a large cluster that suffix holds thousands (a checkpoint
every 30 minutes, `max_lost` 10 minutes: a third of the group), and a floor above the first level
leaves few of them: a one-GPU job reaches 16 GPU-hours only after 16 hours. The candidates that
may have reached the floor are known too (`served.Reaching`, sorted by when their service reaches
it, kept for `las`): `fresh` reads whichever of the two is shorter (switch `BY_REACHING`), and
returns the same attempts in the same order (newest checkpoint first, then the higher job id).

`protection_end` (when the first attempt of a group inside its minimum run time becomes one that a
preemptor below the first level may take) reads, likewise, only the attempts whose service will
have reached the first level when their minimum run time ends (`Occupancy.serving`, switch
`SERVING`), not every attempt that started within it.
"""

from __future__ import annotations

from bisect import bisect_left
from operator import itemgetter

from corral.core.jobs import RunningAttempt
from corral.core.model import JobId
from corral.core.occupancy import WAITING, Group, Occupancy

BY_REACHING = True  # False: the suffix of the last checkpoints is always read (tests compare)
SERVING = True  # False: `protection_end` reads every attempt inside its minimum run time (tests compare)

_since_and_id = itemgetter(0, 1)


def fresh(
    occupancy: Occupancy, group: Group, now: float, cutoff: float, floor: float, every: bool
) -> list[RunningAttempt]:
    """The group's candidates checkpointed (or started) at `cutoff` or later, started before `now`,
    whose service at `now` has reached `floor`, newest checkpoint first (`every` False: at most
    one)."""
    members = occupancy.members.get(group)
    found: list[RunningAttempt] = []
    if members is None:
        return found
    entries = occupancy.fresh(group)
    if BY_REACHING and floor > 0:
        window = len(entries) - bisect_left(entries, (cutoff,))
        if occupancy.reaching.count(floor, now) < window:
            return _by_reaching(occupancy, group, now, cutoff, floor, every)
    i = len(entries) - 1
    while i >= 0 and entries[i][0] >= cutoff:
        a = members[entries[i][1]]
        if a.start < now and a.job.attained + a.spec.gpus * (now - a.start) >= floor:
            found.append(a)
            if not every:
                break
        i -= 1
    return found


def _by_reaching(
    occupancy: Occupancy, group: Group, now: float, cutoff: float, floor: float, every: bool
) -> list[RunningAttempt]:
    """`fresh` read from the candidates whose service may have reached `floor` (`Reaching`: a
    superset, checked here exactly), then ordered as the checkpoints' suffix orders them."""
    queue, priority = group
    keyed: list[tuple[float, JobId, RunningAttempt]] = []
    for a in occupancy.reaching.reaching(floor, now):
        spec = a.job.spec
        if spec.queue != queue or spec.priority != priority:
            continue
        start = a.start
        since = max(start, a.last_checkpoint)
        if since < cutoff or not start < now:
            continue
        if a.job.attained + spec.gpus * (now - start) >= floor:
            keyed.append((since, spec.id, a))
            if not every:
                break
    keyed.sort(key=_since_and_id, reverse=True)
    return [k[2] for k in keyed]


def protection_end(
    occupancy: Occupancy, group: Group, now: float, floor: float, max_lost: float
) -> float | None:
    """When the first attempt of the group inside its minimum run time leaves it (after `now`)
    with its service at `floor` or more and at most `max_lost` seconds of work to lose then (it
    has checkpointed in this attempt, or its minimum run time is that short); None: none."""
    entries = occupancy.serving(group, floor) if SERVING else occupancy.inside(group)
    first: float | None = None
    for end, _, a in entries:
        if a.candidate != WAITING or end <= now or (first is not None and end >= first):
            continue
        if a.last_checkpoint <= a.start and end - a.start > max_lost:
            continue  # it will have more than `max_lost` to lose then, unless it checkpoints
        if a.job.attained + a.spec.gpus * (end - a.start) >= floor:
            first = end
    return first
