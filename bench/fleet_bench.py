"""The control plane under a fleet of node agents while a real trace runs.

Run: `.venv/bin/python bench/fleet_bench.py [--nodes 1000,10000] [--jobs 3000] [--window 90]
[--idle 15] [--json OUT] [--keep DIR]`.

For each fleet size: a generated cluster file (N nodes of 8 GPUs, 32 to a leaf, one queue per
Philly virtual cluster), a real `corral server` (API and scheduler processes, SQLite), and the
fleet (`python -m corral.fleet`, one asyncio process: an agent token per node, registration,
a heartbeat every 5 s per node over a pool of 64 keep-alive connections, one long poll per
node on its own connection, each job "run" for its duration). `--settle` seconds after the
fleet is up, `--idle` seconds of heartbeats alone are measured (the idle window); then the
first `--jobs` Philly jobs from 2017-10-03 are submitted over HTTP at their submit times
compressed to span `--window` seconds (durations compressed alike). The trace window ends when
every job has started; submissions stop `--cap` seconds into the trace and the wait for starts
`--timeout` seconds after that, so a control plane that cannot keep up ends the run too (the
table says how many were submitted).

Figures, per window: submission latency (the submitter: one keep-alive `http.client`
connection in this process), heartbeat and report latency (the fleet: from sending the request
to its answer; the time a heartbeat was due but not yet sent is given apart, so a saturated
client shows), scheduling cycles (the `corral_scheduling_cycle_seconds` histogram, read from
the server's prometheus multiprocess files: count, mean, and the bucket bounds of p50 and p99),
RSS of the API and scheduler processes (sampled every second), CPU of the API, scheduler and
fleet processes; from the server's journal afterwards, first start - submit per job and, per
ended attempt, the time from its exit report's commit to the ending its cycle wrote.
docs/benchmarks.md ("Fleet") records results.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.fleet.harness import compress, run_live, submissions  # noqa: E402
from tests.server.harness import Server  # noqa: E402

from corral.fleet.stats import Recorder, percentile  # noqa: E402
from corral.sim.loaders.philly import load_philly  # noqa: E402

CLK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def scheduler_pid(api: int) -> int:
    with open(f"/proc/{api}/task/{api}/children") as f:
        return int(f.read().split()[0])


def cycles(server: Server) -> dict[str, Any]:
    """The cycle-time histogram as the scheduler process wrote it (multiprocess files)."""
    from prometheus_client import CollectorRegistry
    from prometheus_client.multiprocess import MultiProcessCollector

    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(server.data_dir / "metrics"))
    buckets: dict[float, float] = {}
    total = count = 0.0
    for metric in registry.collect():
        if metric.name != "corral_scheduling_cycle_seconds":
            continue
        for s in metric.samples:
            if s.name.endswith("_bucket"):
                buckets[float(s.labels["le"])] = buckets.get(float(s.labels["le"]), 0.0) + s.value
            elif s.name.endswith("_sum"):
                total += s.value
            elif s.name.endswith("_count"):
                count += s.value
    return {"buckets": buckets, "sum": total, "count": count}


def cycle_figures(first: dict[str, Any], last: dict[str, Any]) -> dict[str, Any]:
    """Cycles between two histogram reads: count, mean, p50 and p99 as bucket upper bounds."""
    count = last["count"] - first["count"]
    out: dict[str, Any] = {
        "cycles": int(count),
        "cycle_mean_ms": None,
        "cycle_p50_ms": None,
        "cycle_p99_ms": None,
    }
    if count <= 0:
        return out
    out["cycle_mean_ms"] = 1000 * (last["sum"] - first["sum"]) / count
    for p in (50, 99):
        for bound in sorted(last["buckets"]):
            if last["buckets"][bound] - first["buckets"].get(bound, 0.0) >= count * p / 100:
                out[f"cycle_p{p}_ms"] = 1000 * bound if bound != float("inf") else float("inf")
                break
    return out


ENDINGS = ("finish", "fail", "restart", "preempt", "lost", "cancel")


def delays(db: Path, after: float) -> dict[str, Any]:
    """From the server's journal: first start - submit per job, and per ended attempt, its last
    exit report's commit (`x.exit`) -> the ending the scheduler wrote (the report's cycle)."""
    import sqlite3

    conn = sqlite3.connect(db)
    try:
        rows = conn.execute("SELECT kind, t, body FROM events WHERE t >= ? ORDER BY seq", (after,)).fetchall()
    finally:
        conn.close()
    submitted: dict[str, float] = {}
    waits: list[float] = []
    exits: dict[tuple[str, int], float] = {}
    to_cycle: list[float] = []
    for kind, t, body in rows:
        event = json.loads(body)
        job = event.get("job")
        if kind == "submit":
            submitted[job] = t
        elif kind == "start" and event["attempt"] == 1 and job in submitted:
            waits.append(t - submitted[job])
        elif kind == "x.exit":
            exits[(job, event["attempt"])] = t
        elif kind in ENDINGS and (job, event.get("attempt")) in exits:
            to_cycle.append(t - exits.pop((job, event["attempt"])))
    return {
        "start_wait_p50_s": percentile(waits, 50), "start_wait_p99_s": percentile(waits, 99),
        "exit_to_cycle_p50_s": percentile(to_cycle, 50), "exit_to_cycle_p99_s": percentile(to_cycle, 99),
    }  # fmt: skip


def cluster_file(path: Path, nodes: int, queues: list[str]) -> None:
    lines = ["name: fleet", "topology: [leaf]", "nodes:"]
    for i in range(0, nodes, 32):
        last = min(i + 32, nodes)
        lines.append(f'  - {{name: "n[{i + 1:05d}-{last:05d}]", gpus: 8, gpu_model: H100-80GB, '
                     f"labels: {{leaf: l{i // 32}}}}}")  # fmt: skip
    lines += ["queues:", *(f"  - {{name: {q}}}" for q in queues)]
    path.write_text("\n".join(lines) + "\n")


class Probe:
    """What the hooks of `run_live` record: windows, CPU, RSS, cycle histograms."""

    def __init__(self, idle: float, settle: float) -> None:
        self.idle = idle
        self.settle = settle
        self.marks: dict[str, Any] = {}
        self.rss: dict[str, list[float]] = {"api": [], "scheduler": []}

    def _read(self, server: Server, fleet: int) -> dict[str, Any]:
        assert server.proc is not None
        api = server.proc.pid
        sched = scheduler_pid(api)
        return {"t": time.time(), "api": cpu_s(api), "scheduler": cpu_s(sched), "fleet": cpu_s(fleet),
                "cycles": cycles(server)}  # fmt: skip

    def before(self, server: Server, fleet: int) -> None:
        time.sleep(self.settle)  # the first long polls of every node (each a token lookup) settle
        self.marks["idle_start"] = self._read(server, fleet)
        time.sleep(self.idle)
        self.marks["idle_end"] = self._read(server, fleet)

    def sample(self, server: Server, fleet: int) -> dict[str, float]:
        assert server.proc is not None
        self.rss["api"].append(rss_mib(server.proc.pid))
        self.rss["scheduler"].append(rss_mib(scheduler_pid(server.proc.pid)))
        return {}

    def after(self, server: Server, fleet: int) -> None:
        self.marks["trace_end"] = self._read(server, fleet)


def window(
    probe: Probe, first: str, last: str, fleet: Recorder, start: float | None = None
) -> dict[str, Any]:
    a, b = probe.marks[first], probe.marks[last]
    t0 = a["t"] if start is None else start
    span = b["t"] - t0
    out: dict[str, Any] = {"window_s": span}
    for proc in ("api", "scheduler", "fleet"):
        out[f"{proc}_cpu_pct"] = 100 * (b[proc] - a[proc]) / (b["t"] - a["t"])
    out.update(cycle_figures(a["cycles"], b["cycles"]))
    summary = fleet.summary(t0, b["t"])
    for kind in ("heartbeat", "report.running", "report.exited"):
        if kind in summary:
            out[f"{kind}_per_s"] = summary[kind]["per_s"]
            out[f"{kind}_p50_ms"] = summary[kind]["p50_ms"]
            out[f"{kind}_p99_ms"] = summary[kind]["p99_ms"]
    if "heartbeat.late" in summary:
        out["heartbeat_late_p99_ms"] = summary["heartbeat.late"]["p99_ms"]
    return out


def bench(nodes: int, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    jobs = load_philly(window=("2017-10-03 00:00:00", "2017-12-31 00:00:00"))[: args.jobs]
    origin = jobs[0].submit_time
    jobs = [dataclasses.replace(j, queue=f"q{j.queue}", submit_time=j.submit_time - origin) for j in jobs]
    speed = jobs[-1].submit_time / args.window
    cluster = tmp / "cluster.yaml"
    cluster_file(cluster, nodes, sorted({str(j.queue) for j in jobs}))
    probe = Probe(args.idle, args.settle)
    began = time.monotonic()
    run = run_live(
        cluster, submissions(compress(jobs, speed), "default"), tmp / "live", timeout=args.timeout,
        cap=args.cap,
        fleet_args=("--register-concurrency", "32"), before=probe.before, sample=probe.sample,
        after=probe.after,
    )  # fmt: skip
    fleet = Recorder.load(run.fleet["samples"])
    trace = window(probe, "idle_end", "trace_end", fleet, start=run.origin)
    sent, took = run.submitted.sent, run.submitted.took
    trace.update(
        submit_per_s=len(took) / trace["window_s"], submit_p50_ms=1000 * percentile(took, 50),
        submit_p99_ms=1000 * percentile(took, 99), submit_max_ms=1000 * max(took, default=float("nan")),
    )  # fmt: skip
    trace.update(delays(tmp / "live" / "corral.db", run.origin))
    register = fleet.summary().get("register", {})
    return {
        "nodes": nodes, "jobs": len(jobs), "submitted": len(run.submitted.ids), "speed": speed,
        "started_all": run.started_all,
        "refused": len(run.submitted.refused), "joined_s": run.fleet.get("joined_s"),
        "register_p99_ms": register.get("p99_ms"), "counts": run.fleet["summary"]["counts"],
        "errors": fleet.summary()["errors"], "total_s": time.monotonic() - began,
        "api_rss_max_mib": max(probe.rss["api"], default=None),
        "scheduler_rss_max_mib": max(probe.rss["scheduler"], default=None),
        "idle": window(probe, "idle_start", "idle_end", fleet), "trace": trace,
        "first_submit": min(sent, default=None),
    }  # fmt: skip


ROWS = [
    ("window_s", "window s"),
    ("submit_per_s", "submissions/s"),
    ("submit_p50_ms", "submit p50 ms"),
    ("submit_p99_ms", "submit p99 ms"),
    ("heartbeat_per_s", "heartbeats/s"),
    ("heartbeat_p50_ms", "heartbeat p50 ms"),
    ("heartbeat_p99_ms", "heartbeat p99 ms"),
    ("heartbeat_late_p99_ms", "heartbeat sent late (client) p99 ms"),
    ("report.exited_per_s", "exit reports/s"),
    ("report.exited_p99_ms", "exit report p99 ms"),
    ("start_wait_p50_s", "first start - submit p50 s"),
    ("start_wait_p99_s", "first start - submit p99 s"),
    ("exit_to_cycle_p50_s", "exit report committed -> its cycle p50 s"),
    ("exit_to_cycle_p99_s", "exit report committed -> its cycle p99 s"),
    ("cycles", "scheduling cycles"),
    ("cycle_mean_ms", "cycle mean ms"),
    ("cycle_p50_ms", "cycle p50 ms (bucket bound)"),
    ("cycle_p99_ms", "cycle p99 ms (bucket bound)"),
    ("api_cpu_pct", "API process CPU %"),
    ("scheduler_cpu_pct", "scheduler process CPU %"),
    ("fleet_cpu_pct", "fleet process CPU %"),
]


def fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.2f}" if abs(value) >= 1 else f"{value:.3f}"
    return str(value)


def report(results: list[dict[str, Any]]) -> str:
    head = ["figure"] + [f"{r['nodes']:,} nodes, {w}" for r in results for w in ("idle", "trace")]
    rows = [head]
    for key, label in ROWS:
        rows.append([label] + [fmt(r[w].get(key)) for r in results for w in ("idle", "trace")])
    for key, label in (
        ("api_rss_max_mib", "API RSS max MiB"),
        ("scheduler_rss_max_mib", "scheduler RSS max MiB"),
        ("joined_s", "tokens + registration s"),
        ("jobs", "jobs"),
        ("submitted", "submitted"),
        ("started_all", "all submitted started"),
    ):
        rows.append([label] + [v for r in results for v in ("", fmt(r[key]))])  # fmt: skip
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", default="1000,10000", help="fleet sizes, comma-separated")
    parser.add_argument("--jobs", type=int, default=3000, help="Philly jobs submitted (default 3,000)")
    parser.add_argument("--window", type=float, default=90.0, help="seconds the submissions span")
    parser.add_argument(
        "--idle", type=float, default=15.0, help="seconds of heartbeats alone before the trace"
    )
    parser.add_argument(
        "--settle", type=float, default=20.0, help="seconds after the fleet is up, before that"
    )
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for starts at the end")
    parser.add_argument(
        "--cap", type=float, default=240.0, help="no submission later than this many seconds into the trace"
    )
    parser.add_argument("--json", metavar="OUT")
    parser.add_argument("--keep", metavar="DIR", help="keep the logs here")
    args = parser.parse_args(argv)
    results = []
    load = [os.getloadavg()[0]]
    for n in (int(x) for x in args.nodes.split(",")):
        print(f"fleet of {n:,} nodes ...", file=sys.stderr, flush=True)
        tmp = Path(args.keep) / str(n) if args.keep else Path(tempfile.mkdtemp(prefix="corral-fleet-"))
        tmp.mkdir(parents=True, exist_ok=True)
        try:
            results.append(bench(n, args, tmp))
        finally:
            if not args.keep:
                shutil.rmtree(tmp, ignore_errors=True)
        load.append(os.getloadavg()[0])
    print(report(results))
    for r in results:
        print(f"{r['nodes']:,} nodes: counts {r['counts']}; errors {r['errors']}; clock x{r['speed']:.0f}")
    print("load average (1 min) before and after each size: " + ", ".join(f"{x:.2f}" for x in load))
    if args.json:
        Path(args.json).write_text(
            json.dumps({"args": vars(args), "load": load, "results": results}, indent=2)
        )
    return 0 if all(r["started_all"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
