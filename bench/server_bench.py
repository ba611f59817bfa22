"""Control-plane benchmarks against a real `corral server` (API and scheduler processes).

Run: `.venv/bin/python bench/server_bench.py [--only submit,latency,restart,array,backlog] [--quick]
[--json OUT] [--database-url URL] [--clients N] [--threads T] [--duration S] [--replicas N] [--keyed]
[--nodes N] [--pending N] [--idle S] [--ends N] [--rate R] [--profile OUT [--profile-window idle]]`.

Each scenario starts its own `corral server` subprocess on a fresh database (SQLite in a temporary
directory, or a fresh database on the PostgreSQL server that `--database-url` names, dropped
afterwards) and measures it from outside, over HTTP, the way users and agents reach it:

- `submit`: submissions per second over HTTP with durable commits (target >= 2,000/s on
  SQLite; Slurm's `sbatch` manages about 200/s). The load comes from N processes x T threads,
  each with one keep-alive `http.client.HTTPConnection` and one request in flight (a closed
  loop), sending small valid job specs; a warm-up, then a measured window. Also: the latency of
  a submission under that load, the CPU of the API and scheduler processes, and of the clients.
  The lab cluster (4 nodes, none registered) keeps every job pending, so the scheduler still
  runs a cycle over the growing backlog as submissions arrive. `--replicas N` (PostgreSQL): the
  load spread over N API replicas, one scheduler (bench/server_replicas.py); `--keyed`: an
  `Idempotency-Key` on each submission.
- `latency`: submit-to-decision latency on an idle cluster (target p99 <= 100 ms): one node
  registered, one job at a time; the figure is from sending the POST until the node's agent
  long poll (`/v1/agents/{node}/assignments?wait=5`) returns the start order, the true path
  from a user to an agent. The agent then reports the job running and finished, and the next
  job is sent once the job is `finished`, so the cluster is idle for every sample.
- `restart`: 10,000 nodes (a generated cluster file, `n[00001-10000]`) and 100,000 jobs in the
  store, written in the shapes the server writes (75,000 finished, 15,000 running on every GPU
  of the cluster, 10,000 pending), then a restart: time until `/healthz` answers and until the
  scheduler logs `state loaded` (both: target <= 2 s), the resident memory of the API and of the
  scheduler process (target <= 1 GB together), the time until the scheduler's first cycle is
  committed, and the first submission's latency after the restart.

- `array`: one job array of 10,000 tasks: POST -> 201 (one commit), POST -> first start order
  at an agent, and the scheduler's cycle time with 10,000 pending tasks of the array, beside
  10,000 ordinary jobs of the same shape (bench/server_array.py).

- `backlog` (only when named: minutes): `--nodes` nodes of 8 GPUs played by a fleet of agents,
  every GPU busy, `--pending` jobs waiting (job arrays); the scheduler's CPU while nothing can
  start, and the time from an exit report to the next start on its GPUs
  (bench/server_backlog.py; target p99 <= 1 s).

`--quick` shrinks each scenario (1,000 nodes and 10,000 jobs; 3 s of load; 50 latency samples):
a smoke test, the targets are for the full size. The figures are wall-clock on a shared machine:
the load average before and after is printed. docs/benchmarks.md records measured results.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.server_load import _Http, bench_latency, bench_submit  # noqa: E402
from bench.server_probes import LAB, Server, database  # noqa: E402
from bench.server_restart import bench_restart  # noqa: E402

TARGETS: dict[str, list[tuple[str, str, str, Callable[[float], bool]]]] = {
    "submit": [("submits_per_s", "submissions/s (HTTP, durable)", ">= 2,000", lambda v: v >= 2000)],
    "latency": [("p99_ms", "submit -> agent p99 ms", "<= 100", lambda v: v <= 100)],
    "array": [],
    "backlog": [
        (
            "agent_start_p99_s",
            "exit committed -> next start order on its GPUs p99 s",
            "<= 1",
            lambda v: v <= 1.0,
        ),
    ],
    "restart": [
        ("healthz_s", "restart -> /healthz s", "<= 2", lambda v: v <= 2.0),
        ("loaded_s", "restart -> scheduler loaded s", "<= 2", lambda v: v <= 2.0),
        ("rss_total_mib", "RSS API + scheduler MiB", "<= 1,024", lambda v: v <= 1024),
    ],
}
INFO: dict[str, list[tuple[str, str]]] = {
    "submit": [
        ("client", "client"),
        ("per_api_cpu_s", "submissions per CPU-second of the API process"),
        ("client_cpu_pct", "client CPU, % of one core"),
        ("api_cpu_pct", "API process CPU, % of one core"),
        ("scheduler_cpu_pct", "scheduler process CPU, % of one core"),
        ("p50_ms", "submission latency p50 ms"),
        ("p99_ms", "submission latency p99 ms"),
        ("acked", "acknowledged in the window"),
        ("errors", "errors"),
        ("stored_ok", "every acknowledged job stored"),
        ("cycle_mean_ms", "scheduler cycle mean ms in the window"),
        ("cycles", "scheduler cycles in the window"),
    ],
    "latency": [
        ("samples", "samples"),
        ("p50_ms", "submit -> agent p50 ms"),
        ("max_ms", "submit -> agent max ms"),
        ("ack_p50_ms", "submit -> 201 p50 ms"),
        ("ack_p99_ms", "submit -> 201 p99 ms"),
        ("server_p50_ms", "submit -> start event (server clock) p50 ms"),
        ("server_p99_ms", "submit -> start event (server clock) p99 ms"),
    ],
    "restart": [
        ("nodes", "nodes"),
        ("jobs", "jobs in the store"),
        ("populate_s", "populating the store s"),
        ("first_start_healthz_s", "first start (empty store) -> /healthz s"),
        ("healthz_own_s", "restart -> /healthz s, less time waiting for a CPU"),
        ("healthz_cpu_s", "API process CPU s until /healthz"),
        ("loaded_cpu_s", "scheduler process CPU s until loaded"),
        ("loaded_ms", "scheduler's own load time ms (its log)"),
        ("first_cycle_s", "restart -> first cycle committed s"),
        ("api_rss_mib", "API RSS MiB"),
        ("scheduler_rss_mib", "scheduler RSS MiB"),
        ("scheduler_hwm_mib", "scheduler peak RSS MiB"),
        ("first_submit_ms", "first submission after restart ms"),
        ("second_healthz_s", "second restart -> /healthz s"),
        ("second_loaded_s", "second restart -> scheduler loaded s"),
        ("second_first_cycle_s", "second restart -> first cycle committed s"),
    ],
    "array": [],  # filled from bench/server_array.py
    "backlog": [],  # filled from bench/server_backlog.py
}


def bench_array(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """One 10,000-task job array: commit, first start, and the scheduler's cycle (bench/server_array.py)."""
    from bench.server_array import bench_array as run

    return run(args, tmp, Server, _Http, LAB, database)


