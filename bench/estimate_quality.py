"""Estimate quality: history's run-time estimates against trivial estimators, on the Philly file
and on a live scheduler's own history.

Run: .venv/bin/python bench/estimate_quality.py [--first N]
Every job of the Philly file, in submit order, is estimated at its submission from the jobs that
had finished by then if each had started when submitted (submit + duration: no scheduling
delay; what a replay learns from depends on its policy, this bounds none of it). Prints the
median absolute error of `corral.core.estimates.Estimator` by the number of past jobs the
estimate drew on, next to the median absolute error of the queue's mean run time so far (the
trivial estimator; Philly's jobs carry no time limit, the other trivial one).

Run: .venv/bin/python bench/estimate_quality.py --live [--jobs 2000] [--nodes 64] [--speed 1000]
[--start '2017-10-03 00:00:00'] [--limits FACTOR] [--json OUT]
The live scheduler's own estimates, as it made them: the setting of bench/shadow_replay.py (a
Philly slice, one queue per virtual cluster, compressed `--speed` times, submitted over HTTP to
a real `corral server` from an empty database, the fleet playing its nodes; no job name, as
Philly has none: the estimator's keys are the queue and the GPU count). Each job's first `start`
event carries the estimate the scheduler queued it with (`estimate`, `estimate_drawn_on`: learned
from the jobs that had finished live by then, DESIGN.md 4.6 extra fields), read back from the
event log. Errors are against the job's trace duration, in trace seconds (compressed seconds x
`--speed`); the queue's mean is that of the run times the live log shows for the queue's jobs
finished before the job's submission. With `--limits F` every job asks for a time limit of F x
its duration rounded up to a whole hour (as users ask), and the limit as submitted (compressed,
in whole seconds) is the third column.
Also printed: the offline measurement above on the same slice, for comparison.
"""

from __future__ import annotations

import argparse
import dataclasses
import heapq
import json
import math
import statistics
import sys
import tempfile
from bisect import bisect_right
from itertools import pairwise
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from tests.fleet.harness import compress, run_live, submissions  # noqa: E402

from corral.core.estimates import Estimator  # noqa: E402
from corral.core.model import JobId, JobSpec, QueueName  # noqa: E402
from corral.sim.loaders.philly import load_philly  # noqa: E402
from corral.sim.trace import TraceJob  # noqa: E402
from shadow_replay import cluster_file, philly_slice  # noqa: E402

BUCKETS = (1, 5, 20, 100, 256)  # drawn-on counts: [1, 5), [5, 20), ..., [256, inf)
Row = tuple[float, ...]  # absolute errors: estimate, queue mean[, time limit]


def offline(jobs: list[TraceJob]) -> tuple[dict[int, list[Row]], int]:
    """Errors by drawn-on bucket of the estimates made at each submission, no scheduling delay."""
    est = Estimator()
    ends: list[tuple[float, int, JobSpec, float]] = []
    sums: dict[str, tuple[float, int]] = {}
    rows: dict[int, list[Row]] = {}
    none = 0
    for n, t in enumerate(sorted(jobs, key=lambda t: t.submit_time)):
        while ends and ends[0][0] <= t.submit_time:
            _, _, spec, seconds = heapq.heappop(ends)
            est.observe(spec, seconds)
            total, count = sums.get(spec.queue, (0.0, 0))
            sums[spec.queue] = (total + seconds, count + 1)
        spec = JobSpec(
            id=JobId(t.job_id),
            queue=QueueName(t.queue or "q"),
            replicas=t.replicas,
            gpus_per_replica=t.gpus_per_replica,
        )
        found = est.estimate(spec)
        total, count = sums.get(spec.queue, (0.0, 0))
        if found is None or count == 0:
            none += 1
        else:
            errors: Row = (abs(found.seconds - t.duration), abs(total / count - t.duration))
            if t.time_limit is not None:
                errors += (abs(t.time_limit - t.duration),)
            rows.setdefault(bisect_right(BUCKETS, found.drawn_on), []).append(errors)
        heapq.heappush(ends, (t.submit_time + t.duration, n, spec, t.duration))
    return rows, none


def table(rows: dict[int, list[Row]], none: int) -> list[dict[str, Any]]:
    """One line per drawn-on bucket and one for all: each estimator's median absolute error."""
    labels = ["0"] + [f"{lo}-{hi - 1}" for lo, hi in pairwise(BUCKETS)] + [f"{BUCKETS[-1]}+"]
    names = ("estimate", "queue_mean", "time_limit")

    def line(label: str, errors: list[Row]) -> dict[str, Any]:
        out: dict[str, Any] = {"drawn_on": label, "jobs": len(errors)}
        for i, name in enumerate(names[: len(errors[0])]):
            out[f"{name}_median_abs_error_s"] = round(statistics.median(e[i] for e in errors), 1)
        return out

    out = [line(labels[bucket], rows[bucket]) for bucket in sorted(rows)]
    everything = [e for errors in rows.values() for e in errors]
    if everything:
        out.append({**line("all", everything), "no_history_yet": none})
    return out


