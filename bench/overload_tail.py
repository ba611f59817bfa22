"""Where the tail and the longest waits come from on Philly as one shared cluster (issue 16).

Run: .venv/bin/python bench/overload_tail.py [--fraction 0.25] [--policy default] [--arg P.K=V]
     [--hold-after S] [--top 15]
Replays the setting of `bench/sim_quality.py` once and prints, from the event log:
- preemptions by the victim's GPUs and by the kind of preemptor (another queue: reclaim; the
  same queue: priority), with the GPU-hours lost;
- the jobs whose JCT is at or above the run's p99: how many were preempted, and their JCT split
  into the wait before their first start, the time lost to preemption and the rest;
- the `--top` longest waits for a first start: job, queue, GPUs, submit time, wait, its queue's
  quota, the GPUs its queue held when it started, and how much of the wait its queue spent
  below its quota (the rest it waited for GPUs beyond its queue's guarantee).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from corral.policies.registry import load_policy, parse_plugin_args
from corral.sim.engine import SimOptions, Simulation
from corral.sim.eventlog import EventLog
from corral.sim.loaders.philly import load_philly, load_vc_nodes
from philly_setup import shared_cluster

BUCKETS = ((1, 1), (2, 4), (5, 8), (9, 16), (17, 10**9))


@dataclasses.dataclass
class Job:
    queue: str
    gpus: int
    submit: float
    duration: float = 0.0  # its run time in the trace
    first_start: float | None = None
    finish: float | None = None
    preempted: int = 0
    lost: float = 0.0  # seconds of work lost to preemption


class Tail:
    """Collects per-job times from the event log."""

    def __init__(self, quotas: dict[str, int]) -> None:
        self.quotas = quotas
        self.jobs: dict[str, Job] = {}
        self.running: dict[str, float] = {}  # job -> start of its attempt
        self.by: dict[str, str] = {}  # victim -> preemptor, from `preempting`
        self.held: dict[str, int] = defaultdict(int)  # queue -> GPUs running
        self.held_at_start: dict[str, int] = {}
        # per queue: seconds so far during which it held less than its quota, and when last counted
        self.below: dict[str, float] = defaultdict(float)
        self.counted: dict[str, float] = defaultdict(float)
        self.below_at_submit: dict[str, float] = {}
        self.below_waiting: dict[str, float] = {}  # job -> seconds of its first wait spent below quota
        self.preempts: dict[tuple[str, int], list[float]] = defaultdict(lambda: [0, 0.0])

    def _count(self, queue: str, t: float) -> None:
        if self.held[queue] < self.quotas.get(queue, 0):
            self.below[queue] += t - self.counted[queue]
        self.counted[queue] = t

    def feed(self, event: dict[str, Any]) -> None:
        kind, name = event["event"], event.get("job", "")
        if kind == "submit":
            gpus = event["replicas"] * event["gpus_per_replica"]
            self.jobs[name] = Job(event["queue"], gpus, event["t"], float(event.get("duration") or 0.0))
            self._count(event["queue"], event["t"])
            self.below_at_submit[name] = self.below[event["queue"]]
            return
        job = self.jobs.get(name)
        if job is None:
            return
        self._count(job.queue, event["t"])
        if kind == "start":
            if job.first_start is None:
                job.first_start = event["t"]
                self.held_at_start[name] = self.held[job.queue]
                self.below_waiting[name] = self.below[job.queue] - self.below_at_submit[name]
            self.running[name] = event["t"]
            self.held[job.queue] += job.gpus
        elif kind == "preempting":
            self.by[name] = event.get("by") or ""
        elif kind in ("preempt", "lost", "restart", "finish", "fail", "cancel"):
            if self.running.pop(name, None) is not None:
                self.held[job.queue] -= job.gpus
            if kind == "preempt":
                lost = float(event.get("lost_gpu_seconds") or 0.0)
                job.preempted += 1
                job.lost += lost / max(1, job.gpus)
                by = self.jobs.get(self.by.pop(name, ""))
                where = "priority" if by is not None and by.queue == job.queue else "reclaim"
                bucket = next(lo for lo, hi in BUCKETS if lo <= job.gpus <= hi)
                row = self.preempts[(where, bucket)]
                row[0] += 1
                row[1] += lost / 3600.0
            elif kind == "finish":
                job.finish = event["t"]


def report(tail: Tail, quotas: dict[str, int], top: int) -> None:
    print("preemptions by victim GPUs (count, GPU-hours lost):")
    for (where, lo), (count, hours) in sorted(tail.preempts.items()):
        hi = next(h for low, h in BUCKETS if low == lo)
        size = f"{lo}" if lo == hi else (f"{lo}-{hi}" if hi < 10**9 else f"{lo}+")
        print(f"  {where:8} {size:>6} GPUs: {int(count):6,} {hours:12,.0f}")
    done = [j for j in tail.jobs.values() if j.finish is not None and j.first_start is not None]
    jcts = sorted(j.finish - j.submit for j in done)  # type: ignore[operator]
    p99 = jcts[int(0.99 * (len(jcts) - 1))]
    slow = [j for j in done if j.finish - j.submit >= p99]  # type: ignore[operator]
    n = len(slow)
    print(f"JCT p99 {p99:,.0f} s (nearest rank); {n} jobs at or above it:")
    print(f"  preempted at least once: {sum(j.preempted > 0 for j in slow)}")
    wait = sum(j.first_start - j.submit for j in slow) / n  # type: ignore[operator]
    lost = sum(j.lost for j in slow) / n
    jct = sum(j.finish - j.submit for j in slow) / n  # type: ignore[operator]
    rest = jct - wait - lost
    print(f"  mean JCT {jct:,.0f} s = first wait {wait:,.0f} + work lost {lost:,.0f} + the rest {rest:,.0f}")
    runs = sorted(j.duration for j in done)
    floor = runs[int(0.99 * (len(runs) - 1))]
    print(
        f"  run time p99 {floor:,.0f} s (no policy's JCT p99 is lower); of these jobs, "
        f"{sum(j.duration >= p99 for j in slow)} run {p99:,.0f} s or longer, "
        f"{sum(j.duration >= floor for j in slow)} run {floor:,.0f} s or longer"
    )
    excess = sorted(j.finish - j.submit - j.duration for j in slow)  # type: ignore[operator]
    print(
        f"  JCT beyond their run time: median {excess[n // 2]:,.0f} s, mean {sum(excess) / n:,.0f} s "
        f"(first wait {wait:,.0f}, work lost {lost:,.0f}, waits after preemptions "
        f"{sum(excess) / n - wait - lost:,.0f})"
    )
    by_size: dict[int, int] = defaultdict(int)
    for j in slow:
        by_size[next(lo for lo, hi in BUCKETS if lo <= j.gpus <= hi)] += 1
    print(f"  by GPUs: {dict(sorted(by_size.items()))}")
    waits = sorted(
        ((j.first_start - j.submit, name, j) for name, j in tail.jobs.items() if j.first_start is not None),
        key=lambda w: w[0],
        reverse=True,
    )
    print(f"longest waits for a first start (top {top}):")
    for wait_s, name, j in waits[:top]:
        print(
            f"  {name:>12} queue {j.queue} ({quotas.get(j.queue, 0)} GPUs quota) {j.gpus:3} GPUs "
            f"submit {j.submit:11,.0f} wait {wait_s:11,.0f} queue held {tail.held_at_start[name]} at start, "
            f"below its quota {tail.below_waiting[name]:,.0f} s of the wait"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fraction", type=float, default=0.25)
    parser.add_argument("--policy", default="default")
    parser.add_argument("--arg", action="append", default=[], help="PLUGIN.KEY=VALUE for the policy")
    parser.add_argument("--hold-after", type=float)
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args()
    jobs = load_philly()
    cluster = shared_cluster(load_vc_nodes(), jobs, args.fraction)
    profile = load_policy(args.policy, parse_plugin_args(args.arg) or None)
    if args.hold_after is not None:
        profile = dataclasses.replace(profile, hold_after=args.hold_after)
    quotas = {q.name: q.quota for q in cluster.queues if q.quota is not None}
    tail = Tail(quotas)
    Simulation(cluster, jobs, profile, EventLog([tail.feed]), SimOptions()).run()
    report(tail, quotas, args.top)


if __name__ == "__main__":
    main()