def bench_backlog(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """A full cluster of fleet agents and a long backlog (bench/server_backlog.py)."""
    from bench.server_backlog import bench_backlog as run

    return run(args, tmp, Server, _Http, database)


SCENARIOS: dict[str, Callable[[argparse.Namespace, Path], dict[str, Any]]] = {
    "submit": bench_submit,
    "latency": bench_latency,
    "restart": bench_restart,
    "array": bench_array,
    "backlog": bench_backlog,
}


# ---- report ---------------------------------------------------------------------------------
def fmt(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, float):
        if value >= 1000:
            return f"{value:,.0f}"
        if value >= 10:
            return f"{value:.1f}"
        return f"{value:.3g}" if value < 1 else f"{value:.2f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def table(results: dict[str, dict[str, Any]], quick: bool, db: str) -> str:
    rows = [("scenario", "figure", "value", "target", "met")]
    for name, figures in results.items():
        if "error" in figures:
            rows.append((name, "CRASHED", figures["error"], "", "no"))
            continue
        for key, label, target, good in TARGETS[name]:
            value = figures[key]
            rows.append((name, label, fmt(value), target, "yes" if good(value) else "NO"))
        for key, label in INFO[name]:
            if key in figures:
                rows.append((name, label, fmt(figures[key]), "", ""))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    lines = []
    for i, row in enumerate(rows):
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    size = "QUICK: reduced sizes, targets are for full size" if quick else "full size"
    return f"Corral control-plane benchmarks on {db} ({size})\n" + "\n".join(lines)


def source_version() -> str:
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                text=True, check=True).stdout.strip()  # fmt: skip
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "src/corral"], cwd=ROOT,
                               capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return commit + ("+dirty" if dirty else "")


