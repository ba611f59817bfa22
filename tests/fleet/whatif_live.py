"""A live history for the what-if tests: a real `corral server` (API and scheduler processes,
SQLite, `--require-evidence-days 0.01`), the fleet playing its two nodes of 8 GPUs over HTTP,
and 60 jobs of two queues submitted on the wall clock (each `sleep` 0.3-1.5 s, which the fleet
"runs"), all finished; then what a history holds besides finished work: a job still running,
one cancelled while running, and (scheduling paused) one pending and one cancelled while pending.
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from corral.fleet.replay import Submission, submit_paced
from tests.server.harness import Server

CLUSTER = """name: whatif
topology: [leaf]
nodes:
  - {name: "n[1-2]", gpus: 8, gpu_model: H100-80GB, labels: {leaf: l0}}
queues:
  - {name: research, weight: 1, quota: 4}
  - {name: prod, weight: 1, quota: 4}
"""
JOBS = 60
REQUIRED_DAYS = 0.01  # 14.4 minutes: a what-if over the last hour is enough, one over 5 minutes is not


@dataclass
class LiveHistory:
    server: Server
    jobs: list[Submission]  # the trace's submissions (offset, key, spec)
    ids: dict[str, str]  # trace key -> server job id
    extra: dict[str, str]  # running, cancelled_running, pending, cancelled_pending -> server job id
    tmp: Path


def trace(seed: int = 7) -> list[Submission]:
    rng = random.Random(seed)
    out: list[Submission] = []
    for i in range(JOBS):
        queue = "research" if i % 3 else "prod"
        gpus = rng.choice((1, 2, 4, 8))
        run = round(rng.uniform(0.3, 1.5), 3)
        spec = {
            "name": f"t{i}", "queue": queue, "replicas": 1, "gpus_per_replica": gpus,
            "command": ["sleep", f"{run}"], "time_limit": "10m",
        }  # fmt: skip
        out.append((i * 0.12, f"t{i}", spec))
    return out


def _wait(server: Server, ids: list[str], states: set[str], timeout: float = 120.0) -> None:
    deadline = time.time() + timeout
    with server.client() as c:
        while time.time() < deadline:
            found = {i: c.get(f"/v1/jobs/{i}").json()["state"] for i in ids}
            if all(s in states for s in found.values()):
                return
            time.sleep(0.2)
    raise AssertionError(f"jobs did not reach {states} within {timeout} s: {found}")


def _submit(server: Server, spec: dict[str, Any]) -> str:
    with server.client() as c:
        r = c.post("/v1/jobs", json=spec)
        assert r.status_code == 201, r.text
        return str(r.json()["id"])


def _extras(server: Server) -> dict[str, str]:
    long = {"queue": "research", "replicas": 1, "gpus_per_replica": 2, "command": ["sleep", "600"]}
    extra = {"running": _submit(server, {**long, "name": "still-running"})}
    extra["cancelled_running"] = _submit(server, {**long, "name": "cancelled-running"})
    _wait(server, list(extra.values()), {"running"})
    with server.client() as c:
        assert c.post(f"/v1/jobs/{extra['cancelled_running']}/cancel").status_code == 200
        _wait(server, [extra["cancelled_running"]], {"cancelled"})
        assert c.post("/v1/admin/pause").status_code == 200
        extra["pending"] = _submit(server, {**long, "name": "pending"})
        extra["cancelled_pending"] = _submit(server, {**long, "name": "cancelled-pending"})
        assert c.post(f"/v1/jobs/{extra['cancelled_pending']}/cancel").status_code == 200
    return extra


def live_history(tmp: Path) -> Iterator[LiveHistory]:
    cluster = tmp / "cluster.yaml"
    cluster.write_text(CLUSTER)
    extra_args = ["--require-evidence-days", str(REQUIRED_DAYS)]
    server = Server(f"sqlite:///{tmp / 'corral.db'}", tmp / "data", cluster, extra=extra_args)
    server.start(timeout=120)
    fleet: subprocess.Popen[bytes] | None = None
    try:
        ready = tmp / "fleet.ready"
        cmd = [sys.executable, "-m", "corral.fleet", "--server", server.url, "--token-file"]
        cmd += [str(tmp / "data" / "admin-token"), "--cluster", str(cluster), "--ready-file", str(ready)]
        with open(tmp / "fleet.log", "ab") as log:
            fleet = subprocess.Popen(cmd, stdout=log, stderr=log)
        while not ready.exists():
            assert fleet.poll() is None, (tmp / "fleet.log").read_text()[-3000:]
            time.sleep(0.1)
        jobs = trace()
        submitted = submit_paced(server.url, server.admin_token, jobs, time.time() + 0.5)
        assert not submitted.refused, submitted.refused
        _wait(server, list(submitted.ids.values()), {"finished"})
        extra = _extras(server)
        yield LiveHistory(server, jobs, submitted.ids, extra, tmp)
    finally:
        if fleet is not None and fleet.poll() is None:
            fleet.send_signal(signal.SIGTERM)
            try:
                fleet.wait(60)
            except subprocess.TimeoutExpired:
                fleet.kill()
        server.stop()
