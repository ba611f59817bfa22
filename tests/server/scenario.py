"""Cluster files, calls and database checks that the control-plane tests share."""

from __future__ import annotations

import copy
import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar

import httpx
import pytest
from sqlalchemy import create_engine, text

from tests.server.harness import PG_ENV, FakeAgent, Server, drop_postgres, fresh_postgres, wait_for

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
def running_server(
    kind: str, tmp_path: Path, cluster: Path, extra: list[str] | None = None
) -> Iterator[Server]:
    """A `corral server` on a fresh database of `kind`, for a fixture shared by a module's tests."""
    with database(kind, tmp_path) as url:
        srv = Server(url, tmp_path / "data", cluster, extra=extra)
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
    in a live job state; every attempt not ended has in `attempt_nodes` exactly the nodes of its
    placement, the node of replica 0 marked `master`.
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
            placed: dict[tuple[str, int], tuple[set[str], str]] = {}
            recorded: dict[tuple[str, int], tuple[set[str], str]] = {}
            for job_id, attempt, placement, node, master in conn.execute(
                text(
                    "SELECT a.job_id, a.attempt, a.placement, n.node, n.master FROM attempts a "
                    "LEFT JOIN attempt_nodes n ON n.job_id = a.job_id AND n.attempt = a.attempt "
                    "WHERE a.state != 'ended'"
                )
            ):  # fmt: skip  (one statement: one snapshot while the server writes)
                names = [str(p["node"]) for p in json.loads(placement)]
                placed[(job_id, attempt)] = (set(names), names[0] if names else "")
                seen = recorded.setdefault((job_id, attempt), (set(), ""))
                if node is not None:
                    seen[0].add(node)
                    if master:
                        recorded[(job_id, attempt)] = (seen[0], node)
            for key in sorted(placed):
                if placed[key] != recorded[key]:
                    problems.append(
                        f"attempt {key[1]} of {key[0]}: placement {placed[key]},"
                        f" attempt_nodes {recorded[key]}"
                    )
    finally:
        engine.dispose()
    return problems


class Agent(FakeAgent):
    """A FakeAgent that keeps every order it received, so a test can wait for a particular one.

    It registers at once; `Agent.close_all()` closes every one made so far (fixtures call it).
    """

    opened: ClassVar[list[Agent]] = []

    @classmethod
    def close_all(cls) -> None:
        while cls.opened:
            cls.opened.pop().close()

    def __init__(
        self, server: Server, node: str, gpus: int = 8, gpu_model: str = "H100-80GB", **kw: Any
    ) -> None:
        super().__init__(server, node, gpus, gpu_model, **kw)
        self.seen: list[dict[str, Any]] = []
        Agent.opened.append(self)
        self.register()

    def poll(self, wait: float = 0.0) -> list[dict[str, Any]]:
        new = self.orders(wait=wait)
        self.seen.extend(new)
        return new

    def find(self, kind: str, job_id: str, attempt: int | None = None) -> dict[str, Any] | None:
        return next(
            (o for o in self.seen
             if o["kind"] == kind and o["job"] == job_id and (attempt is None or o["attempt"] == attempt)),
            None,
        )  # fmt: skip

    def expect(
        self, kind: str, job_id: str, attempt: int | None = None, timeout: float = 10.0
    ) -> dict[str, Any]:
        """Wait for a `kind` order (start or stop) for the job; AssertionError after `timeout`."""
        deadline = time.monotonic() + timeout
        while (found := self.find(kind, job_id, attempt)) is None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(
                    f"{self.node}: no {kind} order for {job_id} in {timeout}s; got {self.seen}"
                )
            self.poll(wait=min(left, 1.0))
        return found

    def quiet(self, kind: str, job_id: str, seconds: float) -> None:
        """Assert that no new `kind` order for the job arrives within `seconds`."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            for order in self.poll(wait=min(left, 0.5)):
                assert (order["kind"], order["job"]) != (kind, job_id), f"{self.node}: unexpected {order}"

    def run(self, job_id: str, attempt: int = 1, timeout: float = 10.0) -> dict[str, Any]:
        """Wait for the job's start order and report its workers running; returns the order."""
        order = self.expect("start", job_id, attempt, timeout)
        r = self.report(job_id, attempt, "running")
        assert r.status_code == 200, r.text
        return order

    def exit(self, job_id: str, attempt: int, code: int | None, rank: int | None = None) -> None:
        body = {"incarnation": self.incarnation, "job": job_id, "attempt": attempt, "status": "exited",
                "exit_code": code, "rank": rank}  # fmt: skip
        r = self.http.post(f"/v1/agents/{self.node}/reports", json=body)
        assert r.status_code == 200, r.text


