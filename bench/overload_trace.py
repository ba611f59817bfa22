"""A seeded synthetic trace of an oversubscribed GPU cluster, and the cluster file it runs on.

The shape (issue "Overload"): mostly one-GPU jobs and some gangs of whole 8-GPU nodes (1, 2, 4,
8, 16 or 32 replicas, about equally often), durations uniform between 10 minutes and 10 hours,
each with a time limit of about 1.5x its duration (1.3-1.7x, whole minutes) and a checkpoint
every 30 minutes, all preemptible, class `normal`, spread evenly over two queues. Arrivals are
Poisson, at a rate that offers `load` times the cluster's GPU-hours over the arrival window:
with the defaults (50,000 one-GPU jobs, 2,000 gangs, 5,000 nodes, load 2.8) the window is about
10 hours, and a backlog of tens of thousands of jobs builds up after the first few hours.

    from overload_trace import overload_cluster, overload_trace
    jobs = overload_trace(singles=50_000, gangs=2_000, nodes=5_000, load=2.8, seed=1)
    cluster = overload_cluster(5_000)            # a ClusterConfig; cluster_file(...) is the YAML's dict

Command line (a trace CSV and a cluster YAML for `corral simulate`):

    .venv/bin/python bench/overload_trace.py --trace /tmp/overload.csv --cluster /tmp/overload.yaml \
        [--singles 50000] [--gangs 2000] [--nodes 5000] [--load 2.8] [--seed 1]

The jobs are in submit order, so the first N rows are the trace's first N arrivals (the prefixes
that `bench/sim_speed.py` replays on smaller clusters).
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path
from typing import Any

import yaml

from corral.config.cluster_file import ClusterConfig, parse_cluster_config
from corral.sim.trace import TraceJob, write_trace

GPUS_PER_NODE = 8
GANG_REPLICAS = (1, 2, 4, 8, 16, 32)
MIN_DURATION, MAX_DURATION = 600.0, 36_000.0  # 10 minutes .. 10 hours
CHECKPOINT_INTERVAL = 1800.0
QUEUES = ("team-a", "team-b")
NODES_PER_LEAF, LEAVES_PER_SPINE = 32, 8


def overload_trace(
    singles: int = 50_000, gangs: int = 2_000, nodes: int = 5_000, load: float = 2.8, seed: int = 1
) -> list[TraceJob]:
    """`singles` one-GPU jobs and `gangs` gangs, mixed at random, arriving so that they offer
    `load` times the GPU-seconds of `nodes` 8-GPU nodes over their arrival window."""
    if singles < 0 or gangs < 0 or nodes < 1 or load <= 0:
        raise ValueError("singles and gangs must be 0 or more, nodes 1 or more, load above 0")
    rng = random.Random(seed)
    kinds = [0] * singles + [1] * gangs
    rng.shuffle(kinds)
    shapes: list[tuple[int, int, float]] = []  # (replicas, GPUs per replica, duration)
    for kind in kinds:
        replicas, per = (rng.choice(GANG_REPLICAS), GPUS_PER_NODE) if kind else (1, 1)
        shapes.append((replicas, per, float(round(rng.uniform(MIN_DURATION, MAX_DURATION)))))
    work = sum(r * g * d for r, g, d in shapes)
    window = work / (load * nodes * GPUS_PER_NODE)  # seconds of arrivals
    rate = len(shapes) / window if shapes else 1.0
    jobs: list[TraceJob] = []
    t = 0.0
    for i, (replicas, per, duration) in enumerate(shapes):
        t += rng.expovariate(rate)
        limit = 60.0 * round(duration * rng.uniform(1.3, 1.7) / 60.0)
        jobs.append(
            TraceJob(
                job_id=f"o{i}", submit_time=round(t, 1), duration=duration, gpus=replicas * per,
                queue=QUEUES[i % len(QUEUES)], replicas=replicas, gpus_per_replica=per, priority="normal",
                time_limit=limit, preemptible=True, checkpoint_interval=CHECKPOINT_INTERVAL,
            )
        )  # fmt: skip
    return jobs


def cluster_file(nodes: int) -> dict[str, Any]:
    """The cluster file (as a dict): `nodes` 8-GPU nodes under two levels (32 nodes a leaf, 8
    leaves a spine) and the two queues, each guaranteed half the GPUs, in one cohort."""
    entries = []
    for first in range(0, nodes, NODES_PER_LEAF):
        leaf = first // NODES_PER_LEAF
        last = min(first + NODES_PER_LEAF, nodes)
        entries.append(
            {
                "name": f"n[{first + 1:05d}-{last:05d}]",
                "gpus": GPUS_PER_NODE,
                "labels": {"spine": f"s{leaf // LEAVES_PER_SPINE}", "leaf": f"l{leaf}"},
            }
        )
    quota = nodes * GPUS_PER_NODE // len(QUEUES)
    return {
        "name": f"overload-{nodes}",
        "topology": ["spine", "leaf"],
        "nodes": entries,
        "queues": [{"name": q, "quota": quota, "cohort": "all"} for q in QUEUES],
    }


def overload_cluster(nodes: int) -> ClusterConfig:
    return parse_cluster_config(cluster_file(nodes), source=f"overload-{nodes}")


def offered_load(jobs: list[TraceJob], nodes: int) -> float:
    """GPU-seconds asked for over GPU-seconds available between the first and last arrival."""
    if len(jobs) < 2:
        return 0.0
    window = jobs[-1].submit_time - jobs[0].submit_time
    return sum(j.gpus * j.duration for j in jobs) / (window * nodes * GPUS_PER_NODE) if window else 0.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, required=True, help="where to write the trace CSV")
    parser.add_argument("--cluster", type=Path, help="where to write the cluster YAML")
    parser.add_argument("--singles", type=int, default=50_000, help="one-GPU jobs (default 50,000)")
    parser.add_argument("--gangs", type=int, default=2_000, help="gangs of 8-GPU replicas (default 2,000)")
    parser.add_argument("--nodes", type=int, default=5_000, help="8-GPU nodes (default 5,000)")
    parser.add_argument("--load", type=float, default=2.8, help="offered load over capacity (default 2.8)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    try:
        jobs = overload_trace(args.singles, args.gangs, args.nodes, args.load, args.seed)
    except ValueError as exc:
        parser.error(str(exc))
    write_trace(args.trace, jobs)
    if args.cluster is not None:
        args.cluster.write_text(yaml.safe_dump(cluster_file(args.nodes), sort_keys=False))
    hours = jobs[-1].submit_time / 3600 if jobs else 0.0
    print(
        f"{len(jobs)} jobs over {hours:.1f} h, offered load {offered_load(jobs, args.nodes):.2f}x "
        f"of {args.nodes} nodes x {GPUS_PER_NODE} GPUs",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
