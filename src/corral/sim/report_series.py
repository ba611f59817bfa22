"""The bounded time series a report plots: a sampler whose width doubles to keep at most SAMPLES points."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

SAMPLES = 2000  # at most this many sampled points (plus the final state)
CDF_POINTS = 1001  # JCT quantiles kept for the report's CDF: 0%, 0.1%, ..., 100%


@dataclass(frozen=True, slots=True)
class Series:
    """What the report plots: series over seconds since the first event, and the JCT quantiles."""

    t: list[float]
    pending: list[int]
    utilisation: list[float]
    queue_gpus: dict[str, list[int]]
    jct_quantiles: list[float]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Series:
        return cls(**data)


@dataclass(frozen=True, slots=True)
class Sample:
    """The settled state after every event at one time."""

    t: float  # seconds since the first event
    pending: int
    utilisation: float
    queue_gpus: list[int]  # allocated GPUs per queue, in the order queues appeared


class Sampler:
    """Keeps the first settled state in each bucket of `step` seconds, doubling `step` when full.

    After a doubling the points kept are exactly those a sampler started with the doubled width
    would have kept, so the result does not depend on when the thinning happened.
    """

    def __init__(self, capacity: int = SAMPLES, step: float = 1.0) -> None:
        self.capacity = capacity
        self.step = step
        self.next_at = math.inf  # absolute time from which the next sample is due
        self.t0 = 0.0
        self.samples: list[Sample] = []

    def begin(self, t0: float) -> None:
        self.t0 = self.next_at = t0

    def add(self, t: float, pending: int, utilisation: float, queue_gpus: list[int]) -> None:
        """Record the state settled at absolute time `t` (call when `t >= next_at`)."""
        rel = t - self.t0
        self.samples.append(Sample(rel, pending, utilisation, list(queue_gpus)))
        if len(self.samples) > self.capacity:
            self._thin()
        self.next_at = self.t0 + (math.floor(rel / self.step) + 1) * self.step

    def _thin(self) -> None:
        self.step *= 2
        kept, last = [], -1
        for s in self.samples:
            bucket = math.floor(s.t / self.step)
            if bucket > last:
                kept.append(s)
                last = bucket
        self.samples = kept

    def series(
        self, final: Sample | None, queues: Sequence[tuple[int, str]], jcts: Sequence[float]
    ) -> Series:
        """The samples, then `final` (the state now) when later; per-queue columns for `queues`."""
        rows = list(self.samples)
        if final is not None and (not rows or rows[-1].t < final.t):
            rows.append(final)
        by_queue = {
            name: [r.queue_gpus[i] if i < len(r.queue_gpus) else 0 for r in rows] for i, name in queues
        }
        return Series(
            t=[r.t for r in rows],
            pending=[r.pending for r in rows],
            utilisation=[r.utilisation for r in rows],
            queue_gpus=by_queue,
            jct_quantiles=jct_quantiles(jcts),
        )


def jct_quantiles(jcts: Sequence[float]) -> list[float]:
    """CDF_POINTS evenly spaced quantiles of the JCTs (numpy's linear interpolation); [] when none."""
    if not len(jcts):
        return []
    values = np.array(jcts, dtype=np.float64)
    return [float(v) for v in np.quantile(values, np.linspace(0.0, 1.0, CDF_POINTS))]