ENDINGS = ("preempt", "lost", "restart", "finish", "fail", "cancel", "reject")
KINDS = ("cluster", "submit", "start", "preempting", *ENDINGS)
SUBMIT_FIELDS = (
    "queue", "replicas", "gpus_per_replica", "priority", "priority_class", "gpu_model", "topology",
    "time_limit", "preemptible", "user",
)  # fmt: skip
ORDER_AT_EQUAL_T = {**dict.fromkeys(ENDINGS, 0), "submit": 1, "start": 2}


def event_log_problems(log: list[dict[str, Any]]) -> list[str]:
    """How `log` breaks the event log contract of DESIGN.md 4.6 (empty when it keeps it)."""
    problems: list[str] = []
    nodes: dict[str, dict[str, Any]] = {}
    submitted: dict[str, dict[str, Any]] = {}
    live: dict[str, int] = {}  # job -> its attempt started and not yet ended
    attempts: dict[str, int] = {}
    if log and log[0]["event"] != "cluster":
        problems.append(f"the first line is {log[0]['event']}, not cluster")
    for i, e in enumerate(log):
        kind, job_id, where = e.get("event"), e.get("job"), f"seq {e.get('seq')} ({e.get('event')})"
        if kind not in KINDS:
            problems.append(f"{where}: unknown kind")
            continue
        if i:
            prev = log[i - 1]
            if e["seq"] <= prev["seq"]:
                problems.append(f"{where}: seq does not increase after {prev['seq']}")
            if e["t"] < prev["t"]:
                problems.append(f"{where}: t {e['t']} is before the previous line's {prev['t']}")
            if e["t"] == prev["t"] and ORDER_AT_EQUAL_T.get(kind, 9) < ORDER_AT_EQUAL_T.get(
                prev["event"], -1
            ):
                problems.append(f"{where}: at equal t it comes after a {prev['event']}")
        if kind == "cluster":
            for key in ("topology", "nodes", "queues", "priority_classes"):
                if key not in e:
                    problems.append(f"{where}: no {key}")
            for node in e.get("nodes", []):
                if "[" in node["name"] or "gpu_model" not in node or "gpus" not in node:
                    problems.append(f"{where}: node entry {node}")
                nodes[node["name"]] = node
            continue
        if "t" not in e or not job_id:
            problems.append(f"{where}: no t or no job")
            continue
        if kind == "submit":
            missing = [f for f in SUBMIT_FIELDS if f not in e]
            if missing:
                problems.append(f"{where}: submit of {job_id} lacks {missing}")
            submitted[job_id] = e
        elif job_id not in submitted:
            problems.append(f"{where}: {job_id} was never submitted")
            continue
        if kind == "start":
            spec = submitted[job_id]
            if job_id in live:
                problems.append(f"{where}: {job_id} starts while attempt {live[job_id]} is live")
            if e.get("attempt") != attempts.get(job_id, 0) + 1:
                problems.append(f"{where}: attempt {e.get('attempt')} after {attempts.get(job_id, 0)}")
            attempts[job_id] = live[job_id] = e.get("attempt", 0)
            placement = e.get("placement", [])
            if len(placement) != spec.get("replicas"):
                problems.append(
                    f"{where}: {len(placement)} placement entries for {spec.get('replicas')} replicas"
                )
            for entry in placement:
                if entry["node"] not in nodes:
                    problems.append(f"{where}: node {entry['node']} is in no earlier cluster line")
                if len(entry["gpus"]) != spec.get("gpus_per_replica") or len(set(entry["gpus"])) != len(
                    entry["gpus"]
                ):
                    problems.append(f"{where}: replica on {entry['node']} has GPUs {entry['gpus']}")
        elif kind == "preempting":
            if live.get(job_id) != e.get("attempt") or "by" not in e:
                problems.append(
                    f"{where}: preempting attempt {e.get('attempt')} of {job_id} (live: {live.get(job_id)})"
                )
        elif kind in ENDINGS:
            if job_id in live:
                if e.get("attempt") != live.pop(job_id):
                    problems.append(f"{where}: ends attempt {e.get('attempt')} of {job_id}, not the live one")
            elif kind not in ("cancel", "reject") or "attempt" in e:
                problems.append(f"{where}: {job_id} has no live attempt to end")
            if kind in ("fail", "reject") and not e.get("reason"):
                problems.append(f"{where}: no reason")
            if kind == "restart" and "exit_code" not in e:
                problems.append(f"{where}: restart without exit_code")
    return problems
