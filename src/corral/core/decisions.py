"""What a cycle decides, as data: starts, preemptions, nominations, reservations, rejections, reasons.

Adapters carry decisions out: the simulator advances virtual time, the control plane commits
them and the agents act. Placements here use node names and GPU indices (DESIGN.md 3).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from dataclasses import dataclass, field
from itertools import repeat
from operator import itemgetter
from typing import TYPE_CHECKING, Final, cast, final

from corral.core.model import INFINITY, JobId, NodeName, Placement

if TYPE_CHECKING:
    from corral.core.quiet import Quiet


class Why(enum.Enum):
    """Reason codes for a job that did not start; each Reason also carries a sentence for people."""

    HELD = "held"
    BACKOFF = "backoff"
    LIMIT = "limit"
    QUOTA = "quota"
    COHORT = "cohort"
    CAPACITY = "capacity"
    TOPOLOGY = "topology"
    NOMINATED = "nominated"
    HEAD_OF_LINE = "head_of_line"
    RESERVED = "reserved"
    BEHIND_RESERVATION = "behind_reservation"  # it would fit, but would delay another job's reservation
    PAUSED = "paused"
    NEVER_FITS = "never_fits"


@final
class Reason:
    """Why a job waits: a code for programs, a sentence for people, and the time the sentence
    names (`at`: when it may start, a reservation begins, a protection ends), if it names one.

    Immutable, compared and hashed by value. Written out rather than a frozen dataclass: the
    compiled core builds one in about 20 ns instead of 1 us (a dataclass with slots is a plain
    Python class whose generated `__init__` runs interpreted), and compares and hashes it without
    `Why`'s interpreted `Enum.__hash__` (a cycle on a long backlog builds and compares many)."""

    __slots__ = ("at", "code", "message")

    def __init__(self, code: Why, message: str, at: float | None = None) -> None:
        self.code: Final = code
        self.message: Final = message
        self.at: Final = at

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Reason):
            return NotImplemented
        return self.code is other.code and self.message == other.message and self.at == other.at

    def __hash__(self) -> int:
        return hash((self.message, self.at))  # (equal reasons have equal sentences)

    def __repr__(self) -> str:
        return f"Reason(code={self.code!r}, message={self.message!r}, at={self.at!r})"

    def __reduce__(self) -> tuple[type[Reason], tuple[Why, str, float | None]]:
        return (Reason, (self.code, self.message, self.at))

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True, slots=True)
class Start:
    job: JobId
    attempt: int
    placement: Placement
    backfilled: bool = False


@dataclass(frozen=True, slots=True)
class Preempt:
    """Tell a running attempt to checkpoint and stop by `deadline`, to free GPUs for `by`."""

    job: JobId
    attempt: int
    by: JobId
    deadline: float
    reason: str


@dataclass(frozen=True, slots=True)
class Nominate:
    """`job` waits for exactly these GPUs, which its victims are freeing."""

    job: JobId
    placement: Placement
    victims: tuple[JobId, ...]


@dataclass(frozen=True, slots=True)
class Reserve:
    """Concrete capacity (node, GPU count) held for `job` from `start` on."""

    job: JobId
    start: float
    capacity: tuple[tuple[NodeName, int], ...]


@dataclass(frozen=True, slots=True)
class Reject:
    job: JobId
    reason: str


class Reasons(MutableMapping[JobId, Reason]):
    """The reason of every job a cycle looked at and did not start, by job id.

    A cycle adds whole runs of jobs that wait for one shared reason (`add_run`), or for a reason
    that a function gives each (`add_lazy_run`), without a loop over them; the runs are unfolded
    into a dict the first time anyone reads the mapping, so an adapter that never reads it (the
    simulator) never pays for it. A job in a run never gets another reason in the same cycle.
    """

    __slots__ = ("_lazy", "_one", "_runs")

    def __init__(self, reasons: Mapping[JobId, Reason] | None = None) -> None:
        self._one: dict[JobId, Reason] = dict(reasons or {})
        self._runs: list[tuple[list[tuple[object, ...]], Reason]] = []
        self._lazy: list[tuple[list[tuple[object, ...]], Callable[[JobId], Reason]]] = []

    def add_run(self, keys: list[tuple[object, ...]], reason: Reason) -> None:
        """Every job of `keys` (tuples whose last item is the job id) waits for `reason`."""
        self._runs.append((keys, reason))

    def add_lazy_run(self, keys: list[tuple[object, ...]], reason_of: Callable[[JobId], Reason]) -> None:
        """Every job of `keys` waits for `reason_of(its id)`, called when the reasons are read."""
        self._lazy.append((keys, reason_of))

    def runs(self) -> tuple[list[tuple[list[tuple[object, ...]], Reason]], dict[JobId, Reason]]:
        """The reasons as runs, in the order the mapping lists them: the runs of jobs that share
        one reason (a lazy run resolved now and cut where its reason changes), then the jobs
        given a reason of their own (not unfolded: a reader that compares runs, the server's
        reason book, costs what changes rather than what waits). Once the mapping has been
        read, every reason is in the second part."""
        for keys, reason_of in self._lazy:
            self._runs.extend(_cut(keys, reason_of))
        self._lazy.clear()
        return self._runs, self._one

    def drop(self, job: JobId) -> None:
        """Forget a job's own reason (it started); never one given by a run."""
        self._one.pop(job, None)

    def _unfold(self) -> dict[JobId, Reason]:
        if self._runs or self._lazy:
            merged: dict[JobId, Reason] = {}
            for keys, reason in self._runs:
                merged.update(zip(map(_job_of, keys), repeat(reason)))
            for keys, reason_of in self._lazy:
                for key in keys:
                    job = cast(JobId, key[-1])
                    merged[job] = reason_of(job)
            merged.update(self._one)
            self._one = merged
            self._runs.clear()
            self._lazy.clear()
        return self._one

    def __getitem__(self, job: JobId) -> Reason:
        return self._unfold()[job]

    def __setitem__(self, job: JobId, reason: Reason) -> None:
        self._one[job] = reason

    def __delitem__(self, job: JobId) -> None:
        del self._unfold()[job]

    def __iter__(self) -> Iterator[JobId]:
        return iter(self._unfold())

    def __len__(self) -> int:
        return len(self._unfold())

    def __contains__(self, job: object) -> bool:
        return job in self._unfold()

    def __repr__(self) -> str:
        return f"Reasons({self._unfold()!r})"


