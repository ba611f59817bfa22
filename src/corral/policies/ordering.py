"""Job orders inside a queue: priority then FIFO, plain FIFO, shortest job first, least attained service."""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, field

from corral.core.jobs import PendingJob
from corral.policies.noargs import NoArgs


@dataclass(frozen=True, slots=True)
class PriorityFifo:
    """Priority class first, then submit time, then submission sequence and id."""

    args: NoArgs = field(default_factory=NoArgs)

    def key(self, job: PendingJob) -> tuple[object, ...]:
        s = job.spec
        return (-s.priority, s.submit_time, s.seq, s.id)


@dataclass(frozen=True, slots=True)
class Fifo:
    """Submit time only, priorities ignored: the Helios artifact's FIFO baseline."""

    args: NoArgs = field(default_factory=NoArgs)

    def key(self, job: PendingJob) -> tuple[object, ...]:
        s = job.spec
        return (s.submit_time, s.seq, s.id)


@dataclass(frozen=True, slots=True)
class ShortestFirst:
    """Shortest true duration first: an oracle bound (only a simulator knows true durations)."""

    args: NoArgs = field(default_factory=NoArgs)

    def key(self, job: PendingJob) -> tuple[object, ...]:
        s = job.spec
        duration = job.true_duration if job.true_duration is not None else float("inf")
        return (duration, s.submit_time, s.seq, s.id)


@dataclass(frozen=True, slots=True)
class LeastAttainedArgs:
    thresholds: tuple[float, ...] = (3600.0, 36000.0)

    def __post_init__(self) -> None:
        if list(self.thresholds) != sorted(self.thresholds) or any(t <= 0 for t in self.thresholds):
            raise ValueError("thresholds must be positive and increasing, e.g. [3600, 36000]")


@dataclass(frozen=True, slots=True)
class LeastAttained:
    """Tiresias' discretised least attained service: fewer GPU-seconds received goes first.

    Attained service is bucketed by `thresholds` (GPU-seconds); inside a bucket, FIFO.
    """

    args: LeastAttainedArgs = LeastAttainedArgs()

    def level(self, attained: float) -> int:
        return bisect_right(self.args.thresholds, attained)

    def key(self, job: PendingJob) -> tuple[object, ...]:
        s = job.spec
        return (self.level(job.attained), s.submit_time, s.seq, s.id)
