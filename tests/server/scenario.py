"""Cluster files, calls and database checks that the control-plane tests share."""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine, text

from tests.server.harness import PG_ENV, Server, drop_postgres, fresh_postgres, wait_for

# examples/lab.yaml as a document: 4 nodes of 8 H100s, dgx01-02 under leaf l1, dgx03-04 under l2
LAB: dict[str, Any] = {
    "name": "lab",
    "topology": ["spine", "leaf"],
    "nodes": [
        {"name": "dgx[01-02]", "gpus": 8, "gpu_model": "H100-80GB", "gpu_memory_gib": 80,
         "labels": {"spine": "s1", "leaf": "l1"}},
        {"name": "dgx[03-04]", "gpus": 8, "gpu_model": "H100-80GB", "gpu_memory_gib": 80,
         "labels": {"spine": "s1", "leaf": "l2"}},
    ],
    "queues": [
        {"name": "research", "weight": 2, "quota": 16, "limit": 32, "cohort": "main"},
        {"name": "prod", "weight": 1, "quota": 8, "limit": 32, "cohort": "main"},
    ],
}  # fmt: skip

# the built-in classes without the 10-minute min_runtime, so that preemption is immediate
NO_MIN_RUNTIME: dict[str, Any] = {
    "low": {"value": 0, "min_runtime": "0s"},
    "normal": {"value": 100, "min_runtime": "0s"},
    "high": {"value": 1000},
    "urgent": {"value": 10000},
}


def write_cluster(tmp_path: Path, body: dict[str, Any] | None = None, **top: Any) -> Path:
    """A cluster file (JSON is YAML) from `body` (default: the lab) with top-level keys replaced."""
    doc = copy.deepcopy(body if body is not None else LAB)
    doc.update(top)
    path = tmp_path / "cluster.yaml"
    path.write_text(json.dumps(doc, indent=1))
    return path


@contextmanager
def database(kind: str, tmp_path: Path) -> Iterator[str]:
    """A fresh database URL of `kind` (sqlite or postgresql; skipped without a test PostgreSQL)."""
    if kind == "sqlite":
        yield f"sqlite:///{tmp_path / 'corral.db'}"
        return
    admin = os.environ.get(PG_ENV)
    if not admin:
        pytest.skip(f'{PG_ENV} is not set: start one with `eval "$(bash scripts/postgres.sh start)"`')
    url, name = fresh_postgres(admin)
    try:
        yield url
    finally:
        drop_postgres(admin, name)


@contextmanager
def running_server(kind: str, tmp_path: Path, cluster: Path) -> Iterator[Server]:
    """A `corral server` on a fresh database of `kind`, for a fixture shared by a module's tests."""
    with database(kind, tmp_path) as url:
        srv = Server(url, tmp_path / "data", cluster)
        srv.start()
        try:
            yield srv
        finally:
            srv.stop()


def queue_entry(body: dict[str, Any], name: str) -> dict[str, Any]:
    entry: dict[str, Any] = next(q for q in body["queues"] if q["name"] == name)
    return entry


def submit(c: httpx.Client, **spec: Any) -> dict[str, Any]:
    """Submit `spec` (command `["true"]` unless given); asserts 201 and returns the job object."""
    spec.setdefault("command", ["true"])
    r = c.post("/v1/jobs", json=spec)
    assert r.status_code == 201, r.text
    out: dict[str, Any] = r.json()
    return out


def job(c: httpx.Client, job_id: str) -> dict[str, Any]:
    r = c.get(f"/v1/jobs/{job_id}")
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


def wait_state(c: httpx.Client, job_id: str, *states: str, timeout: float = 10.0) -> dict[str, Any]:
    """Poll the job until its state is one of `states`; returns the job object."""
    found: dict[str, Any] = wait_for(lambda: (x := job(c, job_id))["state"] in states and x, timeout)
    return found


def events(c: httpx.Client, **params: Any) -> list[dict[str, Any]]:
    r = c.get("/v1/events", params={"limit": 10_000, **params})
    assert r.status_code == 200, r.text
    out: list[dict[str, Any]] = r.json()
    return out


def kinds_of(c: httpx.Client, job_id: str) -> list[str]:
    return [e["event"] for e in events(c) if e.get("job") == job_id]


def start_order(orders: list[dict[str, Any]], job_id: str) -> dict[str, Any] | None:
    return next((o for o in orders if o["kind"] == "start" and o["job"] == job_id), None)


def allocation_problems(database_url: str) -> list[str]:
    """What the database says is wrong with live allocations and attempts (empty when all is well).

    No (node, GPU) in two live allocations; no job with two attempts not ended; every live
    allocation belongs to an attempt not ended; every attempt not ended is its job's current one,
    in a live job state.
    """
    engine = create_engine(database_url)
    problems: list[str] = []
    try:
        with engine.connect() as conn:
            for node, gpu, n in conn.execute(text(
                "SELECT node, gpu, COUNT(*) FROM allocations WHERE live = 1 "
                "GROUP BY node, gpu HAVING COUNT(*) > 1"
            )):  # fmt: skip
                problems.append(f"GPU {node}:{gpu} in {n} live allocations")
            for job_id, n in conn.execute(text(
                "SELECT job_id, COUNT(*) FROM attempts WHERE state != 'ended' "
                "GROUP BY job_id HAVING COUNT(*) > 1"
            )):  # fmt: skip
                problems.append(f"job {job_id} has {n} attempts not ended")
            for job_id, attempt, node, gpu in conn.execute(text(
                "SELECT al.job_id, al.attempt, al.node, al.gpu FROM allocations al "
                "LEFT JOIN attempts a ON a.job_id = al.job_id AND a.attempt = al.attempt "
                "WHERE al.live = 1 AND (a.state IS NULL OR a.state = 'ended')"
            )):  # fmt: skip
                problems.append(f"GPU {node}:{gpu} still allocated to ended attempt {attempt} of {job_id}")
            for job_id, attempt, state, current in conn.execute(text(
                "SELECT a.job_id, a.attempt, j.state, j.attempt FROM attempts a "
                "JOIN jobs j ON j.id = a.job_id "
                "WHERE a.state != 'ended' AND (j.attempt != a.attempt "
                "OR j.state NOT IN ('starting', 'running', 'stopping'))"
            )):  # fmt: skip
                problems.append(f"attempt {attempt} of {job_id} is live but the job is {state} at {current}")
    finally:
        engine.dispose()
    return problems
