"""Simulator speed: whole Philly, a preemptive LAS replay, a 1,000,000-job synthetic trace, and
an oversubscribed cluster (`bench/overload_trace.py`).

Run: .venv/bin/python bench/sim_speed.py [--only CASE[,CASE]] [--jobs N] [--policy P (for `default`)]
     [--arg PLUGIN.KEY=VALUE (its arguments, e.g. tiresias.estimate_weight=4)] [--no-skip (run every
     cycle after arrivals alone: `SimOptions.skip_quiet` off)]
Each case runs in a fresh process; the figures are wall time (and the process's CPU time, which a
busy machine inflates less), simulated jobs per second and the process's peak resident memory,
and whether the core ran compiled (scripts/setup.sh builds it; CORRAL_PURE_PYTHON=1 runs it
interpreted: see corral/native.py).
Targets (issue "Simulator"): whole Philly (82,247 jobs) on the 352-node, 2,816-GPU cluster in
<= 10 s; >= 20,000 simulated jobs/s on a 1,024-GPU cluster with a preemptive least-attained-
service policy; 1,000,000 jobs on 5,000 nodes x 8 GPUs in <= 5 min and <= 2 GB.
Targets (issue "Overload"), on the overload trace: its 52,000 jobs on 5,000 nodes x 8 GPUs in
<= 30 s with `default` (`overload`); its first 5,000 jobs on 128 nodes x 8 GPUs in <= 1 s with
`default` and with `las` (`overload128`, `overload128_las`); 1,000,000 jobs of its shape at 2x
load on 5,000 nodes in <= 5 min and <= 2 GB (`overload_million`). `--jobs N` replays the first N.
`--cpu-budget S` stops each case after S CPU seconds and reports how far it got (arrivals, virtual
time, backlog, with a sample every tenth of the budget), for cases too slow to finish here.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from corral import native  # noqa: E402
from corral.config.cluster_file import ClusterConfig, parse_cluster_config  # noqa: E402
from corral.policies.registry import load_policy, parse_plugin_args  # noqa: E402
from corral.sim.engine import SimOptions, SimStats, Simulation  # noqa: E402
from corral.sim.eventlog import EventLog  # noqa: E402
from corral.sim.gcpause import rare_collections  # noqa: E402
from corral.sim.loaders.philly import load_philly, load_vc_nodes  # noqa: E402
from corral.sim.metrics import Measures  # noqa: E402
from corral.sim.trace import TraceJob  # noqa: E402
from overload_trace import overload_cluster, overload_trace  # noqa: E402
from philly_setup import shared_cluster  # noqa: E402


def flat_cluster(nodes: int, per_leaf: int = 32) -> ClusterConfig:
    entries = [
        {
            "name": f"n[{i + 1:05d}-{min(i + per_leaf, nodes):05d}]",
            "gpus": 8,
            "labels": {"leaf": f"l{i // per_leaf}"},
        }
        for i in range(0, nodes, per_leaf)
    ]
    return parse_cluster_config(
        {"name": f"flat-{nodes}", "topology": ["leaf"], "nodes": entries}, source="bench"
    )


def synthetic(count: int, gpus: int, load: float, seed: int = 1) -> list[TraceJob]:
    """Poisson arrivals at `load` times the cluster's capacity; Philly-like GPU counts and durations."""
    rng = random.Random(seed)
    sizes = [(1, 0.90), (2, 0.03), (4, 0.03), (8, 0.03), (16, 0.007), (32, 0.003)]
    mean_gpus = sum(s * p for s, p in sizes) / sum(p for _, p in sizes)
    mean_duration = 3600.0
    rate = load * gpus / (mean_gpus * mean_duration)
    t, jobs = 0.0, []
    for i in range(count):
        t += rng.expovariate(rate)
        size = rng.choices([s for s, _ in sizes], [p for _, p in sizes])[0]
        replicas, per = (size // 8, 8) if size > 8 else (1, size)
        duration = min(30 * 86400.0, rng.lognormvariate(7.0, 1.5))
        jobs.append(
            TraceJob(job_id=f"s{i}", submit_time=round(t, 1), duration=round(duration, 1), gpus=size,
                     replicas=replicas, gpus_per_replica=per)
        )  # fmt: skip
    return jobs


def run(case: str, jobs_limit: int | None, budget: float | None = None) -> dict[str, object]:
    started = time.perf_counter()
    if case == "philly":
        jobs = load_philly()
        cluster, policy = shared_cluster(load_vc_nodes(), jobs, 1.0), "default"
    elif case == "las":
        jobs = [replace(j, queue=None) for j in load_philly()[: jobs_limit or 82247]]  # one queue
        cluster, policy = flat_cluster(128), "las"
    elif case == "million":
        cluster = flat_cluster(5000)
        jobs, policy = synthetic(jobs_limit or 1_000_000, 40_000, load=0.9), "default"
    else:
        cluster, jobs, policy = overload_case(case, jobs_limit)
    loaded = time.perf_counter()
    cpu = time.process_time()
    measures = Measures()
    if policy == "default":
        policy = DEFAULT[0]  # --policy
        profile = load_policy(policy, parse_plugin_args(ARGS))
    else:
        profile = load_policy(policy)
    sim = Simulation(cluster, jobs, profile, EventLog([measures.feed]), SimOptions(skip_quiet=SKIP[0]))
    progress: list[dict[str, float]] = []
    stats = sim.run() if budget is None else _run_for(sim, cpu, budget, progress)
    ran = time.perf_counter() - loaded
    cpu = time.process_time() - cpu
    summary = measures.summary()
    return {
        "case": case, "policy": policy, "jobs": len(jobs), "gpus": sum(n.gpus for n in cluster.nodes),
        "load_s": round(loaded - started, 2), "sim_s": round(ran, 2), "sim_cpu_s": round(cpu, 2),
        "jobs_per_s": round(sim.arrived / ran),
        "cycles": stats.cycles, "skipped": stats.skipped, "finished": summary["jobs"]["finished"],
        "preemptions": summary["jobs"]["preemptions"],
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "compiled": native.active(),
    } | ({"cpu_budget_s": budget, "progress": progress} if budget is not None else {})  # fmt: skip


def _run_for(sim: Simulation, cpu0: float, budget: float, progress: list[dict[str, float]]) -> SimStats:
    """Step the replay until it ends or has used `budget` CPU seconds; a sample every tenth of it
    (CPU seconds, virtual time, arrivals, jobs waiting and running) into `progress`."""
    sim.begin()
    every, steps = budget / 10, 0
    mark = cpu0 + every
    with rare_collections():
        while sim.step():
            steps += 1
            if steps % 64:
                continue
            now = time.process_time()
            if now >= mark or now - cpu0 >= budget:
                state = sim.state
                progress.append({
                    "cpu_s": round(now - cpu0, 1), "t": round(sim.stats.end_time),
                    "arrived": sim.arrived, "pending": len(state.jobs), "running": len(state.running),
                })  # fmt: skip
                mark = now + every
                if now - cpu0 >= budget:
                    break
    return sim.stats


def overload_case(case: str, jobs_limit: int | None) -> tuple[ClusterConfig, list[TraceJob], str]:
    """The overload cases: (cluster, jobs, policy)."""
    if case == "overload_million":
        total = jobs_limit or 1_000_000
        gangs = round(total * 2_000 / 52_000)
        return overload_cluster(5000), overload_trace(total - gangs, gangs, 5000, load=2.0), "default"
    jobs = overload_trace()  # 52,000 jobs offering 2.8x the capacity of 5,000 nodes over 10 h
    if case == "overload":
        return overload_cluster(5000), jobs[: jobs_limit or len(jobs)], "default"
    policy = "las" if case == "overload128_las" else "default"
    return overload_cluster(128), jobs[: jobs_limit or 5000], policy


TARGETS = {
    "philly": "<= 10 s",
    "las": ">= 20,000 jobs/s",
    "million": "<= 300 s, <= 2048 MiB",
    "overload": "<= 30 s",
    "overload128": "<= 1 s",
    "overload128_las": "<= 1 s",
    "overload_million": "<= 300 s, <= 2048 MiB",
}
DEFAULT_CASES = ["philly", "las", "million", "overload", "overload128", "overload128_las"]
DEFAULT = ["default"]  # the policy of the cases that run `default` (--policy)
ARGS: list[str] = []  # its arguments (--arg)
SKIP = [True]  # tell arrivals alone without a cycle where the last cycle shows how (--no-skip: off)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help=f"comma-separated cases: {', '.join(TARGETS)}")
    parser.add_argument("--jobs", type=int, help="limit the jobs of the case (smoke runs)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per case (default 1800)")
    parser.add_argument("--policy", default="default", help="instead of default (e.g. estimated)")
    parser.add_argument("--arg", action="append", default=[], help="PLUGIN.KEY=VALUE, for --policy's plugins")
    parser.add_argument(
        "--no-skip", action="store_true", help="run every cycle after arrivals alone (core/quiet.py)"
    )
    parser.add_argument("--cpu-budget", type=float, help="stop each case after this many CPU seconds")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    DEFAULT[0] = args.policy
    SKIP[0] = not args.no_skip
    ARGS[:] = args.arg
    if args.child:
        print(json.dumps(run(args.child, args.jobs, args.cpu_budget)))
        return
    cases = args.only.split(",") if args.only else DEFAULT_CASES
    unknown = [c for c in cases if c not in TARGETS]
    if unknown:
        parser.error(f"unknown case {', '.join(unknown)}; known: {', '.join(TARGETS)}")
    for case in cases:
        cmd = [sys.executable, __file__, "--child", case, "--policy", args.policy]
        cmd += ["--jobs", str(args.jobs)] if args.jobs else []
        cmd += [f"--arg={a}" for a in args.arg]
        cmd += ["--cpu-budget", str(args.cpu_budget)] if args.cpu_budget else []
        cmd += ["--no-skip"] if args.no_skip else []
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=args.timeout).stdout
        except subprocess.TimeoutExpired:
            print(
                json.dumps({"case": case, "timed_out_s": args.timeout}), "target:", TARGETS[case], flush=True
            )
            continue
        result = json.loads(out.strip().splitlines()[-1])
        print(json.dumps(result), "target:", TARGETS[case], flush=True)


if __name__ == "__main__":
    main()
