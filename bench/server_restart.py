"""The control-plane benchmark's scenario c: memory and restart time with a big store
(`restart`); bench/server_bench.py runs it."""

from __future__ import annotations

import argparse
import random
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench.server_load import _Http
from bench.server_probes import (
    SPEC,
    Server,
    api_pid,
    child_pid,
    cpu_seconds,
    database,
    loads_in,
    run_queue_wait,
    status_mib,
    wait_until,
)


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
