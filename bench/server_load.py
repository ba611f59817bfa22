"""The control-plane benchmarks' scenarios a and b: durable submissions per second under
concurrent clients (`submit`), and submit-to-decision latency (`latency`); bench/server_bench.py runs them."""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing as mp
import os
import queue
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from bench.server_probes import (
    LAB,
    SPEC,
    Server,
    api_pid,
    child_pid,
    cpu_seconds,
    database,
    percentile,
    wait_until,
)


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
