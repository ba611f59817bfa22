"""Shadow replay: the same trace through `corral simulate` and through a live control plane.

Run: `.venv/bin/python bench/shadow_replay.py [--jobs 2500] [--nodes 64] [--speed 1000]
[--policy default] [--queues one|vc] [--json OUT] [--keep DIR]`.

A slice of the Philly trace (`../shared/traces/philly_pollux`, the first `--jobs` jobs submitted
from `--start`) is compressed `--speed` times (submit times and durations divided by it) and
replayed twice on a cluster of `--nodes` nodes of 8 GPUs (16 to a leaf):

- by `corral simulate` (no topology slowdown, no restart overhead: the fleet runs each job for
  exactly its duration), which writes its event log;
- live: a real `corral server` (API and scheduler processes, SQLite), the fleet playing every
  node over HTTP (`python -m corral.fleet`), and the jobs submitted over HTTP at their
  (compressed) submit times, each `sleep <duration>`, which the fleet "runs"; the event log is
  read back from `GET /v1/events` once every job has started.

The two logs are compared job by job: first placement, order of first starts, waits (see
`corral.fleet.shadow`). Two more columns explain the difference:
- `timed simulate`: the simulator fed the live run's own timing (each job's submit time and
  its first attempt's run time as the live log shows them, latencies included). What differs
  from the live log then is what timing does not explain: cycles that gather several events
  (the live scheduler runs at most one cycle per 20 ms and spaces them by their cost).
- `simulate, cycles >= 20 ms`: the simulator against itself with `--min-interval` equal to the
  live scheduler's minimum spacing: how far batching alone moves decisions.
- `simulate, run times +1 ms`: the simulator against itself with every run time 1 ms longer:
  how far a timing difference far below the live system's latencies moves decisions (the core
  breaks ties between equally good nodes by the order they entered their free-count bucket,
  so which node a job gets depends on the order of earlier endings, not only on the state).

docs/benchmarks.md ("Shadow replay") records results and explains them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.fleet.harness import compress, run_live, simulate, submissions  # noqa: E402

from corral.fleet.shadow import compare, first_starts, live_timing, table  # noqa: E402
from corral.sim.loaders.philly import load_philly  # noqa: E402
from corral.sim.trace import TraceJob  # noqa: E402

MIN_CYCLE_INTERVAL = 0.02  # corral.server.pacing.MIN_CYCLE_INTERVAL
JITTER = 0.001  # seconds added to every run time: how sensitive decisions are to timing at all


def cluster_file(path: Path, nodes: int, queues: list[str]) -> None:
    lines = ["name: shadow", "topology: [leaf]", "nodes:"]
    for i in range(0, nodes, 16):
        last = min(i + 16, nodes)
        lines.append(f'  - {{name: "n[{i + 1:03d}-{last:03d}]", gpus: 8, gpu_model: H100-80GB, '
                     f"labels: {{leaf: l{i // 16}}}}}")  # fmt: skip
    lines += ["queues:", *(f"  - {{name: q{q}}}" for q in queues)]
    path.write_text("\n".join(lines) + "\n")


def philly_slice(start: str, count: int, queues: str) -> list[TraceJob]:
    jobs = load_philly(window=(start, "2017-12-31 00:00:00"))[:count]
    origin = jobs[0].submit_time
    return [
        dataclasses.replace(
            j, submit_time=j.submit_time - origin, queue="qone" if queues == "one" else f"q{j.queue}"
        )
        for j in jobs
    ]


def timed_jobs(
    jobs: list[TraceJob], times: dict[str, tuple[float, float]], overhead: float
) -> list[TraceJob]:
    """The trace with the live run's submit times and run times (jobs still running when the live
    run stopped keep their duration plus the median overhead: they end after every first start)."""
    out = []
    for j in jobs:
        submit, run = times.get(j.job_id, (None, None))
        out.append(dataclasses.replace(
            j, submit_time=j.submit_time if submit is None else submit,
            duration=j.duration + overhead if run is None else run,
        ))  # fmt: skip
    return out


def shadow(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    jobs = philly_slice(args.start, args.jobs, args.queues)
    queues = sorted({j.queue or "qone" for j in jobs})
    cluster = tmp / "cluster.yaml"
    cluster_file(cluster, args.nodes, [q[1:] for q in queues])
    fast = compress(jobs, args.speed)
    began = time.monotonic()
    sim = first_starts(simulate(cluster, fast, tmp / "sim.jsonl", args.policy))
    batched = first_starts(
        simulate(
            cluster, fast, tmp / "sim-batched.jsonl", args.policy, "--min-interval", str(MIN_CYCLE_INTERVAL)
        )
    )
    jittered = [dataclasses.replace(j, duration=j.duration + JITTER) for j in fast]
    jitter = first_starts(simulate(cluster, jittered, tmp / "sim-jitter.jsonl", args.policy))
    sim_s = time.monotonic() - began
    print(f"simulated in {sim_s:.1f} s; live run of about {fast[-1].submit_time:.0f} s ...", file=sys.stderr)
    run = run_live(cluster, submissions(fast, "qone"), tmp / "live", policy=args.policy)
    live = first_starts(run.events, run.names, run.origin)
    times = live_timing(run.events, run.names, run.origin)
    by_id = {j.job_id: j for j in fast}
    extra = [times[k][1] - by_id[k].duration for k in times]
    overhead = statistics.median(extra) if extra else 0.0
    timed = first_starts(
        simulate(cluster, timed_jobs(fast, times, overhead), tmp / "timed.jsonl", args.policy)
    )
    tolerance = args.tolerance
    columns = {
        "simulate vs live": compare(sim, live, tolerance),
        "timed simulate vs live": compare(timed, live, tolerance),
        "simulate vs simulate, cycles >= 20 ms": compare(sim, batched, tolerance),
        "simulate vs simulate, run times +1 ms": compare(sim, jitter, tolerance),
    }
    lag = sorted(run.submitted.late)
    return {
        "columns": {k: v.as_dict() for k, v in columns.items()},
        "table": table(columns, args.speed),
        "jobs": len(jobs),
        "started_all": run.started_all,
        "refused": len(run.submitted.refused),
        "run_overhead_median_s": overhead,
        "run_overhead_p90_s": sorted(extra)[int(0.9 * (len(extra) - 1))] if extra else None,
        "finished_live": len(times),
        "submit_late_p99_s": lag[int(0.99 * (len(lag) - 1))] if lag else None,
        "fleet": run.fleet.get("summary", {}),
        "simulator_s": sim_s,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=2500, help="jobs of the Philly slice (default 2,500)")
    parser.add_argument("--start", default="2017-10-03 00:00:00", help="the slice's first submission")
    parser.add_argument("--nodes", type=int, default=64, help="nodes of 8 GPUs (default 64)")
    parser.add_argument("--speed", type=float, default=1000.0, help="clock compression (default 1000)")
    parser.add_argument("--policy", default="default")
    parser.add_argument(
        "--queues", choices=("one", "vc"), default="vc", help="one queue, or one per Philly VC"
    )
    parser.add_argument(
        "--tolerance", type=float, default=0.2, help="a wait up to this (compressed s) is none"
    )
    parser.add_argument("--json", metavar="OUT", help="write every figure as JSON")
    parser.add_argument("--keep", metavar="DIR", help="keep the logs (simulator's, live, fleet, server) here")
    args = parser.parse_args(argv)
    tmp = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="corral-shadow-"))
    tmp.mkdir(parents=True, exist_ok=True)
    try:
        out = shadow(args, tmp)
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"Shadow replay: {out['jobs']} Philly jobs from {args.start}, {args.nodes} nodes x 8 GPUs, "
          f"policy {args.policy}, queues {args.queues}, clock x{args.speed:g}")  # fmt: skip
    print(out["table"])
    print(f"every job started live: {out['started_all']}; refused: {out['refused']}; "
          f"live run time - duration: median {out['run_overhead_median_s'] * 1000:.0f} ms, "
          f"p90 {(out['run_overhead_p90_s'] or 0) * 1000:.0f} ms over {out['finished_live']} attempts; "
          f"submissions late p99 {(out['submit_late_p99_s'] or 0) * 1000:.0f} ms")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), **out}, indent=2, default=str))
    return 0 if out["started_all"] else 1


if __name__ == "__main__":
    sys.exit(main())
