"""The end-of-run figures of `metrics.Measures`: distributions, per-queue shares, Jain's index
(DESIGN.md 6.7; what each means: docs/simulator-metrics.md)."""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

__all__ = ["QueueTotals", "distribution", "jain", "queue_summary"]


class QueueTotals(NamedTuple):
    """What a run's queues were: names, fair-share weights, quotas, jobs submitted (by index)."""

    names: Sequence[str]
    weight: Sequence[float]
    quota: Sequence[int]
    submitted: Sequence[int]


def queue_summary(
    queues: QueueTotals, seconds: Sequence[float], below: Sequence[float], makespan: float
) -> dict[str, dict[str, Any]]:
    """Per queue: GPU-hours and share of them (`seconds`: GPU-seconds allocated), the weight's and
    the quota's share among the queues that had jobs, and time spent below quota with jobs
    waiting (`below`, seconds)."""
    total = sum(seconds)
    demand = [i for i, n in enumerate(queues.submitted) if n]
    weights = sum(queues.weight[i] for i in demand)
    quotas = sum(queues.quota[i] for i in demand)
    out = {}
    for i, name in enumerate(queues.names):
        has_demand = queues.submitted[i] > 0
        out[name] = {
            "weight": queues.weight[i],
            "quota": queues.quota[i],
            "submitted": queues.submitted[i],
            "gpu_hours": seconds[i] / 3600.0,
            "share": seconds[i] / total if total else 0.0,
            "weight_share": queues.weight[i] / weights if has_demand and weights else 0.0,
            "quota_share": queues.quota[i] / quotas if has_demand and quotas else 0.0,
            "below_quota_seconds": below[i],
            "below_quota_fraction": below[i] / makespan if makespan else 0.0,
        }
    return out


def distribution(values: array[float], quantiles: bool = True) -> dict[str, float | int | None]:
    """Count, mean, then median, p95, p99 (numpy's linear interpolation between ranks), or max."""
    keys = ("median", "p95", "p99") if quantiles else ("max",)
    if not values:
        return dict.fromkeys(("mean", *keys)) | {"count": 0}
    a = np.array(values, dtype=np.float64)
    found = np.percentile(a, [50.0, 95.0, 99.0]).tolist() if quantiles else [float(a.max())]
    return {"count": len(a), "mean": float(a.mean()), **dict(zip(keys, found, strict=True))}


def jain(queues: dict[str, dict[str, Any]]) -> float | None:
    """Jain's index over weight-normalised GPU-hours of the queues that had jobs (and a weight)."""
    xs = [q["gpu_hours"] / q["weight"] for q in queues.values() if q["submitted"] and q["weight"] > 0]
    squares = sum(x * x for x in xs)
    return sum(xs) ** 2 / (len(xs) * squares) if squares else None