def main(argv: list[str] | None = None) -> int:
    from bench.server_array import INFO as ARRAY_INFO
    from bench.server_backlog import INFO as BACKLOG_INFO

    INFO["array"] = ARRAY_INFO
    INFO["backlog"] = BACKLOG_INFO
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--only", help=f"comma-separated scenarios: {', '.join(SCENARIOS)}")
    parser.add_argument("--quick", action="store_true", help="reduced sizes (a smoke test)")
    parser.add_argument("--json", metavar="OUT", help="write every figure as JSON to OUT ('-': stdout)")
    parser.add_argument(
        "--database-url",
        help="a PostgreSQL server (postgresql+psycopg://...): each scenario runs on a fresh database there "
        "(default: SQLite in a temporary directory)",
    )
    parser.add_argument("--clients", type=int, default=4, help="submit: client processes (default 4)")
    parser.add_argument(
        "--threads", type=int, default=6, help="submit: connections per client process (default 6)"
    )
    parser.add_argument("--duration", type=float, default=10.0, help="submit: measured seconds (default 10)")
    parser.add_argument(
        "--replicas", type=int, default=1,
        help="submit: API replicas on one PostgreSQL (needs --database-url; bench/server_replicas.py)",
    )  # fmt: skip
    parser.add_argument("--keyed", action="store_true", help="submit: an Idempotency-Key on each submission")
    parser.add_argument("--samples", type=int, default=200, help="latency: jobs (default 200)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--nodes", type=int, default=500, help="backlog: nodes of 8 GPUs (default 500)")
    parser.add_argument("--pending", type=int, default=100_000, help="backlog: jobs waiting (100,000)")
    parser.add_argument("--array-size", type=int, default=500, help="backlog: tasks per array (500)")
    parser.add_argument("--idle", type=float, default=30.0, help="backlog: idle-blocked seconds measured")
    parser.add_argument("--settle", type=float, default=300.0, help="backlog: at most this long for quiet")
    parser.add_argument("--ends", type=int, default=300, help="backlog: running jobs the fleet ends")
    parser.add_argument(
        "--profile", metavar="OUT", help="backlog: cProfile the scheduler over the endings' window into OUT"
    )
    parser.add_argument(
        "--profile-window", choices=("endings", "idle"), default="endings",
        help="backlog: the window `--profile` covers (endings)",
    )  # fmt: skip
    parser.add_argument(
        "--skip-reasons", action="store_true",
        help="backlog, a what-if: the scheduler writes no reasons of waiting jobs (bench/profile_hook)",
    )  # fmt: skip
    parser.add_argument("--rate", type=float, default=5.0, help="backlog: endings per second (default 5)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directories (server logs)")
    args = parser.parse_args(argv)
    names = [n for n in SCENARIOS if n != "backlog"]  # backlog (minutes, 4,000 GPUs' agents): asked by name
    if args.only:
        names = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = [n for n in names if n not in SCENARIOS]
        if unknown:
            parser.error(f"unknown scenario {', '.join(unknown)}; known: {', '.join(SCENARIOS)}")
    db = "PostgreSQL" if args.database_url else "SQLite"
    load_before = os.getloadavg()[0]
    results: dict[str, dict[str, Any]] = {}
    for name in names:
        print(f"running {name} ...", file=sys.stderr, flush=True)
        tmp = Path(tempfile.mkdtemp(prefix=f"corral-bench-{name}-"))
        try:
            results[name] = SCENARIOS[name](args, tmp)
        except Exception as exc:  # report and go on with the next scenario
            results[name] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
            print(f"{name} failed; server log: {tmp / 'data' / 'server.log'}", file=sys.stderr)
            args.keep = True
        finally:
            if not args.keep:
                shutil.rmtree(tmp, ignore_errors=True)
    load_after = os.getloadavg()[0]
    meta = {
        "database": db, "python": platform.python_version(), "cpus": os.cpu_count(), "quick": args.quick,
        "date": time.strftime("%Y-%m-%d"), "source": source_version(),
        "loadavg_1min_before_after": [load_before, load_after],
    }  # fmt: skip
    if args.json == "-":
        print(json.dumps({"meta": meta, "results": results}, indent=2, default=str))
    else:
        print(table(results, args.quick, db))
        print(f"source {meta['source']}; python {meta['python']}; {meta['cpus']} CPUs; "
              f"load average {load_before:.2f} before, {load_after:.2f} after")  # fmt: skip
        if args.json:
            Path(args.json).write_text(json.dumps({"meta": meta, "results": results}, indent=2, default=str))
    return 0 if all("error" not in r for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
