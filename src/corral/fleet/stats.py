"""Latencies of the fleet's requests, kept per kind with the time each was sent, so that a
benchmark can take percentiles over a window (while a trace ran) after the run."""

from __future__ import annotations

import math
from array import array
from collections import Counter
from typing import Any


def percentile(values: list[float], p: float) -> float:
    """Nearest rank: p99 of 200 samples is the 198th smallest; NaN for no samples."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    rank = max(1, math.ceil(p * len(ordered) / 100))
    return ordered[rank - 1]


class Recorder:
    """(sent, seconds) per request kind, in arrays (10,000 agents over minutes: millions of samples)."""

    def __init__(self) -> None:
        self.sent: dict[str, array[float]] = {}
        self.took: dict[str, array[float]] = {}
        self.errors: Counter[str] = Counter()  # kind and status (or `wire`) -> count

    def add(self, kind: str, sent: float, took: float) -> None:
        if kind not in self.sent:
            self.sent[kind], self.took[kind] = array("d"), array("d")
        self.sent[kind].append(sent)
        self.took[kind].append(took)

    def error(self, kind: str, what: str) -> None:
        self.errors[f"{kind} {what}"] += 1

    def window(self, kind: str, start: float = -math.inf, end: float = math.inf) -> list[float]:
        sent, took = self.sent.get(kind, array("d")), self.took.get(kind, array("d"))
        return [t for s, t in zip(sent, took, strict=True) if start <= s < end]

    def summary(self, start: float = -math.inf, end: float = math.inf) -> dict[str, Any]:
        """Per kind: count, rate, p50 / p99 / max in milliseconds, over requests sent in [start, end)."""
        out: dict[str, Any] = {}
        span = end - start if math.isfinite(end - start) else None
        for kind in sorted(self.sent):
            values = self.window(kind, start, end)
            if not values:
                continue
            out[kind] = {
                "count": len(values),
                "per_s": len(values) / span if span else None,
                "p50_ms": 1000 * percentile(values, 50),
                "p99_ms": 1000 * percentile(values, 99),
                "max_ms": 1000 * max(values),
            }
        out["errors"] = dict(self.errors)
        return out

    def dump(self) -> dict[str, Any]:
        """Every sample, for another process to take windows from (`load`)."""
        return {
            "sent": {k: v.tolist() for k, v in self.sent.items()},
            "took": {k: v.tolist() for k, v in self.took.items()},
            "errors": dict(self.errors),
        }

    @classmethod
    def load(cls, data: dict[str, Any]) -> Recorder:
        out = cls()
        for kind, sent in data["sent"].items():
            out.sent[kind] = array("d", sent)
            out.took[kind] = array("d", data["took"][kind])
        out.errors.update(data.get("errors", {}))
        return out
