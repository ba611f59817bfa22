"""Estimate quality: history's run-time estimates on Philly against trivial estimators.

Run: .venv/bin/python bench/estimate_quality.py [--first N]
Every job of the Philly file, in submit order, is estimated at its submission from the jobs that
had finished by then if each had started when submitted (submit + duration: no scheduling
delay; what a replay learns from depends on its policy, this bounds none of it). Prints the
median absolute error of `corral.core.estimates.Estimator` by the number of past jobs the
estimate drew on, next to the median absolute error of the queue's mean run time so far (the
trivial estimator; Philly's jobs carry no time limit, the other trivial one).
"""

from __future__ import annotations

import argparse
import heapq
import json
import statistics
from bisect import bisect_right
from itertools import pairwise
from typing import Any

from corral.core.estimates import Estimator
from corral.core.model import JobId, JobSpec
from corral.sim.loaders.philly import load_philly

BUCKETS = (1, 5, 20, 100, 256)  # drawn-on counts: [1, 5), [5, 20), ..., [256, inf)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--first", type=int)
    args = parser.parse_args()
    jobs = sorted(load_philly()[: args.first], key=lambda t: t.submit_time)
    est = Estimator()
    ends: list[tuple[float, int, JobSpec, float]] = []
    sums: dict[str, tuple[float, int]] = {}
    rows: dict[int, list[tuple[float, float]]] = {}
    none = 0
    for n, t in enumerate(jobs):
        while ends and ends[0][0] <= t.submit_time:
            _, _, spec, seconds = heapq.heappop(ends)
            est.observe(spec, seconds)
            total, count = sums.get(spec.queue, (0.0, 0))
            sums[spec.queue] = (total + seconds, count + 1)
        spec = JobSpec(
            id=JobId(t.job_id), queue=t.queue or "q", replicas=t.replicas, gpus_per_replica=t.gpus_per_replica
        )
        found = est.estimate(spec)
        total, count = sums.get(spec.queue, (0.0, 0))
        if found is None or count == 0:
            none += 1
        else:
            bucket = bisect_right(BUCKETS, found.drawn_on)
            rows.setdefault(bucket, []).append(
                (abs(found.seconds - t.duration), abs(total / count - t.duration))
            )
        heapq.heappush(ends, (t.submit_time + t.duration, n, spec, t.duration))
    table: list[dict[str, Any]] = []
    labels = ["0"] + [f"{lo}-{hi - 1}" for lo, hi in pairwise(BUCKETS)] + [f"{BUCKETS[-1]}+"]
    for bucket in sorted(rows):
        errors = rows[bucket]
        table.append(
            {
                "drawn_on": labels[bucket],
                "jobs": len(errors),
                "estimate_median_abs_error_s": statistics.median(e for e, _ in errors),
                "queue_mean_median_abs_error_s": statistics.median(q for _, q in errors),
            }
        )
    everything = [e for errors in rows.values() for e in errors]
    table.append(
        {
            "drawn_on": "all",
            "jobs": len(everything),
            "estimate_median_abs_error_s": statistics.median(e for e, _ in everything),
            "queue_mean_median_abs_error_s": statistics.median(q for _, q in everything),
            "no_history_yet": none,
        }
    )
    for row in table:
        print(json.dumps(row))


if __name__ == "__main__":
    main()
