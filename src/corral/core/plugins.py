"""The extension points of a cycle, one small protocol each, and the profile that combines them.

Plugins live in `corral.policies`; the core only knows these protocols (STYLE.md: one narrow
interface per extension point, outcomes as values).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from corral.core.decisions import Reason
from corral.core.jobs import PendingJob, QueueState, RunningAttempt
from corral.core.model import QueueName
from corral.core.state import ClusterState


class JobOrder(Protocol):
    """The position of a pending job inside its queue (smaller first); static while it waits."""

    def key(self, job: PendingJob) -> tuple[object, ...]: ...


class QueueOrder(Protocol):
    """Which queue is served next (smaller first); recomputed after each start in the queue."""

    def key(self, queue: QueueState, state: ClusterState) -> tuple[object, ...]: ...


class Admit(Protocol):
    """Quotas and limits: None admits the job, a Reason keeps it waiting.

    The answer may depend only on the job's spec (its shape, queue, class and preemptibility,
    not its time limit) and on the queues' counted GPUs: a cycle reuses it for the other jobs of
    the same family (jobs that differ at most by their time limits) while no queue's count has
    changed (`ClusterState.use_version`; `core/repeats.py`).
    """

    def admit(self, job: PendingJob, queue: QueueState, state: ClusterState) -> Reason | None: ...


class VictimFilter(Protocol):
    """Which running attempts a blocked job may preempt.

    `group_eligible` is an upper bound of `eligible` for every attempt of a (queue, class)
    group; only the attempts of groups it allows are examined, and only preemptible attempts
    that are not already stopping are ever examined. `bounds_by_group` says whether it is
    informative enough to bound each node's freeable GPUs by group; when it is not, victim
    selection examines the attempts one by one. `groups_by_family` says whether `group_eligible`
    reads of the preemptor only what its family shares (queue, class, shape, preemptibility: not
    its time limit or its attained service), so that a cycle may answer a family's jobs alike
    (`core/repeats.py`); when it reads more, `family_part` says what, as an int: jobs of a family
    with equal parts are answered alike (read only when `groups_by_family` is false).

    A plugin that may take only a few attempts of some group may also have a method
    `narrow(preemptor, group, state, now)` returning them (a list holding every attempt of the
    group it may take; None: the whole group): victim selection then reads those instead of the
    group (`core/narrow.py`).
    """

    bounds_by_group: bool
    groups_by_family: bool
    # whether `eligible` and `rank` read only the attempt, the time and the preemptor's key (not
    # the queues' counts): then in one cycle a ranking stays right for the attempts still candidates
    ranks_by_attempt: bool

    def family_part(self, preemptor: PendingJob) -> int:
        """What `group_eligible` reads of the preemptor beyond its family, as an int."""
        ...

    def preemptor_key(self, preemptor: PendingJob, now: float) -> Hashable | None:
        """Everything the plugin (`eligible`, `group_eligible`, `rank`, `permit`, `narrow`) reads
        of the preemptor at `now`, as one value: preemptors with equal keys and one placement
        request find the same victims in one state at one time, so a cycle searches once for them
        while nothing changes (`preemption.Preemption`). None: no such value (every search runs)."""
        ...

    def eligible(
        self, preemptor: PendingJob, victim: RunningAttempt, state: ClusterState, now: float
    ) -> bool: ...

    def group_eligible(
        self, preemptor: PendingJob, queue: QueueName, priority: int, state: ClusterState, now: float
    ) -> bool:
        """Could some preemptible attempt of this queue and class be a victim? (an upper bound)"""
        ...

    # ---- wakes: when a blocked job's candidates may grow without any other event ---------------
    # (the core already wakes when the first attempt of a group that `group_eligible` allows
    # leaves its `min_runtime`: these say what that does not see). Each returns None by default:
    # a plugin that defines none of them needs no wake beyond that.

    def service_floor(self, preemptor: PendingJob) -> float | None:
        """The attained service (GPU-seconds) every victim of the preemptor has at least, when the
        plugin takes only jobs above a level (`las`): rankings then read only the attempts that
        may have reached it (`core/served.py`). None: no such floor (every candidate is ranked)."""
        return None

    def protection_end(self, preemptor: PendingJob, state: ClusterState, now: float) -> float | None:
        """When an attempt that `group_eligible` does not allow now (it reads only today's
        candidates, e.g. `tiresias`' levels) leaves its `min_runtime` and would then be a victim:
        the cycle is due then, and the job's reason names the time (None: no such attempt)."""
        return None

    def eligible_from(self, preemptor: PendingJob, state: ClusterState, now: float) -> float | None:
        """The first time after `now` at which the plugin allows the job more victims by time
        alone, other than a protection ending (e.g. `tiresias`' `patience` ends): the cycle is
        due then (None: never). It may read the job beyond its family, but a walk meets a
        family's jobs of one `family_part` in order, so it must not be earlier for a later job."""
        return None

    def fresh_groups(
        self, preemptor: PendingJob, state: ClusterState, now: float
    ) -> tuple[tuple[QueueName, int], ...]:
        """The (queue, class) groups where an attempt that checkpoints could become a victim it is
        not now (a plugin that takes only victims with little work to lose, e.g. `tiresias`'
        `max_lost`): a checkpoint of such an attempt should be followed by a cycle
        (`CycleResult.checkpoint_wakes`; the simulator reads it, a live scheduler runs a cycle
        after every journal entry anyway). Empty: checkpoints change nothing for it."""
        return ()

    def fresh_for(self, preemptor: PendingJob) -> float:
        """How long after its checkpoint an attempt of `fresh_groups` stays such a victim (e.g.
        `tiresias`' `max_lost`): the cycle may come up to that much later, so that the simulator
        serves many checkpoints with one cycle (it runs one half that time after the first)."""
        return 0.0


class VictimOrder(Protocol):
    """In which order a blocked job takes its victims (cheapest first).

    `order_key` must be a total order (end with the job id), so that the victims chosen never
    depend on the order attempts are examined in.
    """

    def order_key(self, victim: RunningAttempt, state: ClusterState, now: float) -> tuple[object, ...]: ...

    def rank(
        self, preemptor: PendingJob, attempts: Iterable[RunningAttempt], state: ClusterState, now: float
    ) -> list[RunningAttempt]:
        """The attempts the filter's `eligible` allows, sorted by `order_key`, in one call (no
        call per attempt: a plugin may compute both together)."""
        ...


class VictimPermit(Protocol):
    """Whether a chosen set of victims may be preempted together (e.g. reclaim summed over it)."""

    def permit(
        self, preemptor: PendingJob, victims: Sequence[RunningAttempt], state: ClusterState, now: float
    ) -> bool: ...


class Victims(VictimFilter, VictimOrder, VictimPermit, Protocol):
    """A preemption policy: its filter, its order and its permit. One object implements the three
    (`rank` fuses the filter with the order, and all three read the same arguments); the core
    takes the narrowest protocol each step needs."""


@dataclass(frozen=True, slots=True)
class Profile:
    """A named policy: which plugins, with which settings (built by `corral.policies`).

    `queue_order` None means one global order of all pending jobs by `job_order` (fifo, sjf,
    las); `head_of_line` stops the cycle at the first job that cannot start (strict FIFO).
    """

    name: str
    job_order: JobOrder
    queue_order: QueueOrder | None
    admits: tuple[Admit, ...] = ()
    victims: Victims | None = None
    head_of_line: bool = False
    backfill: bool = True
    max_reservations: int = 8
    # reservations may rest on the estimated ends of jobs without a time limit (`estimated_holds`):
    # such a reservation holds GPUs at once on a confident estimate, else only for a job that has
    # waited this long (seconds): the longer a job waits, the firmer its hold. None: never
    hold_after: float | None = None
    max_preemption_tries: int = 64  # victim selections per cycle; the rest wait for the next cycle
    max_nominations: int = 16  # preemptions decided per cycle
    usage_half_life: float | None = None
    description: str = ""
    args: dict[str, object] = field(default_factory=dict)

    @property
    def uses_estimates(self) -> bool:
        """Whether it reads run-time estimates (`estimates`): reservations on estimated ends
        (`hold_after`), or an order that says so (a method `reads_estimates()` that returns True,
        e.g. `shortest_estimated`). A simulation learns from its finished jobs only then."""
        if self.hold_after is not None:
            return True
        reads = getattr(self.job_order, "reads_estimates", None)
        return reads is not None and bool(reads())

    @property
    def promote_after(self) -> float | None:
        """Seconds of waiting after which its order promotes a job (`core/aging.py`): what the
        order's method `promote_after()` returns, if it has one (e.g. `tiresias`' `starve`);
        None: it promotes nobody."""
        method = getattr(self.job_order, "promote_after", None)
        after = None if method is None else method()
        return None if after is None else float(after)
