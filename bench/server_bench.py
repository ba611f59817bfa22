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
import http.client
import json
import multiprocessing as mp
import os
import platform
import queue
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.server.harness import Server, drop_postgres, fresh_postgres  # noqa: E402

LAB = ROOT / "examples" / "lab.yaml"
CLK = os.sysconf("SC_CLK_TCK")
MIB = 1024 * 1024
SPEC = {"name": "bench", "queue": "research", "gpus_per_replica": 1, "command": ["python", "train.py"]}

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


# ---- processes ------------------------------------------------------------------------------
def cpu_seconds(pid: int) -> float:
    """User + system CPU of one process so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK


def run_queue_wait(pid: int) -> float:
    """Seconds the process's main thread was runnable but waiting for a CPU (Linux schedstat)."""
    try:
        with open(f"/proc/{pid}/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


def status_mib(pid: int, key: str) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    return 0.0


def child_pid(pid: int, timeout: float = 10.0) -> int:
    """The scheduler: the API process's child."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/task/{pid}/children") as f:
                kids = f.read().split()
        except OSError:
            kids = []
        if kids:
            return int(kids[0])
        time.sleep(0.01)
    raise RuntimeError(f"process {pid} started no scheduler within {timeout} s")


def api_pid(server: Server) -> int:
    assert server.proc is not None
    return server.proc.pid


@contextmanager
def database(admin_url: str | None, tmp: Path) -> Iterator[str]:
    """A fresh database: SQLite under `tmp`, or a new database on the PostgreSQL server."""
    if not admin_url:
        yield f"sqlite:///{tmp / 'corral.db'}"
        return
    url, name = fresh_postgres(admin_url)
    try:
        yield url
    finally:
        drop_postgres(admin_url, name)


def percentile(values: list[float], p: float) -> float:
    """Nearest rank: p99 of 200 samples is the 198th smallest."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    rank = max(1, int(-(-p * len(ordered) // 100)))
    return ordered[rank - 1]


def loads_in(log: Path) -> list[float]:
    """The `state loaded in X ms` figures the scheduler has logged so far."""
    out = []
    for line in log.read_text(errors="replace").splitlines():
        if "state loaded in" in line:
            out.append(float(line.split("state loaded in", 1)[1].split("ms", 1)[0]))
    return out


def wait_until(fn: Callable[[], Any], timeout: float, interval: float = 0.005) -> float:
    """Poll `fn` until truthy; returns the monotonic time it became so."""
    deadline = time.monotonic() + timeout
    while not fn():
        if time.monotonic() > deadline:
            raise RuntimeError(f"condition not met within {timeout} s")
        time.sleep(interval)
    return time.monotonic()


# ---- a: submissions per second --------------------------------------------------------------
def _load_worker(port: int, token: str, threads: int, start: float, window: tuple[float, float],
                 stop: float, out: Any, keyed: bool = False) -> None:  # fmt: skip
    """One client process: `threads` keep-alive connections in a closed loop until `stop`;
    `keyed`: each submission with a fresh `Idempotency-Key`."""
    body = json.dumps(SPEC)
    base = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    results: list[tuple[int, int, list[float], list[str]]] = []
    lock = threading.Lock()

    def loop() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        acked = errors = 0
        lat: list[float] = []
        ids: list[str] = []
        while time.monotonic() < start:
            time.sleep(0.001)
        while (sent := time.monotonic()) < stop:
            headers = {**base, "Idempotency-Key": uuid.uuid4().hex} if keyed else base
            try:
                conn.request("POST", "/v1/jobs", body, headers)
                response = conn.getresponse()
                data = response.read()
            except (OSError, http.client.HTTPException):
                errors += 1
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                continue
            done = time.monotonic()
            if response.status != 201:
                errors += 1
                continue
            ids.append(json.loads(data)["id"])
            if window[0] <= done < window[1]:
                acked += 1
                lat.append(done - sent)
        conn.close()
        with lock:
            results.append((acked, errors, lat, ids))

    cpu0 = os.times()
    workers = [threading.Thread(target=loop) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    cpu1 = os.times()
    cpu = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)
    out.put({
        "acked": sum(r[0] for r in results), "errors": sum(r[1] for r in results),
        "lat": [x for r in results for x in r[2]], "ids": [x for r in results for x in r[3]], "cpu": cpu,
    })  # fmt: skip


def bench_submit(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    from bench.server_replicas import cycle_figures, cycle_histogram, start_replicas

    warmup, measure = (1.0, 3.0) if args.quick else (2.0, args.duration)
    with database(args.database_url, tmp) as url:
        servers = start_replicas(url, tmp, LAB, args.replicas)
        try:
            pids = [api_pid(s) for s in servers]
            sched = child_pid(pids[0])
            token = servers[0].admin_token
            ctx = mp.get_context("fork")
            out = ctx.Queue()
            start = time.monotonic() + 1.0
            window = (start + warmup, start + warmup + measure)
            ports = [servers[i % len(servers)].port for i in range(args.clients)]
            work = (token, args.threads, start, window, window[1], out, args.keyed)
            procs = [ctx.Process(target=_load_worker, args=(port, *work)) for port in ports]
            for p in procs:
                p.start()
            wait_until(lambda: time.monotonic() >= window[0], warmup + 5)
            api0, sch0, cyc0 = sum(map(cpu_seconds, pids)), cpu_seconds(sched), cycle_histogram(servers[0])
            wait_until(lambda: time.monotonic() >= window[1], measure + 5, 0.01)
            api1, sch1, cyc1 = sum(map(cpu_seconds, pids)), cpu_seconds(sched), cycle_histogram(servers[0])
            restarts = servers[0].log.read_text(errors="replace").count("restarting it")
            parts = [out.get(timeout=60) for _ in procs]
            for p in procs:
                p.join(30)
        finally:
            for server in servers:
                server.stop()
        ids = {i for part in parts for i in part["ids"]}
        from sqlalchemy import create_engine, text

        engine = create_engine(url)
        with engine.connect() as conn:
            stored = {r[0] for r in conn.execute(text("SELECT id FROM jobs"))}
        engine.dispose()
    lat = [x for part in parts for x in part["lat"]]
    acked = sum(part["acked"] for part in parts)
    return {
        "submits_per_s": acked / measure,
        "client": f"{args.clients} processes x {args.threads} threads, keep-alive http.client, closed loop"
        + (f", over {args.replicas} replicas" if args.replicas > 1 else "")
        + (", Idempotency-Key on each" if args.keyed else ""),
        "client_cpu_pct": 100 * sum(part["cpu"] for part in parts) / (warmup + measure),
        "api_cpu_pct": 100 * (api1 - api0) / measure,
        "scheduler_cpu_pct": 100 * (sch1 - sch0) / measure,
        "p50_ms": 1000 * percentile(lat, 50),
        "p99_ms": 1000 * percentile(lat, 99),
        "acked": acked,
        "errors": sum(part["errors"] for part in parts),
        "stored_ok": ids <= stored,
        "window_s": measure,
        "per_api_cpu_s": acked / max(1e-9, api1 - api0),
        "scheduler_restarts": restarts,
        **cycle_figures(cyc0, cyc1),
    }


# ---- b: submit-to-decision latency ----------------------------------------------------------
class _Http:
    """A keep-alive JSON client for one token."""

    IDLE = 3.0  # seconds: uvicorn closes a keep-alive connection idle for 5 s; reconnect before that

    def __init__(self, port: int, token: str) -> None:
        self.port = port
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        self.headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        self.used = time.monotonic()

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        if time.monotonic() - self.used > self.IDLE:
            self.conn.close()
            self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        self.conn.request(method, path, json.dumps(body) if body is not None else None, self.headers)
        response = self.conn.getresponse()
        data = response.read()
        self.used = time.monotonic()
        return response.status, json.loads(data) if data else None

    def call_text(self, method: str, path: str) -> tuple[int, str]:
        """A request whose answer is text (`/metrics`)."""
        self.conn.close()
        self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        self.conn.request(method, path, None, self.headers)
        response = self.conn.getresponse()
        text = response.read().decode()
        self.used = time.monotonic()
        return response.status, text


def bench_latency(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    samples = 50 if args.quick else args.samples
    with database(args.database_url, tmp) as url:
        server = Server(url, tmp / "data", LAB)
        server.start()
        try:
            return _latency(server, samples)
        finally:
            server.stop()


def _latency(server: Server, samples: int) -> dict[str, Any]:
    agent_token = server.token("agent-dgx01", "agent")
    user, agent, poller = (_Http(server.port, t) for t in (server.admin_token, agent_token, agent_token))
    status, reg = agent.call(
        "POST", "/v1/agents/register", {"node": "dgx01", "gpus": 8, "gpu_model": "H100-80GB"}
    )
    assert status == 200, reg
    incarnation = reg["incarnation"]
    orders: queue.Queue[tuple[float, dict[str, Any]]] = queue.Queue()
    stop = threading.Event()

    def poll() -> None:
        after = 0
        while not stop.is_set():
            try:
                _, body = poller.call("GET", f"/v1/agents/dgx01/assignments?after={after}&wait=5")
            except (OSError, http.client.HTTPException):
                return  # the server is stopping
            now = time.monotonic()
            for order in body["orders"]:
                orders.put((now, order))
                after = order["seq"]

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    time.sleep(0.3)  # the long poll is waiting
    to_agent, to_ack, ids = [], [], []
    for _ in range(samples):
        sent = time.monotonic()
        status, job = user.call("POST", "/v1/jobs", SPEC)
        acked = time.monotonic()
        assert status == 201, job
        while True:
            seen, order = orders.get(timeout=10)
            if order["kind"] == "start" and order["job"] == job["id"]:
                break
        to_agent.append(seen - sent)
        to_ack.append(acked - sent)
        ids.append(job["id"])
        report = {"incarnation": incarnation, "job": job["id"], "attempt": order["attempt"]}
        for status_, code in (("running", None), ("exited", 0)):
            status, body = agent.call(
                "POST", "/v1/agents/dgx01/reports", dict(report, status=status_, exit_code=code)
            )
            assert status == 200, body
        wait_until(lambda j=job["id"]: user.call("GET", f"/v1/jobs/{j}")[1]["state"] == "finished", 10, 0.002)
    stop.set()
    status, events = user.call("GET", "/v1/events?limit=10000")
    server_side = _server_side(events, set(ids)) if status == 200 else []
    out = {
        "samples": samples,
        "p50_ms": 1000 * percentile(to_agent, 50),
        "p99_ms": 1000 * percentile(to_agent, 99),
        "max_ms": 1000 * max(to_agent),
        "ack_p50_ms": 1000 * percentile(to_ack, 50),
        "ack_p99_ms": 1000 * percentile(to_ack, 99),
    }
    if server_side:
        out["server_p50_ms"] = 1000 * percentile(server_side, 50)
        out["server_p99_ms"] = 1000 * percentile(server_side, 99)
    return out


def _server_side(events: Any, ids: set[str]) -> list[float]:
    """start.t - submit.t for each job, from the event log (the server's own clock)."""
    rows = events if isinstance(events, list) else events.get("events", [])
    submit = {e["job"]: e["t"] for e in rows if e.get("event") == "submit" and e.get("job") in ids}
    return [e["t"] - submit[e["job"]] for e in rows if e.get("event") == "start" and e.get("job") in submit]


# ---- c: memory and restart time with a big store --------------------------------------------
def cluster_file(path: Path, nodes: int, per_leaf: int = 32) -> None:
    lines = ["name: bench", "topology: [leaf]", "nodes:"]
    for i in range(0, nodes, per_leaf):
        last = min(i + per_leaf, nodes)
        lines.append(f'  - {{name: "n[{i + 1:05d}-{last:05d}]", gpus: 8, gpu_model: H100-80GB, '
                     f"labels: {{leaf: l{i // per_leaf}}}}}")  # fmt: skip
    lines += ["queues:", "  - {name: research, weight: 2}", "  - {name: prod, weight: 1}"]
    path.write_text("\n".join(lines) + "\n")


def populate(url: str, total_jobs: int, pending: int, seed: int) -> dict[str, int]:
    """Fill the store the way the server would have: every node up, one attempt per started job.

    Every GPU runs a job (one 8-GPU job on even nodes, two 4-GPU jobs on odd ones), `pending`
    jobs wait, and the rest have finished, each with its attempt, allocation rows, `submit`,
    `start` and `finish` events and the agent's start orders, as `corral.server.commit` writes them.
    """
    from sqlalchemy import insert, update

    from corral.core.model import JobId
    from corral.server.auth import Principal
    from corral.server.cluster import load_cluster
    from corral.server.jobs import prepare, spec_json, submit_event
    from corral.store import schema
    from corral.store.engine import append_events, dumps, make_engines

    rng = random.Random(seed)
    engines = make_engines(url)
    with engines.writer.begin() as conn:
        model = load_cluster(conn)
        conn.execute(update(schema.nodes).values(state="up", reason="", registered=True, incarnation=1))
    static = model.build_state()
    names = sorted(n.name for n in model.config.nodes)
    admin = Principal("admin", "admin", token_id="bench")
    now = time.time()
    templates = {
        (g, q): prepare(model, static, dict(SPEC, gpus_per_replica=g, queue=q), admin, now)
        for g in (1, 2, 4, 8) for q in ("research", "prod")
    }  # fmt: skip
    running_sizes = [(name, [8] if i % 2 == 0 else [4, 4]) for i, name in enumerate(names)]
    running = sum(len(s) for _, s in running_sizes)
    finished = total_jobs - running - pending
    if finished < 0:
        raise ValueError(f"{total_jobs} jobs cannot hold {running} running and {pending} pending")
    plan: list[tuple[str, int, str | None]] = []  # (state, gpus, node)
    plan += [("finished", rng.choice([1, 2, 4, 8]), rng.choice(names)) for _ in range(finished)]
    plan += [("running", g, name) for name, sizes in running_sizes for g in sizes]
    plan += [("pending", rng.choice([1, 2, 4, 8]), None) for _ in range(pending)]
    used: dict[str, int] = {}
    chunk = 5000
    seq = 0
    for lo in range(0, len(plan), chunk):
        jobs, attempts, allocations, outbox, events = [], [], [], [], []
        ends = []
        for state, gpus, node in plan[lo : lo + chunk]:
            seq += 1
            job_id = f"j{seq}"
            prepared = templates[(gpus, rng.choice(("research", "prod")))]
            submitted = now - (len(plan) - seq) * 0.01
            spec = replace(prepared.spec, id=JobId(job_id), seq=seq, submit_time=submitted)
            row = {
                "seq": seq, "id": job_id, "name": spec.name, "queue": spec.queue, "user": spec.user,
                "team": prepared.team, "run_as": prepared.run_as, "state": state, "submit_time": submitted,
                "spec": spec_json(spec), "request": dumps(prepared.request),
            }  # fmt: skip
            events.append(submit_event(spec))
            if node is not None:
                first = used.get(node, 0) if state == "running" else 0
                gpu_list = list(range(first, first + gpus))
                if state == "running":
                    used[node] = first + gpus
                placement = [{"node": node, "gpus": gpu_list}]
                row.update(attempt=1, version=3, start_time=submitted + 0.005)
                attempts.append({
                    "job_id": job_id, "attempt": 1, "state": "running" if state == "running" else "ended",
                    "placement": dumps(placement), "started_at": submitted + 0.005,
                    "ended_at": submitted + 0.008 if state == "finished" else None,
                    "end_kind": "finish" if state == "finished" else None,
                    "exit_code": 0 if state == "finished" else None,
                })  # fmt: skip
                live = 1 if state == "running" else None
                allocations += [
                    {"job_id": job_id, "attempt": 1, "node": node, "gpu": g, "live": live} for g in gpu_list
                ]
                events.append({"event": "start", "t": submitted + 0.005, "job": job_id, "attempt": 1,
                               "placement": placement})  # fmt: skip
                order = {"kind": "start", "job": job_id, "attempt": 1, "placement": placement,
                         "run_as": prepared.run_as, "spec": prepared.request}  # fmt: skip
                outbox.append({"node": node, "body": dumps(order)})
                if state == "finished":
                    row.update(end_time=submitted + 0.008, exit_code=0)
                    ends.append({"event": "finish", "t": submitted + 0.008, "job": job_id, "attempt": 1,
                                 "exit_code": 0})  # fmt: skip
            jobs.append(row)
        with engines.writer.begin() as conn:
            conn.execute(insert(schema.jobs), _uniform(jobs))
            if attempts:
                conn.execute(insert(schema.attempts), attempts)
                conn.execute(insert(schema.allocations), allocations)
                conn.execute(insert(schema.outbox), outbox)
            append_events(conn, sorted(events + ends, key=lambda e: e["t"]), engines.is_sqlite)
    engines.dispose()
    return {"running": running, "pending": pending, "finished": finished}


def _uniform(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """executemany needs the same keys in every row."""
    keys = {"attempt": 0, "version": 1, "start_time": None, "end_time": None, "exit_code": None}
    return [{**keys, **r} for r in rows]


def restart_once(server: Server, timeout: float) -> dict[str, float]:
    """Start the server; times to /healthz, to `state loaded`, to the first cycle's commit."""
    before = len(loads_in(server.log))
    spawned = time.monotonic()
    healthz = server.start(timeout=timeout)
    pid = api_pid(server)
    api_cpu, api_wait = cpu_seconds(pid), run_queue_wait(pid)
    sched = child_pid(pid)
    loaded_at = wait_until(lambda: len(loads_in(server.log)) > before, timeout, 0.005)
    sched_cpu = cpu_seconds(sched)
    hwm = 0.0
    # the first cycle is committed when the scheduler goes idle (no CPU for half a second)
    last, idle_since = cpu_seconds(sched), time.monotonic()
    while time.monotonic() - idle_since < 0.5:
        time.sleep(0.05)
        hwm = max(hwm, status_mib(sched, "VmRSS"))
        cpu = cpu_seconds(sched)
        if cpu != last:
            last, idle_since = cpu, time.monotonic()
        if time.monotonic() - spawned > timeout:
            raise RuntimeError("the scheduler did not go idle")
    return {
        "healthz_s": healthz,
        "healthz_cpu_s": api_cpu,
        "healthz_own_s": healthz - api_wait,
        "loaded_s": loaded_at - spawned,
        "loaded_cpu_s": sched_cpu,
        "loaded_ms": loads_in(server.log)[-1],
        "first_cycle_s": idle_since - spawned,
        "api_rss_mib": status_mib(pid, "VmRSS"),
        "scheduler_rss_mib": status_mib(sched, "VmRSS"),
        "scheduler_hwm_mib": max(hwm, status_mib(sched, "VmHWM")),
        "api_hwm_mib": status_mib(pid, "VmHWM"),
    }


def bench_restart(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    nodes, jobs, pending = (1000, 10_000, 1000) if args.quick else (10_000, 100_000, 10_000)
    path = tmp / "cluster.yaml"
    cluster_file(path, nodes)
    with database(args.database_url, tmp) as url:
        server = Server(url, tmp / "data", path)
        first = server.start(timeout=120)
        server.stop()
        t0 = time.perf_counter()
        counts = populate(url, jobs, pending, args.seed)
        populate_s = time.perf_counter() - t0
        try:
            out = restart_once(server, 300)
            client = _Http(server.port, server.admin_token)
            t1 = time.monotonic()
            status, body = client.call("POST", "/v1/jobs", SPEC)
            first_submit = time.monotonic() - t1
            assert status == 201, body
            server.stop()
            again = restart_once(server, 300)
        finally:
            server.stop()
    out.update(
        nodes=nodes, jobs=jobs, populate_s=populate_s, first_start_healthz_s=first,
        first_submit_ms=1000 * first_submit, rss_total_mib=out["api_rss_mib"] + out["scheduler_rss_mib"],
        second_healthz_s=again["healthz_s"], second_loaded_s=again["loaded_s"],
        second_first_cycle_s=again["first_cycle_s"], **{f"store_{k}": v for k, v in counts.items()},
    )  # fmt: skip
    return out


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
