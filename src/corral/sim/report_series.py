"""The bounded time series a report plots: a sampler whose width doubles to keep at most SAMPLES points."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

SAMPLES = 2000  # at most this many sampled points (plus the final state)
CDF_POINTS = 1001  # JCT quantiles kept for the report's CDF: 0%, 0.1%, ..., 100%


@dataclass(frozen=True, slots=True)
class Series:
    """What the report plots: series over seconds since the first event, and the JCT quantiles.

    Entry i of each series is the average over [t[i], t[i+1]); the last entry is the state at t[-1].
    """

    t: list[float]
    pending: list[float]  # jobs waiting
    utilisation: list[float]  # allocated GPUs / the cluster's GPUs
    queue_gpus: dict[str, list[float]]  # GPUs allocated to each queue that had jobs
    jct_quantiles: list[float]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Series:
        return cls(**data)


@dataclass(frozen=True, slots=True)
class Sample:
    """Running totals at one time, from which the averages between two samples follow."""

    t: float  # seconds since the first event
    pending_area: float  # job-seconds spent pending so far
    queue_area: list[float]  # GPU-seconds allocated so far, per queue in the order queues appeared
    gpus: int  # the cluster's GPUs now


@dataclass(frozen=True, slots=True)
class State:
    """The state after the last event: it closes each series."""

    pending: int
    queue_gpus: list[int]
    gpus: int


class Sampler:
    """Keeps the first sample in each bucket of `step` seconds, doubling `step` when full.

    After a doubling the points kept are exactly those a sampler started with the doubled width
    would have kept, so the result does not depend on when the thinning happened; and since samples
    are running totals, the averages between kept points stay exact.
    """

    def __init__(self, capacity: int = SAMPLES, step: float = 1.0) -> None:
        self.capacity = capacity
        self.step = step
        self.next_at = math.inf  # absolute time from which the next sample is due
        self.t0 = 0.0
        self.samples: list[Sample] = []

    def begin(self, t0: float) -> None:
        self.t0 = self.next_at = t0

    def add(self, sample: Sample) -> None:
        """Keep `sample` (taken when the time `t0 + sample.t` reached `next_at`)."""
        self.samples.append(sample)
        if len(self.samples) > self.capacity:
            self._thin()
        self.next_at = self.t0 + (math.floor(sample.t / self.step) + 1) * self.step

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
        self, final: Sample, now: State, queues: Sequence[tuple[int, str]], jcts: Sequence[float]
    ) -> Series:
        """Averages over each interval between samples (the last being `final`), then `now`."""
        rows = list(self.samples)
        if not rows or rows[-1].t < final.t:
            rows.append(final)
        pending: list[float] = []
        utilisation: list[float] = []
        by_queue: dict[str, list[float]] = {name: [] for _, name in queues}
        for a, b in itertools.pairwise(rows):
            span = b.t - a.t
            used = [
                (q - (a.queue_area[i] if i < len(a.queue_area) else 0.0)) / span
                for i, q in enumerate(b.queue_area)
            ]
            pending.append((b.pending_area - a.pending_area) / span)
            utilisation.append(sum(used) / b.gpus if b.gpus else 0.0)
            for i, name in queues:
                by_queue[name].append(used[i] if i < len(used) else 0.0)
        pending.append(now.pending)
        utilisation.append(sum(now.queue_gpus) / now.gpus if now.gpus else 0.0)
        for i, name in queues:
            by_queue[name].append(now.queue_gpus[i])
        return Series([r.t for r in rows], pending, utilisation, by_queue, jct_quantiles(jcts))


def jct_quantiles(jcts: Sequence[float]) -> list[float]:
    """CDF_POINTS evenly spaced quantiles of the JCTs (numpy's linear interpolation); [] when none."""
    if not len(jcts):
        return []
    values = np.array(jcts, dtype=np.float64)
    return [float(v) for v in np.quantile(values, np.linspace(0.0, 1.0, CDF_POINTS))]
