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


@dataclass(frozen=True, slots=True)
class ShortestEstimatedArgs:
    weight: float = 1.0
    cap: float = 86_400.0

    def __post_init__(self) -> None:
        if not self.weight >= 0:
            raise ValueError("weight must be >= 0 (0: plain priority then FIFO)")
        if not self.cap >= 0:
            raise ValueError("cap must be >= 0 seconds (the most estimated run time that delays a job)")


@dataclass(frozen=True, slots=True)
class ShortestEstimated:
    """Priority class first, then shortest estimated remaining run time, aged by waiting.

    A job is ordered as if it had been submitted `weight` x its estimated remaining run time
    (history's estimate less the time its earlier attempts ran; `corral.core.estimates`), up to
    `cap` seconds, after it was: shorter jobs go first, yet a job is passed only by jobs
    submitted less than `weight` x `cap` after it, so none starves, and the longest jobs (the
    tail) wait at most that much longer than in FIFO order. Without history every estimate is
    0: priority then FIFO.
    """

    args: ShortestEstimatedArgs = ShortestEstimatedArgs()

    def reads_estimates(self) -> bool:
        """It orders by `PendingJob.estimate` (`Profile.uses_estimates`)."""
        return True

    def key(self, job: PendingJob) -> tuple[object, ...]:
        s = job.spec
        estimate = job.estimate
        remaining = 0.0
        if estimate is not None:
            remaining = max(0.0, estimate.seconds - (job.attained / s.gpus if s.gpus else 0.0))
        delay = self.args.weight * min(remaining, self.args.cap)
        return (-s.priority, s.submit_time + delay, s.seq, s.id)
