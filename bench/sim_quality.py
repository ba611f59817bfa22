"""Quality: Corral's `default` policy against `fifo`, `sjf` (oracle) and `las` where scheduling matters.

Run: .venv/bin/python bench/sim_quality.py [--only philly-0.25|philly-0.2|pollux] [--policy P ...]
     [--min-interval S] [--checkpoint-interval S]
- Philly as one shared cluster, one queue per virtual cluster with a quota of its share, at a
  quarter (88 nodes, 704 GPUs) and a fifth (70 nodes, 560 GPUs) of the Helios sizes.
- The Pollux 160-job workloads (1.0x load) on Pollux's 16 nodes x 4 GPUs, averaged over the 8.
- `overload`: the synthetic overload trace's first 5,000 jobs (`--first` for another prefix) on
  128 nodes x 8 GPUs, two queues each guaranteed half (`bench/overload_trace.py`; the setting of
  `bench/quota_guarantee.py`; every job checkpoints every 30 minutes).
Prints one JSON line per run and a table per load: average and p99 JCT, queueing delay,
fairness (Jain over queues, finish-time fairness), utilisation, preemptions.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from corral.config.cluster_file import parse_cluster_config
from corral.policies.registry import load_policy, parse_plugin_args, policy_names
from corral.sim.engine import SimOptions, Simulation
from corral.sim.eventlog import EventLog
from corral.sim.jobmodel import PreemptionCost
from corral.sim.loaders import load, shared_traces_dir
from corral.sim.loaders.philly import load_philly, load_vc_nodes
from corral.sim.metrics import Measures
from corral.sim.trace import TraceJob
from overload_trace import overload_cluster, overload_trace
from philly_setup import shared_cluster

POLICIES = ["default", "fifo", "sjf", "las"]
BASELINES = ("fifo", "sjf", "las")  # --arg and --hold-after apply to the other policies
FIELDS = [
    ("avg JCT", ("jct", "mean")),
    ("p99 JCT", ("jct", "p99")),
    ("avg queue", ("queueing_delay", "mean")),
    ("p99 queue", ("queueing_delay", "p99")),
    ("Jain", ("jain_fairness",)),
    ("FTF mean", ("finish_time_fairness", "mean")),
    ("FTF max", ("finish_time_fairness", "max")),
    ("util", ("gpu_utilisation",)),
    ("preempt", ("jobs", "preemptions")),
    ("lost GPU-h", ("preempted_gpu_hours_lost",)),
]


def _get(summary: dict[str, Any], path: tuple[str, ...]) -> float:
    value: Any = summary
    for key in path:
        value = value[key]
    return float(value) if value is not None else float("nan")


MIN_INTERVAL = [0.0]  # seconds between cycles (--min-interval)
CHECKPOINT: list[float | None] = [None]  # seconds of work between checkpoints (--checkpoint-interval)


class Waits:
    """The longest wait for a first start, and how often (and by how much) a job started after
    the start its first reservation promised (a backfilled job or an estimate that ran over)."""

    def __init__(self) -> None:
        self.submitted: dict[str, float] = {}
        self.promised: dict[str, float] = {}
        self.max_wait = 0.0
        self.reserved = self.delayed = 0
        self.delay_total = self.delay_max = 0.0

    def feed(self, event: dict[str, Any]) -> None:
        kind, job = event["event"], event.get("job")
        if kind == "submit":
            self.submitted[job] = event["t"]
        elif kind == "start" and job in self.submitted:
            self.max_wait = max(self.max_wait, event["t"] - self.submitted.pop(job))
            promised = self.promised.pop(job, None)
            if promised is not None:
                self.reserved += 1
                late = event["t"] - promised
                if late > 1.0:
                    self.delayed += 1
                    self.delay_total += late
                    self.delay_max = max(self.delay_max, late)

    def cycle(self, result: Any) -> None:
        for r in result.reservations:
            self.promised.setdefault(r.job, r.start)

    def row(self) -> dict[str, float]:
        return {
            "max wait": self.max_wait,
            "reserved": self.reserved,
            "late": self.delayed,
            "late avg": self.delay_total / self.delayed if self.delayed else 0.0,
            "late max": self.delay_max,
        }


def run_one(cluster: Any, jobs: list[TraceJob], policy: str) -> dict[str, float]:
    measures = Measures()
    started = time.perf_counter()
    options = SimOptions(
        min_interval=MIN_INTERVAL[0], preemption=PreemptionCost(default_interval=CHECKPOINT[0])
    )
    tuned = policy not in BASELINES
    profile = load_policy(policy, ARGS[0] if tuned else None)
    if HOLD_AFTER[0] is not None and tuned:
        profile = dataclasses.replace(profile, hold_after=HOLD_AFTER[0])
    cpu = time.process_time()
    waits = Waits()
    sim = Simulation(cluster, jobs, profile, EventLog([measures.feed, waits.feed]), options)
    sim.on_cycle = waits.cycle
    sim.run()
    s = measures.summary()
    row = {name: _get(s, path) for name, path in FIELDS} | waits.row()
    row["seconds"] = time.perf_counter() - started
    row["cpu"] = time.process_time() - cpu
    print(
        json.dumps(
            {
                "cluster": cluster.name,
                "policy": policy,
                "min_interval": MIN_INTERVAL[0],
                "checkpoint_interval": CHECKPOINT[0],
                "args": ARGS[0] if tuned else {},
                "hold_after": getattr(profile, "hold_after", None),  # absent before issue 16
                **row,
                # per queue: its share of the GPU-hours, its quota's share, time below its quota
                # while its jobs waited (fraction of the run)
                "queues": {
                    name: {k: round(q[k], 4) for k in ("share", "quota_share", "below_quota_fraction")}
                    for name, q in s["queues"].items()
                },
            }
        ),
        flush=True,
    )
    return row


ARGS: list[dict[str, dict[str, Any]]] = [{}]  # plugin arguments for `default` (--arg)
HOLD_AFTER: list[float | None] = [None]  # default's hold_after (--hold-after)
FIRST: list[int | None] = [None]  # only the first N jobs of Philly (--first), for quick iterations


def philly(fraction: float, policies: list[str]) -> dict[str, dict[str, float]]:
    jobs = load_philly()[: FIRST[0]]
    cluster = shared_cluster(load_vc_nodes(), jobs, fraction)
    return {p: run_one(cluster, jobs, p) for p in policies}


def pollux(policies: list[str]) -> dict[str, dict[str, float]]:
    cluster = parse_cluster_config(
        {"name": "pollux-16x4", "nodes": [{"name": "t[01-16]", "gpus": 4, "gpu_model": "T4"}]},
        source="pollux",
    )
    folder = shared_traces_dir() / "pollux" / "sim_workloads"
    runs: dict[str, list[dict[str, float]]] = {p: [] for p in policies}
    for n in range(1, 9):
        jobs = load("pollux", folder / f"workload-{n}.csv")
        for p in policies:
            runs[p].append(run_one(cluster, jobs, p))
    return {p: {k: sum(r[k] for r in rows) / len(rows) for k in rows[0]} for p, rows in runs.items()}


def overload(policies: list[str]) -> dict[str, dict[str, float]]:
    jobs = overload_trace()[: FIRST[0] or 5000]
    cluster = overload_cluster(128)
    return {p: run_one(cluster, jobs, p) for p in policies}


EXTRA = ["max wait", "reserved", "late", "late avg", "late max", "cpu"]


def show(title: str, results: dict[str, dict[str, float]]) -> None:
    print(f"\n{title}")
    names = [name for name, _ in FIELDS] + EXTRA
    print(f"{'policy':8}" + "".join(f"{name:>12}" for name in names))
    for policy, row in results.items():
        cells = "".join(
            f"{row[name]:>12.3f}" if name in ("Jain", "util", "FTF mean") else f"{row[name]:>12,.0f}"
            for name in names
        )
        print(f"{policy:8}{cells}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=["philly-0.25", "philly-0.2", "pollux", "overload"])
    parser.add_argument("--policy", action="append", choices=policy_names(), help=f"default: {POLICIES}")
    parser.add_argument("--min-interval", type=float, default=0.0, help="seconds between cycles, at least")
    parser.add_argument(
        "--checkpoint-interval",
        type=float,
        help="seconds of work between checkpoints for jobs whose trace gives none (default: none, "
        "a preempted job loses all its work)",
    )
    parser.add_argument("--first", type=int, help="Philly, overload: only the first N jobs (a prefix)")
    parser.add_argument("--arg", action="append", default=[], help="PLUGIN.KEY=VALUE (not for baselines)")
    parser.add_argument(
        "--hold-after", type=float, help="seconds before estimates hold GPUs (not for baselines; 0: at once)"
    )
    args = parser.parse_args()
    HOLD_AFTER[0] = args.hold_after
    ARGS[0] = parse_plugin_args(args.arg)
    FIRST[0] = args.first
    MIN_INTERVAL[0] = args.min_interval
    CHECKPOINT[0] = args.checkpoint_interval
    policies = args.policy or POLICIES
    cases = [args.only] if args.only else ["pollux", "philly-0.25", "philly-0.2"]
    for case in cases:
        if case == "pollux":
            results = pollux(policies)
        elif case == "overload":
            results = overload(policies)
        else:
            results = philly(float(case.split("-")[1]), policies)
        print(json.dumps({"case": case, "results": results}), flush=True)
        show(case, results)


if __name__ == "__main__":
    main()
