"""Benchmarks of the scheduling core: placements/s, gang decision latency, a full cycle, victim selection.

Run: `.venv/bin/python bench/core_bench.py [--only NAME[,NAME]] [--quick] [--json OUT] [--seed N]`.

Each scenario builds its cluster and jobs with a seeded `random.Random`, runs in a fresh
subprocess (so its peak RSS is its own), checks that no GPU was given twice, and reports its
figures as one JSON object on stdout. The parent prints a table (scenario, figure, value,
target, met) and can write every figure as JSON. `--quick` runs each scenario at 1/10 size
(a smoke test; the targets are meant for the full size). docs/benchmarks.md explains each
scenario and records measured results.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from core_fixtures import FULL, QUICK, Size
from core_preempt import bench_backlog, bench_preempt, bench_preempt_one_queue
from core_scenarios import bench_cycle, bench_gangs, bench_placements

# ---- harness --------------------------------------------------------------------------------------
SCENARIOS: dict[str, Callable[[Size, float, random.Random], dict[str, Any]]] = {
    "placements": bench_placements,
    "gangs": bench_gangs,
    "cycle": bench_cycle,
    "preempt": bench_preempt,
    "preempt_one_queue": bench_preempt_one_queue,
    "backlog": bench_backlog,
}

# scenario -> (figure, label, target text, predicate)
TARGETS: dict[str, list[tuple[str, str, str, Callable[[float], bool]]]] = {
    "placements": [("placements_per_s", "placements/s (one cycle)", ">= 20,000", lambda v: v >= 20_000)],
    "gangs": [("decision_p99_ms", "gang decision p99 ms", "<= 10", lambda v: v <= 10)],
    "cycle": [("cycle_ms", "full cycle ms", "<= 250", lambda v: v <= 250)],
    "preempt": [("select_p99_ms", "victim selection p99 ms", "<= 20", lambda v: v <= 20)],
    "backlog": [
        ("idle_cycle_ms", "cycle where nothing can start ms", "<= 20", lambda v: v <= 20),
        ("after_end_cycle_ms", "cycle after 1 % end ms", "<= 100", lambda v: v <= 100),
    ],
}
TARGETS["preempt_one_queue"] = TARGETS["preempt"]
INFO: dict[str, list[tuple[str, str]]] = {
    "placements": [
        ("build_s", "build state s"),
        ("submit_s", "submit all s"),
        ("cycle_s", "cycle s"),
        ("check_s", "  of which feasibility check s"),
        ("phases_s", "  of which phases s"),
        ("placements_per_s_without_check", "placements/s without the check"),
        ("starts", "starts"),
    ],
    "gangs": [
        ("decision_p50_ms", "gang decision p50 ms"),
        ("decision_max_ms", "gang decision max ms"),
        ("decision_without_check_p50_ms", "p50 ms without the check"),
        ("decision_without_check_p99_ms", "p99 ms without the check"),
        ("outcome_started", "gangs started"),
        ("outcome_nominated", "gangs nominated"),
        ("outcome_reserved", "gangs reserved"),
        ("outcome_blocked", "gangs blocked"),
        ("outcome_rejected", "gangs rejected"),
    ],
    "cycle": [
        ("check_ms", "  of which feasibility check ms"),
        ("phases_ms", "  of which phases ms"),
        ("setup_cycle_s", "setup cycle s (starts running)"),
        ("starts", "starts"),
        ("backfilled", "backfilled"),
        ("nominations", "nominations"),
        ("reservations", "reservations"),
    ],
    "preempt": [
        ("select_p50_ms", "victim selection p50 ms"),
        ("select_max_ms", "victim selection max ms"),
        ("select_without_check_p99_ms", "p99 ms without the check"),
        ("select_nominated_p99_ms", "p99 ms of calls that nominated"),
        ("nominated", "gangs nominated"),
        ("victims", "victims"),
        ("start_nominated_p50_ms", "start nominated gang p50 ms"),
    ],
}
INFO["preempt_one_queue"] = INFO["preempt"]
INFO["backlog"] = [
    ("running", "running attempts"),
    ("pending", "pending jobs"),
    ("first_cycle_ms", "first cycle ms (every job new)"),
    ("first_check_ms", "  of which feasibility check ms"),
    ("idle_cycle_max_ms", "  the slowest of five ms"),
    ("idle_cycle_cpu_ms", "  CPU time, mean of five ms"),
    ("settling_cycles", "cycles reclaiming before the idle ones"),
    ("settling_cycle_max_ms", "  the slowest of them ms"),
    ("after_end_cpu_ms", "cycle after 1 % end, CPU time ms"),
    ("idle_considered", "jobs the idle cycle reached"),
    ("ended", "attempts ended"),
    ("freed_gpus", "GPUs they freed"),
    ("after_end_starts", "starts after they ended"),
    ("after_end_backfilled", "  of which backfilled"),
    ("after_end_reservations", "reservations"),
    ("free_gpus_after", "GPUs free after that cycle"),
]
RSS_LIMIT_MIB = 1024.0


def peak_rss_mib() -> float:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_child(name: str, quick: bool, seed: int, profile_dir: str | None) -> None:
    size, scale = (QUICK, 0.1) if quick else (FULL, 1.0)
    rng = random.Random(f"{seed}:{name}")
    t0 = time.perf_counter()
    if profile_dir is None:
        figures = SCENARIOS[name](size, scale, rng)
    else:
        import cProfile
        import pstats

        profiler = cProfile.Profile()
        figures = profiler.runcall(SCENARIOS[name], size, scale, rng)
        os.makedirs(profile_dir, exist_ok=True)
        path = os.path.join(profile_dir, f"{name}.prof")
        profiler.dump_stats(path)
        stats = pstats.Stats(profiler, stream=sys.stderr)
        print(f"---- {name}: top functions by cumulative time ({path}) ----", file=sys.stderr)
        stats.sort_stats("cumulative").print_stats(30)
        figures["profiled"] = True
    figures["total_s"] = time.perf_counter() - t0
    figures["peak_rss_mib"] = peak_rss_mib()
    figures["corral_from"] = os.path.dirname(os.path.dirname(sys.modules["corral"].__file__ or ""))
    figures["ok"] = True
    print(json.dumps(figures))


def run_once(name: str, args: argparse.Namespace, env: dict[str, str]) -> dict[str, Any]:
    """One scenario in a fresh interpreter; its figures, or why it failed."""
    cmd = [sys.executable, os.path.abspath(__file__), "--child", name, "--seed", str(args.seed)]
    if args.quick:
        cmd.append("--quick")
    if args.profile:
        cmd += ["--profile", args.profile]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return {
            "ok": False,
            "error": [f"TIMEOUT: killed after {args.timeout:.0f} s"],
            "process_s": time.perf_counter() - t0,
        }
    wall = time.perf_counter() - t0
    lines = proc.stdout.strip().splitlines()
    if args.profile:
        print(proc.stderr, file=sys.stderr)
    if proc.returncode != 0 or not lines:
        print(proc.stderr[-4000:], file=sys.stderr)
        return {
            "ok": False,
            "error": proc.stderr.strip().splitlines()[-1:] or ["no output"],
            "stderr": proc.stderr[-4000:],
            "process_s": wall,
        }
    figures: dict[str, Any] = json.loads(lines[-1])
    figures["process_s"] = wall
    return figures


def run_parent(names: list[str], args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """Each scenario `args.repeat` times; keeps the run with the median target figure."""
    results: dict[str, dict[str, Any]] = {}
    env = dict(os.environ, PYTHONHASHSEED="0")
    src = args.src or os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    for name in names:
        runs = []
        for i in range(args.repeat):
            print(f"running {name} ({i + 1} of {args.repeat}) ...", file=sys.stderr, flush=True)
            runs.append(run_once(name, args, env))
            if not runs[-1].get("ok"):
                break
        if not all(r.get("ok") for r in runs):
            results[name] = next(r for r in runs if not r.get("ok"))
            continue
        key = TARGETS[name][0][0]
        runs.sort(key=lambda r: r[key])
        chosen = runs[(len(runs) - 1) // 2]
        if len(runs) > 1:
            chosen["runs_" + key] = [r[key] for r in runs]
            chosen["runs_peak_rss_mib"] = max(r["peak_rss_mib"] for r in runs)
        results[name] = chosen
    return results


def source_version(src: str | None) -> str:
    """The commit benchmarked, with "+dirty" when src/ has uncommitted changes."""
    root = os.path.dirname(src) if src else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "src/corral"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return f"tree at {src}" if src else "unknown"
    return commit + ("+dirty" if dirty else "")


def fmt(value: Any) -> str:
    if isinstance(value, float):
        if value >= 1000:
            return f"{value:,.0f}"
        if value >= 10:
            return f"{value:.1f}"
        return f"{value:.3g}" if value < 1 else f"{value:.2f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def table(results: dict[str, dict[str, Any]], quick: bool) -> str:
    rows = [("scenario", "figure", "value", "target", "met")]
    for name, figures in results.items():
        if not figures.get("ok"):
            rows.append((name, "CRASHED", " ".join(figures.get("error", [])), "", "no"))
            continue
        for key, label, target, good in TARGETS[name]:
            value = figures[key]
            rows.append((name, label, fmt(value), target, "yes" if good(value) else "NO"))
            runs = figures.get("runs_" + key)
            if runs:
                met = sum(1 for v in runs if good(v))
                rows.append(
                    (
                        name,
                        f"  {len(runs)} runs (median above)",
                        " / ".join(fmt(v) for v in runs),
                        "",
                        f"{met} of {len(runs)}",
                    )
                )
        for key, label in INFO[name]:
            if key in figures:
                rows.append((name, label, fmt(figures[key]), "", ""))
        for message in figures.get("failed_checks", []):
            rows.append((name, "CHECK FAILED", message, "", "NO"))
        rss = figures["peak_rss_mib"]
        rows.append((name, "peak RSS MiB", fmt(rss), "< 1,024", "yes" if rss < RSS_LIMIT_MIB else "NO"))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    lines = []
    for i, row in enumerate(rows):
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    size = "QUICK: 1/10 size, targets are for full size" if quick else "full size"
    header = f"Corral core benchmarks ({size})"
    return header + "\n" + "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--only", help=f"comma-separated scenarios: {', '.join(SCENARIOS)}")
    parser.add_argument("--json", metavar="OUT", help="write every figure as JSON to OUT")
    parser.add_argument("--quick", action="store_true", help="run each scenario at 1/10 size (smoke test)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="run each scenario N times (fresh processes) and report the median run",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=1800.0,
        help="seconds a scenario may run before it is killed and reported (default 1800)",
    )
    parser.add_argument(
        "--profile",
        metavar="DIR",
        help="run each scenario under cProfile: DIR/NAME.prof and the top 30 on stderr "
        "(figures are then inflated)",
    )
    parser.add_argument(
        "--src",
        metavar="DIR",
        help="benchmark the corral package under DIR instead of this checkout's src/ "
        "(e.g. a `git archive` snapshot of another commit)",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        run_child(args.child, args.quick, args.seed, args.profile)
        return 0
    names = list(SCENARIOS)
    if args.only:
        names = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = [n for n in names if n not in SCENARIOS]
        if unknown:
            parser.error(f"unknown scenario {', '.join(unknown)}; known: {', '.join(SCENARIOS)}")
    version = source_version(args.src)
    load_before = os.getloadavg()[0]
    results = run_parent(names, args)
    load_after = os.getloadavg()[0]
    print(table(results, args.quick))
    print(
        f"source {version}; python {platform.python_version()}; {os.cpu_count()} CPUs; seed {args.seed}; "
        f"load average {load_before:.2f} before, {load_after:.2f} after"
        + ("; PROFILED: times are inflated" if args.profile else "")
    )
    if args.json:
        meta = {
            "python": platform.python_version(),
            "machine": platform.machine(),
            "cpus": os.cpu_count(),
            "quick": args.quick,
            "seed": args.seed,
            "date": time.strftime("%Y-%m-%d"),
            "source": version,
            "profiled": bool(args.profile),
            "loadavg_1min_before_after": [load_before, load_after],
        }
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "results": results}, f, indent=2)
    return 0 if all(r.get("ok") and not r.get("failed_checks") for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