_job_of = itemgetter(-1)


def _cut(
    keys: list[tuple[object, ...]], reason_of: Callable[[JobId], Reason]
) -> list[tuple[list[tuple[object, ...]], Reason]]:
    """A lazy run as runs of one reason each, in its order."""
    out: list[tuple[list[tuple[object, ...]], Reason]] = []
    start = 0
    last: Reason | None = None
    for i, key in enumerate(keys):
        reason = reason_of(cast(JobId, key[-1]))
        if last is None:
            last = reason
        elif reason is not last and reason != last:
            out.append((keys[start:i], last))
            start, last = i, reason
    if last is not None:
        out.append((keys[start:], last))
    return out


@dataclass(slots=True, init=False)
class CycleResult:
    """Everything one cycle decided, and a reason for every pending job it looked at. (`__init__`
    written out, as dataclasses would make it: the compiled core runs it natively; two per cycle.)"""

    now: float
    starts: list[Start] = field(default_factory=list)
    preemptions: list[Preempt] = field(default_factory=list)
    nominations: list[Nominate] = field(default_factory=list)
    reservations: list[Reserve] = field(default_factory=list)
    rejections: list[Reject] = field(default_factory=list)
    reasons: Reasons = field(default_factory=Reasons)
    others: Reason | None = None  # the reason of every pending job the cycle did not reach (strict FIFO)
    considered: int = 0
    # the earliest time after `now` at which an input of these decisions changes by itself (a
    # backoff or a victim's min_runtime ends, a reservation begins): the next cycle is due then
    # even if nothing else happens; infinity when nothing waits for a time
    next_wake: float = INFINITY
    # (queue, class) groups where a running attempt that checkpoints may become a victim of a job
    # this cycle left waiting (`VictimFilter.fresh_groups`): a checkpoint there calls for a cycle
    # within the seconds given (`VictimFilter.fresh_for`: it stays such a victim that long)
    checkpoint_wakes: dict[tuple[str, int], float] = field(default_factory=dict)
    # what this cycle leaves for a later one after arrivals alone (`core/quiet.py`; None: nothing)
    quiet: Quiet | None = None

    def __init__(
        self,
        now: float,
        starts: list[Start] | None = None,
        preemptions: list[Preempt] | None = None,
        nominations: list[Nominate] | None = None,
        reservations: list[Reserve] | None = None,
        rejections: list[Reject] | None = None,
        reasons: Reasons | None = None,
        others: Reason | None = None,
        considered: int = 0,
        next_wake: float = INFINITY,
        checkpoint_wakes: dict[tuple[str, int], float] | None = None,
        quiet: Quiet | None = None,
    ) -> None:
        self.now = now
        self.starts = [] if starts is None else starts
        self.preemptions = [] if preemptions is None else preemptions
        self.nominations = [] if nominations is None else nominations
        self.reservations = [] if reservations is None else reservations
        self.rejections = [] if rejections is None else rejections
        self.reasons = Reasons() if reasons is None else reasons
        self.others = others
        self.considered = considered
        self.next_wake = next_wake
        self.checkpoint_wakes = {} if checkpoint_wakes is None else checkpoint_wakes
        self.quiet = quiet

    def wake_at(self, t: float) -> None:
        """Something this cycle decided changes at `t` (ignored unless after `now`)."""
        if self.now < t < self.next_wake:
            self.next_wake = t

    def reason_of(self, job: JobId) -> Reason | None:
        """Why a pending job did not start in this cycle."""
        return self.reasons.get(job, self.others)
