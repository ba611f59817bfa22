"""`server_bench.py --only backlog`: the live scheduler on a full cluster with a long backlog
(issue 15).

A generated cluster file (`--nodes` nodes of 8 GPUs, 32 to a leaf; two queues `a` and `b`, each
guaranteed half the GPUs), a real `corral server` (default policy), and a fleet of simulated node
agents in one process (bench/backlog_fleet.py: `corral.fleet`'s agents, which also record each
start order they receive and end jobs when told to). Then, over real HTTP:

1. fill: jobs submitted one by one until every GPU runs one (a quarter of the nodes hold 8-GPU
   jobs, half of them 2 x 8-GPU gangs; a quarter two 4-GPU jobs; a quarter four 2-GPU; a quarter
   eight 1-GPU), time limits 2 h to 12 h; nothing ends by itself.
2. backlog: `--pending` jobs as job arrays of `--array-size` tasks, each array of one shape (1,
   2, 4 or 8 GPUs, or a gang of 2 or 4 x 8 GPUs) and one time limit (10 min to 10 h), queues in
   turn; timed from the first POST to the last 201.
3. idle-blocked: once the scheduler has settled (no cycle for 3 s, at most `--settle` s), a
   window of `--idle` s in which nothing can start: the scheduler's CPU seconds per wall second
   (/proc/PID/stat), its cycles (`corral_scheduling_cycle_seconds` from /metrics), RSS.
4. endings: the fleet ends `--ends` fill jobs, `--rate` per second (each exits 0 and its node
   reports it). Per ended attempt, from the journal: its exit report's commit (`x.exit`) -> the
   next start of a job on any of its GPUs, by the start event's time (the cycle's clock, taken
   before it computes) and by the moment the agent received the start order; and -> the ending
   its cycle wrote. Attempts whose GPUs no job took within the window are counted apart.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.backlog_fleet import write_whole
from bench.backlog_journal import journal, next_starts

BENCH = Path(__file__).resolve().parent
LONG_LIMITS = (2, 3, 4, 6, 8, 12)  # hours: the fill's time limits
SHAPES = [((1, 1), 55), ((1, 2), 15), ((1, 4), 10), ((1, 8), 12), ((2, 8), 5), ((4, 8), 3)]  # (shape, weight)

INFO = [
    ("native_core", "compiled core (corral.native.active())"),
    ("skip_reasons", "what-if: reasons of waiting jobs neither computed nor written"),
    ("nodes", "nodes (8 GPUs each)"),
    ("joined_s", "fleet tokens + registration s"),
    ("fill_jobs", "fill jobs (every GPU busy)"),
    ("fill_s", "fill: submitted and all started s"),
    ("pending", "pending jobs (backlog)"),
    ("backlog_submit_s", "backlog submission s (arrays, HTTP)"),
    ("backlog_per_s", "backlog jobs committed per s"),
    ("settle_s", "backlog committed -> scheduler settled s"),
    ("idle_window_s", "idle-blocked window s"),
    ("idle_scheduler_cpu_pct", "idle-blocked: scheduler CPU % of one core"),
    ("idle_api_cpu_pct", "idle-blocked: API CPU %"),
    ("idle_cycles", "idle-blocked: scheduling cycles"),
    ("idle_cycle_mean_ms", "idle-blocked: cycle mean ms"),
    ("ends", "fill jobs ended by the fleet"),
    ("end_rate_per_s", "endings per s"),
    ("ends_window_s", "endings window s"),
    ("ends_scheduler_cpu_pct", "endings: scheduler CPU %"),
    ("ends_api_cpu_pct", "endings: API CPU %"),
    ("ends_cycles", "endings: scheduling cycles"),
    ("ends_cycle_mean_ms", "endings: cycle mean ms"),
    ("ends_cycle_max_bucket_ms", "endings: slowest cycle (histogram bucket bound) ms"),
    ("next_start_p50_s", "exit committed -> next start on its GPUs (journal) p50 s"),
    ("next_start_p99_s", "exit committed -> next start on its GPUs (journal) p99 s"),
    ("next_start_max_s", "exit committed -> next start on its GPUs (journal) max s"),
    ("agent_start_p50_s", "exit committed -> start order at the agent p50 s"),
    ("agent_start_p99_s", "exit committed -> start order at the agent p99 s"),
    ("agent_start_max_s", "exit committed -> start order at the agent max s"),
    ("exit_to_cycle_p50_s", "exit committed -> its ending written p50 s"),
    ("exit_to_cycle_p99_s", "exit committed -> its ending written p99 s"),
    ("matched", "ended attempts followed by a start on their GPUs"),
    ("no_next_start", "ended attempts whose GPUs nothing took in the window"),
    ("preemptions", "preemptions in the run"),
    ("scheduler_rss_max_mib", "scheduler RSS max MiB"),
    ("api_rss_max_mib", "API RSS max MiB"),
]


# ---- the cluster and the jobs ---------------------------------------------------------------
def cluster_file(path: Path, nodes: int) -> None:
    lines = ["name: backlog", "topology: [leaf]", "nodes:"]
    for i in range(0, nodes, 32):
        last = min(i + 32, nodes)
        lines.append(f'  - {{name: "n[{i + 1:05d}-{last:05d}]", gpus: 8, gpu_model: H100-80GB, '
                     f"labels: {{leaf: l{i // 32}}}}}")  # fmt: skip
    half = nodes * 8 // 2
    lines += ["queues:", f"  - {{name: a, quota: {half}}}", f"  - {{name: b, quota: {half}}}"]
    path.write_text("\n".join(lines) + "\n")


def _spec(name: str, queue: str, replicas: int, gpus: int, limit_s: int) -> dict[str, Any]:
    return {"name": name, "queue": queue, "replicas": replicas, "gpus_per_replica": gpus,
            "command": ["sleep", "1000000"], "time_limit": f"{limit_s}s"}  # fmt: skip


def fill_specs(nodes: int, seed: int) -> list[dict[str, Any]]:
    """Jobs that fill every GPU exactly, biggest first (so that a best fit packs them)."""
    rng = random.Random(seed)
    quarter = [sum(1 for i in range(nodes) if i % 4 == k) for k in range(4)]
    shapes = [(2, 8)] * (quarter[0] // 4) + [(1, 8)] * (quarter[0] - 2 * (quarter[0] // 4))
    shapes += [(1, 4)] * (2 * quarter[1]) + [(1, 2)] * (4 * quarter[2]) + [(1, 1)] * (8 * quarter[3])
    return [
        _spec(f"fill-{i}", "ab"[i % 2], r, g, 3600 * rng.choice(LONG_LIMITS))
        for i, (r, g) in enumerate(shapes)
    ]


def backlog_arrays(pending: int, size: int, seed: int) -> list[dict[str, Any]]:
    """Arrays of mixed shapes and time limits adding up to `pending` tasks."""
    rng = random.Random(seed + 1)
    shapes, weights = zip(*SHAPES, strict=True)
    out = []
    for i, first in enumerate(range(0, pending, size)):
        tasks = min(size, pending - first)
        replicas, gpus = rng.choices(shapes, weights)[0]
        limit = 60 * rng.randint(10, 600)
        spec = _spec(f"wait-{i}", "ab"[i % 2], replicas, gpus, limit)
        out.append({**spec, "array": f"0-{tasks - 1}"})
    return out


# ---- reading the server ---------------------------------------------------------------------
def metrics(http: Any) -> dict[str, Any]:
    """Free GPUs, pending jobs and the cycle histogram, from /metrics."""
    status, text = http.call_text("GET", "/metrics")
    assert status == 200, text[:300]
    out: dict[str, Any] = {"free": 0.0, "pending": 0.0, "sum": 0.0, "count": 0.0, "buckets": {}}
    for line in text.splitlines():
        if line.startswith("corral_gpus{") and 'status="free"' in line:
            out["free"] = float(line.split()[-1])
        elif line.startswith("corral_pending_jobs{"):
            out["pending"] += float(line.split()[-1])
        elif line.startswith("corral_scheduling_cycle_seconds_sum"):
            out["sum"] = float(line.split()[-1])
        elif line.startswith("corral_scheduling_cycle_seconds_count"):
            out["count"] = float(line.split()[-1])
        elif line.startswith("corral_scheduling_cycle_seconds_bucket"):
            bound = line.split('le="', 1)[1].split('"', 1)[0]
            out["buckets"][float(bound)] = float(line.split()[-1])
    return out


class Probe:
    """CPU and cycle readings at marks; RSS sampled whenever `sample()` is called."""

    def __init__(self, http: Any, api: int, scheduler: int) -> None:
        self.http, self.api, self.scheduler = http, api, scheduler
        self.rss: dict[str, list[float]] = {"api": [], "scheduler": []}

    def read(self) -> dict[str, Any]:
        from bench.server_probes import cpu_seconds

        m = metrics(self.http)
        return {"t": time.monotonic(), "api": cpu_seconds(self.api), "scheduler": cpu_seconds(self.scheduler),
                **m}  # fmt: skip

    def sample(self) -> None:
        from bench.server_probes import status_mib

        self.rss["api"].append(status_mib(self.api, "VmRSS"))
        self.rss["scheduler"].append(status_mib(self.scheduler, "VmRSS"))

    def window(self, a: dict[str, Any], b: dict[str, Any], prefix: str) -> dict[str, Any]:
        wall = b["t"] - a["t"]
        count = b["count"] - a["count"]
        out = {f"{prefix}_{p}_cpu_pct": 100 * (b[p] - a[p]) / wall for p in ("api", "scheduler")}
        out[f"{prefix}_cycles"] = int(count)
        out[f"{prefix}_cycle_mean_ms"] = 1000 * (b["sum"] - a["sum"]) / count if count else None
        done = [k for k, v in b["buckets"].items() if v - a["buckets"].get(k, 0.0) >= count]
        out[f"{prefix}_cycle_max_bucket_ms"] = 1000 * min(done) if count and done else None
        return out

    def wait(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.sample()
            time.sleep(min(1.0, max(0.0, end - time.monotonic())))


# ---- the run --------------------------------------------------------------------------------
def sizes(args: Any) -> dict[str, Any]:
    if args.quick:
        return {
            "nodes": 8,
            "pending": 2000,
            "array_size": 250,
            "idle": 2.0,
            "ends": 8,
            "rate": 8.0,
            "drain": 3.0,
        }
    return {"nodes": args.nodes, "pending": args.pending, "array_size": args.array_size,
            "idle": args.idle, "ends": args.ends, "rate": args.rate, "drain": 10.0}  # fmt: skip


def start_fleet(server: Any, cluster: Path, tmp: Path) -> tuple[subprocess.Popen[bytes], float]:
    ready, ends, stats = tmp / "fleet.ready", tmp / "fleet.ends", tmp / "fleet.json"
    cmd = [sys.executable, str(BENCH / "backlog_fleet.py"), "--server", server.url, "--token-file",
           str(server.data_dir / "admin-token"), "--cluster", str(cluster), "--ready-file", str(ready),
           "--ends-file", str(ends), "--stats-out", str(stats)]  # fmt: skip
    with open(tmp / "fleet.log", "ab") as log:
        fleet = subprocess.Popen(cmd, stdout=log, stderr=log)
    while not ready.exists():
        if fleet.poll() is not None:
            raise RuntimeError(f"the fleet exited: {(tmp / 'fleet.log').read_text()[-3000:]}")
        time.sleep(0.2)
    return fleet, float(json.loads(ready.read_text())["joined_s"])


def stop_fleet(fleet: subprocess.Popen[bytes], tmp: Path) -> dict[str, Any]:
    killed = False
    if fleet.poll() is None:
        fleet.send_signal(signal.SIGTERM)
        try:
            fleet.wait(120)
        except subprocess.TimeoutExpired:
            fleet.kill()
            killed = True
    stats = tmp / "fleet.json"
    if not stats.exists():
        why = f"exit status {fleet.returncode}"
        if killed:
            why = "it did not stop within 120 s of SIGTERM and was killed"
        raise RuntimeError(f"the fleet left no stats ({why}): {(tmp / 'fleet.log').read_text()[-3000:]}")
    out: dict[str, Any] = json.loads(stats.read_text())
    if out.get("ender_error"):
        raise RuntimeError(f"the fleet could not end jobs: {out['ender_error']}")
    return out


def until(probe: Probe, done: Any, timeout: float, what: str) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        probe.sample()
        m = probe.read()
        if done(m):
            return m
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} not within {timeout:.0f} s (last reading: free GPUs {m['free']}, "
                               f"pending {m['pending']})")  # fmt: skip
        time.sleep(0.5)


QUIET_CPU = 0.05  # settled: the scheduler's CPU over the quiet seconds below this share of a core


def settle(probe: Probe, quiet: float, timeout: float) -> dict[str, Any]:
    """Wait until no cycle has run for `quiet` seconds and the scheduler used less than
    `QUIET_CPU` of a core over them (at most `timeout`): at 100,000 pending, the scheduler
    still applies the last submissions from the journal and writes their first reasons for
    seconds after its last cycle (issue 15: a profile of the window that followed)."""
    last = probe.read()
    since, deadline = time.monotonic(), time.monotonic() + timeout
    while time.monotonic() - since < quiet and time.monotonic() < deadline:
        probe.wait(0.5)
        m = probe.read()
        busy = m["scheduler"] - last["scheduler"] > QUIET_CPU * (m["t"] - last["t"]) + 0.02
        if m["count"] != last["count"] or busy:
            last, since = m, time.monotonic()
    return probe.read()


def fill_and_queue(http: Any, probe: Probe, size: dict[str, Any], seed: int) -> dict[str, Any]:
    """Fill every GPU, then submit the backlog; the times both took."""
    t0 = time.monotonic()
    fill = fill_specs(size["nodes"], seed)
    for spec in fill:
        status, body = http.call("POST", "/v1/jobs", spec)
        assert status == 201, body
    until(probe, lambda m: m["free"] == 0 and m["pending"] == 0, 600, "every fill job started")
    out: dict[str, Any] = {"fill_jobs": len(fill), "fill_s": time.monotonic() - t0}
    t0 = time.monotonic()
    for spec in backlog_arrays(size["pending"], size["array_size"], seed):
        status, body = http.call("POST", "/v1/jobs", spec)
        assert status == 201, body
        probe.sample()
    out["backlog_submit_s"] = time.monotonic() - t0
    out.update(pending=size["pending"], backlog_per_s=size["pending"] / out["backlog_submit_s"])
    return out


def windows(
    probe: Probe, tmp: Path, size: dict[str, Any], settle_s: float, profile: str | None
) -> dict[str, Any]:
    """The idle-blocked window, then the endings' window: CPU and cycles in each (with `profile`,
    the scheduler process is profiled over the window it names: "idle" or "endings")."""
    t0 = time.monotonic()
    a = settle(probe, quiet=3.0, timeout=settle_s)
    out: dict[str, Any] = {"settle_s": a["t"] - t0}
    if profile == "idle":
        os.kill(probe.scheduler, signal.SIGUSR1)  # bench/profile_hook: cProfile from here
    probe.wait(size["idle"])
    b = probe.read()
    if profile == "idle":
        os.kill(probe.scheduler, signal.SIGUSR2)  # ... to here: the stats are written
    out.update(idle_window_s=b["t"] - a["t"], **probe.window(a, b, "idle"))
    plan = {"prefix": "fill-", "rate": size["rate"], "count": size["ends"]}
    if profile == "endings":
        os.kill(probe.scheduler, signal.SIGUSR1)
    write_whole(tmp / "fleet.ends", plan)
    probe.wait(size["ends"] / size["rate"] + size["drain"])  # the endings, then time for their starts
    c = probe.read()
    if profile == "endings":
        os.kill(probe.scheduler, signal.SIGUSR2)
    out.update(ends_window_s=c["t"] - b["t"], **probe.window(b, c, "ends"))
    return out


def phases(
    server: Any, http: Any, cluster: Path, tmp: Path, size: dict[str, Any], args: Any
) -> dict[str, Any]:
    from bench.server_probes import child_pid

    out: dict[str, Any] = {"nodes": size["nodes"]}
    fleet, out["joined_s"] = start_fleet(server, cluster, tmp)
    try:
        assert server.proc is not None
        probe = Probe(http, server.proc.pid, child_pid(server.proc.pid))
        out.update(fill_and_queue(http, probe, size, args.seed))
        out.update(windows(probe, tmp, size, args.settle, args.profile_window if args.profile else None))
    finally:
        stats = stop_fleet(fleet, tmp)
    received = {(s["job"], s["attempt"]): s["t"] for s in stats.get("started", [])}
    ended = stats.get("ended", [])
    out.update(
        ends=len(ended), end_rate_per_s=size["rate"], fleet_counts=stats.get("summary", {}).get("counts")
    )
    out.update(next_starts(journal(server.database_url), ended, received))
    out["api_rss_max_mib"] = max(probe.rss["api"], default=float("nan"))
    out["scheduler_rss_max_mib"] = max(probe.rss["scheduler"], default=float("nan"))
    return out


def bench_backlog(args: Any, tmp: Path, server_cls: Any, http_cls: Any, database: Any) -> dict[str, Any]:
    from corral import native

    size = sizes(args)
    cluster = tmp / "cluster.yaml"
    cluster_file(cluster, size["nodes"])
    env = {}
    if args.profile or args.skip_reasons:  # bench/profile_hook/sitecustomize.py, in the scheduler only
        hook = str(BENCH / "profile_hook")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [hook, os.environ.get("PYTHONPATH")]))
    if args.profile:
        env["CORRAL_BENCH_PROFILE"] = str(Path(args.profile).resolve())
    if args.skip_reasons:
        env["CORRAL_BENCH_SKIP_REASONS"] = "1"
    with database(args.database_url, tmp) as url:
        server = server_cls(url, tmp / "data", cluster, extra=["--policy", "default"], env=env)
        server.start(timeout=120)
        http = None
        try:
            http = http_cls(server.port, server.admin_token)
            out = phases(server, http, cluster, tmp, size, args)
        finally:
            if http is not None:
                http.conn.close()
            server.stop()
    out["native_core"] = native.active()
    out["skip_reasons"] = bool(args.skip_reasons)
    if args.profile:
        report_profile(Path(args.profile), args.profile_window)
    return out


def report_profile(path: Path, window: str) -> None:
    """The profile's top functions by cumulative and by own time, beside it (`OUT.txt`)."""
    import io
    import pstats

    for _ in range(50):  # the scheduler writes it on SIGUSR2
        if path.exists():
            break
        time.sleep(0.1)
    text = io.StringIO()
    stats = pstats.Stats(str(path), stream=text)
    stats.sort_stats("cumulative").print_stats(40)
    stats.sort_stats("tottime").print_stats(30)
    path.with_suffix(path.suffix + ".txt").write_text(text.getvalue())
    print(f"profile of the scheduler over the {window} window: {path}.txt", file=sys.stderr)
