"""A live run for the shadow replay and the fleet benchmark: a real `corral server` (API and
scheduler processes), the fleet (`python -m corral.fleet`) playing every node of the cluster
file, and a trace submitted on the wall clock, until every submitted job has started.

Also what both sides of a shadow replay need from a trace: the trace compressed by a factor
(submit times and durations divided by it), the job specs the live side submits (`sleep` the
compressed duration, which the fleet "runs"), and `corral simulate` run on the same trace.
"""

from __future__ import annotations

import dataclasses
import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from corral.fleet.replay import EventTail, Submission, Submitted, submit_paced
from corral.sim.trace import TraceJob, write_trace
from tests.server.harness import Server

CLI = [sys.executable, "-c", "from corral.cli.main import main; main()"]


# ---- the trace, on both sides ---------------------------------------------------------------
def compress(jobs: list[TraceJob], factor: float) -> list[TraceJob]:
    """Submit times, durations and time limits divided by `factor` (the compressed clock)."""
    return [
        dataclasses.replace(
            j,
            submit_time=j.submit_time / factor,
            duration=j.duration / factor,
            time_limit=None if j.time_limit is None else j.time_limit / factor,
        )
        for j in jobs
    ]


def submissions(jobs: list[TraceJob], default_queue: str) -> list[Submission]:
    """The job specs the live side posts: the same shape and queue, `sleep` the duration."""
    out: list[Submission] = []
    for j in sorted(jobs, key=lambda j: j.submit_time):  # stable: ties keep the trace's order
        spec: dict[str, Any] = {
            "name": j.job_id, "queue": j.queue or default_queue, "replicas": j.replicas,
            "gpus_per_replica": j.gpus_per_replica, "command": ["sleep", f"{j.duration:.6f}"],
        }  # fmt: skip
        if j.time_limit is not None:
            spec["time_limit"] = f"{max(1, round(j.time_limit))}s"
        out.append((j.submit_time, j.job_id, spec))
    return out


def simulate(
    cluster: Path, jobs: list[TraceJob], out: Path, policy: str, *extra: str
) -> list[dict[str, Any]]:
    """`corral simulate` on the trace (no topology slowdown or restart overhead: the fleet runs
    each job for exactly its duration); returns its event log."""
    trace = out.with_suffix(".csv")
    write_trace(trace, jobs)
    cmd = [*CLI, "simulate", "--cluster", str(cluster), "--trace", str(trace), "--policy", policy]
    cmd += ["--slowdown", "0,0,0", "--restart-overhead", "0", "--events-out", str(out), "--json", *extra]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    return [json.loads(line) for line in out.read_text().splitlines() if line.strip()]


# ---- the live side ------------------------------------------------------------------------
@dataclass
class LiveRun:
    events: list[dict[str, Any]]
    names: dict[str, str]  # server job id -> trace job id
    origin: float  # wall time of the trace's t = 0
    submitted: Submitted
    fleet: dict[str, Any]  # the fleet's --stats-out: counts and every request's latency
    started_all: bool  # every submitted job started before the deadline
    samples: dict[str, list[float]]  # what `sample` returned each second, by key


def run_live(
    cluster: Path,
    jobs: list[Submission],
    tmp: Path,
    *,
    policy: str = "default",
    timeout: float = 600.0,
    cap: float | None = None,
    fleet_args: tuple[str, ...] = ("--register-concurrency", "1"),
    before: Callable[[Server, int], None] | None = None,
    sample: Callable[[Server, int], dict[str, float]] | None = None,
    after: Callable[[Server, int], None] | None = None,
) -> LiveRun:
    """Start the server and the fleet, submit `jobs` on the wall clock, wait until each has
    started (or `timeout` s after the last submission; with `cap`, no submission later than
    `cap` s into the trace, and no wait past `timeout` s after that: `submitted` says how many
    went). The hooks get the server and the fleet's pid: `before` once the fleet is ready
    (before the first submission), `sample` every second and `after` once every job has started,
    all while the server and the fleet still run."""
    server = Server(f"sqlite:///{tmp / 'corral.db'}", tmp / "data", cluster, extra=["--policy", policy])
    server.start(timeout=120)
    fleet: subprocess.Popen[bytes] | None = None
    stats, ready = tmp / "fleet.json", tmp / "fleet.ready"
    samples: dict[str, list[float]] = {}
    try:
        token = server.admin_token
        cmd = [sys.executable, "-m", "corral.fleet", "--server", server.url, "--token-file"]
        cmd += [str(tmp / "data" / "admin-token"), "--cluster", str(cluster), "--stats-out", str(stats)]
        cmd += ["--ready-file", str(ready), *fleet_args]
        with open(tmp / "fleet.log", "ab") as log:
            fleet = subprocess.Popen(cmd, stdout=log, stderr=log)
        while not ready.exists():
            if fleet.poll() is not None:
                raise RuntimeError(f"the fleet exited: {(tmp / 'fleet.log').read_text()[-3000:]}")
            time.sleep(0.1)
        if before is not None:
            before(server, fleet.pid)
        origin = time.time() + 1.0
        box: list[Submitted] = []
        stop_at = None if cap is None else origin + cap
        submitter = threading.Thread(
            target=lambda: box.append(submit_paced(server.url, token, jobs, origin, stop_at))
        )
        submitter.start()
        tail = EventTail(server.url, token)
        started: set[str] = set()
        deadline = origin + (jobs[-1][0] if jobs else 0.0) + timeout
        if stop_at is not None:
            deadline = min(deadline, stop_at + timeout)
        while time.time() < deadline:
            time.sleep(1.0)
            started.update(e["job"] for e in tail.poll() if e["event"] == "start")
            if sample is not None:
                for key, value in sample(server, fleet.pid).items():
                    samples.setdefault(key, []).append(value)
            if box and set(box[0].ids.values()) <= started:
                break
        submitter.join()
        if after is not None:
            after(server, fleet.pid)
        tail.poll()
        tail.close()
        submitted = box[0]
        done = set(submitted.ids.values()) <= {e["job"] for e in tail.events if e["event"] == "start"}
    finally:
        if fleet is not None and fleet.poll() is None:
            fleet.send_signal(signal.SIGTERM)
            try:
                fleet.wait(120)
            except subprocess.TimeoutExpired:
                fleet.kill()
                print(
                    f"the fleet did not stop within 120 s of SIGTERM: killed; {tmp / 'fleet.log'}",
                    file=sys.stderr,
                )
        server.stop()
    names = {v: k for k, v in submitted.ids.items()}
    fleet_stats = json.loads(stats.read_text()) if stats.exists() else {}
    return LiveRun(tail.events, names, origin, submitted, fleet_stats, done, samples)