# ---- the live scheduler's own estimates --------------------------------------------------
def with_limits(jobs: list[TraceJob], factor: float) -> list[TraceJob]:
    """Each job with a time limit of `factor` x its duration, rounded up to a whole hour."""
    return [dataclasses.replace(j, time_limit=3600.0 * math.ceil(factor * j.duration / 3600.0)) for j in jobs]


def live(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    jobs = philly_slice(args.start, args.jobs, "vc")
    if args.limits:
        jobs = with_limits(jobs, args.limits)
    queues = sorted({j.queue or "qone" for j in jobs})
    cluster = tmp / "cluster.yaml"
    cluster_file(cluster, args.nodes, [q[1:] for q in queues])
    posts = submissions(compress(jobs, args.speed), "qone")
    for _, _, spec in posts:
        del spec["name"]  # Philly's jobs have no name (the harness names them after their trace id)
    run = run_live(cluster, posts, tmp / "live", policy=args.policy)
    rows, none, overheads = measured(run.events, run.names, {j.job_id: j for j in jobs}, args.speed)
    return {
        "started_all": run.started_all,
        "refused": len(run.submitted.refused),
        "live": table(rows, none),
        "offline_same_slice": table(*offline(jobs)),
        # live run time less the trace's duration, trace seconds (latencies x speed)
        "median_overhead_s": round(statistics.median(overheads), 1) if overheads else None,
    }


def measured(
    events: list[dict[str, Any]], names: dict[str, str], jobs: dict[str, TraceJob], speed: float
) -> tuple[dict[int, list[Row]], int, list[float]]:
    """Errors by drawn-on bucket of the estimates on the live log's first starts, the number of
    jobs started without one, and each finished job's live run time less its duration."""
    submitted: dict[str, float] = {}
    limits: dict[str, float] = {}  # as submitted (compressed, whole seconds), trace seconds
    started: dict[str, float] = {}
    ran: list[tuple[float, str, float]] = []  # (finished at, queue, run time), trace seconds
    estimates: dict[str, dict[str, Any]] = {}
    overheads: list[float] = []
    for e in events:
        kind, job = e["event"], str(e.get("job"))
        if kind == "submit":
            submitted[job] = float(e["t"])
            if e.get("time_limit") is not None:
                limits[job] = float(e["time_limit"]) * speed
        elif kind == "start":
            started[job] = float(e["t"])
            if int(e["attempt"]) == 1:
                estimates[job] = e
        elif kind == "finish" and job in started and job in names:
            t = jobs[names[job]]
            seconds = (float(e["t"]) - started[job]) * speed
            ran.append((float(e["t"]), t.queue or "qone", seconds))
            overheads.append(seconds - t.duration)
    ran.sort()
    rows: dict[int, list[Row]] = {}
    none = 0
    for job, start in estimates.items():
        t = jobs[names[job]]
        before = [
            r for at, q, r in ran[: bisect_right(ran, (submitted[job], "\uffff", math.inf))] if q == t.queue
        ]
        if "estimate" not in start or not before:
            none += 1
            continue
        errors: Row = (
            abs(float(start["estimate"]) * speed - t.duration),
            abs(statistics.fmean(before) - t.duration),
        )
        if job in limits:
            errors += (abs(limits[job] - t.duration),)
        rows.setdefault(bisect_right(BUCKETS, int(start["estimate_drawn_on"])), []).append(errors)
    return rows, none, overheads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--first", type=int)
    parser.add_argument("--live", action="store_true")
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--start", default="2017-10-03 00:00:00")
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--speed", type=float, default=1000.0)
    parser.add_argument("--policy", default="default")
    parser.add_argument("--limits", type=float, help="time limits of FACTOR x duration, whole hours")
    parser.add_argument("--json", metavar="OUT")
    args = parser.parse_args()
    if not args.live:
        for row in table(*offline(load_philly()[: args.first])):
            print(json.dumps(row))
        return
    out = live(args, Path(tempfile.mkdtemp(prefix="corral-estimates-")))
    print(f"{args.jobs} Philly jobs from {args.start}, {args.nodes} nodes x 8 GPUs, clock x{args.speed:g}")
    print(f"every job started: {out['started_all']}; refused: {out['refused']}; median overhead: "
          f"{out['median_overhead_s']} s")  # fmt: skip
    for title, key in (("live", "live"), ("offline, same slice", "offline_same_slice")):
        print(title)
        for row in out[key]:
            print(json.dumps(row))
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), **out}, indent=2))


if __name__ == "__main__":
    main()
