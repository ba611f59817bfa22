"""What a cycle decides, as data: starts, preemptions, nominations, reservations, rejections, reasons.

Adapters carry decisions out: the simulator advances virtual time, the control plane commits
them and the agents act. Placements here use node names and GPU indices (DESIGN.md 3).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from corral.core.model import JobId, NodeName, Placement


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
    NEVER_FITS = "never_fits"


@dataclass(frozen=True, slots=True)
class Reason:
    """Why a job waits: a code for programs and a sentence for people."""

    code: Why
    message: str

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


@dataclass(slots=True)
class CycleResult:
    """Everything one cycle decided, and a reason for every pending job it looked at."""

    now: float
    starts: list[Start] = field(default_factory=list)
    preemptions: list[Preempt] = field(default_factory=list)
    nominations: list[Nominate] = field(default_factory=list)
    reservations: list[Reserve] = field(default_factory=list)
    rejections: list[Reject] = field(default_factory=list)
    reasons: dict[JobId, Reason] = field(default_factory=dict)
    others: Reason | None = None  # the reason of every pending job the cycle did not reach (strict FIFO)
    considered: int = 0

    def reason_of(self, job: JobId) -> Reason | None:
        """Why a pending job did not start in this cycle."""
        return self.reasons.get(job, self.others)
