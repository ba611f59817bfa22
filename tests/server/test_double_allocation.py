"""No GPU given twice, no job with two live attempts (DESIGN.md 6.2), under concurrent load.

Submissions arrive in a stream while two nodes' agents report starts, exits and stops at the
same time; preemptions (priority classes without min_runtime), cancels and gangs that span both
nodes are in the mix. The database is checked with SQL while the load runs and after it; each
fake node also checks that it is never told to start work on a GPU it is still running
something on. A second scheduler process on the same database stands by (the leader lease).
"""

from __future__ import annotations

import heapq
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine, text

from tests.server.harness import FakeAgent, Server, wait_for
from tests.server.scenario import (
    NO_MIN_RUNTIME,
    allocation_problems,
    event_log_problems,
    events,
    write_cluster,
)

TERMINAL = ("finished", "failed", "cancelled", "rejected")
TOLERATED = (200, 404, 409)  # a report about an attempt that has ended meanwhile is refused, and that is fine


class BusyNode:
    """A fake node in its own thread: runs what it is told for a random while, obeys stops at once.

    It keeps which (job, attempt) holds each of its GPUs, from the start order until its workers
    exit or are stopped, and records a conflict when a start names a GPU that is still busy.
    """

    def __init__(self, server: Server, node: str, seed: int) -> None:
        self.agent = FakeAgent(server, node, 8, "H100-80GB")
        self.agent.register()
        self.node = node
        self.random = random.Random(seed)
        self.busy: dict[int, tuple[str, int]] = {}
        self.due: list[tuple[float, str, int, int]] = []  # (when, job, attempt, exit code)
        self.conflicts: list[str] = []
        self.errors: list[str] = []
        self.starts: list[tuple[str, int]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"node-{node}", daemon=True)

    def _report(self, job: str, attempt: int, status: str, code: int | None = None) -> None:
        r = self.agent.report(job, attempt, status, code)
        if r.status_code not in TOLERATED:
            self.errors.append(f"{self.node}: report {status} of {job}/{attempt}: {r.status_code} {r.text}")

    def _release(self, job: str, attempt: int) -> None:
        for gpu in [g for g, holder in self.busy.items() if holder == (job, attempt)]:
            del self.busy[gpu]

    def _run(self) -> None:
        try:
            while not self.stop.is_set():
                for order in self.agent.orders(wait=0.05):
                    key = (order["job"], order["attempt"])
                    if order["kind"] == "stop":
                        if key in self.busy.values():  # kill at once; workers exit with 143
                            self._release(*key)
                            self._report(*key, "exited", 143)
                        continue
                    self.starts.append(key)
                    for part in order["placement"]:
                        if part["node"] != self.node:
                            continue
                        for gpu in part["gpus"]:
                            if gpu in self.busy:
                                self.conflicts.append(
                                    f"{self.node}:{gpu} given to {key} while {self.busy[gpu]} runs"
                                )
                            self.busy[gpu] = key
                    self._report(*key, "running")
                    code = 0 if self.random.random() < 0.85 else 1
                    heapq.heappush(self.due, (time.monotonic() + self.random.uniform(0.02, 0.25), *key, code))
                while self.due and self.due[0][0] <= time.monotonic():
                    _, job, attempt, code = heapq.heappop(self.due)
                    if (job, attempt) in self.busy.values():
                        self._release(job, attempt)
                        self._report(job, attempt, "exited", code)
        except Exception as exc:  # reported by the test
            self.errors.append(f"{self.node}: {exc!r}")

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)
        self.agent.close()


def shapes(rng: random.Random) -> dict[str, Any]:
    replicas, gpus = rng.choice([(1, 1), (1, 2), (1, 4), (1, 8), (2, 4), (2, 8), (1, 3)])
    return {
        "queue": rng.choice(["research", "prod"]),
        "priority": rng.choice(["low", "normal", "high"]),
        "replicas": replicas,
        "gpus_per_replica": gpus,
        "max_restarts": 0,
        "checkpoint": {"grace": "2s"},
        "command": ["train"],
    }


def sample(url: str, stop: threading.Event, found: list[str]) -> None:
    """Check the database every so often while the load runs."""
    while not stop.wait(0.2):
        found.extend(allocation_problems(url))


def run_load(server: Server, jobs: int, seed: int, timeout: float = 90.0) -> None:
    """Submit `jobs` jobs in a stream (cancelling a few) on two busy nodes; check everything after."""
    rng = random.Random(seed)
    a, b = BusyNode(server, "dgx01", seed + 1), BusyNode(server, "dgx02", seed + 2)
    found: list[str] = []
    stop = threading.Event()
    checker = threading.Thread(target=sample, args=(server.database_url, stop, found), daemon=True)
    for t in (a.thread, b.thread, checker):
        t.start()
    ids: list[str] = []
    try:
        with server.client() as c:
            for _ in range(jobs):
                r = c.post("/v1/jobs", json=shapes(rng))
                assert r.status_code == 201, r.text
                ids.append(r.json()["id"])
                if rng.random() < 0.1:
                    victim = rng.choice(ids)
                    assert c.post(f"/v1/jobs/{victim}/cancel").status_code in (200, 409)
                time.sleep(rng.uniform(0, 0.02))

            def unfinished() -> list[str]:
                states = {
                    j["id"]: j["state"] for j in c.get("/v1/jobs", params={"limit": 10_000}).json()["jobs"]
                }
                return [i for i in ids if states[i] not in TERMINAL]

            wait_for(lambda: not unfinished(), timeout=timeout, interval=0.2)
            log = events(c)
    finally:
        stop.set()
        checker.join(10)
        a.close()
        b.close()
    assert a.errors + b.errors == []
    assert a.conflicts + b.conflicts == []
    assert found == []
    assert allocation_problems(server.database_url) == []
    assert event_log_problems(log) == []
    starts = {(e["job"], e["attempt"]) for e in log if e["event"] == "start"}
    assert len(starts) >= jobs // 2  # the load did run
    assert set(a.starts) | set(b.starts) == starts  # every start reached its nodes, and only those
    engine = create_engine(server.database_url)
    try:
        with engine.connect() as conn:
            assert conn.execute(text("SELECT COUNT(*) FROM allocations WHERE live = 1")).scalar() == 0
            assert conn.execute(text("SELECT COUNT(*) FROM attempts WHERE state != 'ended'")).scalar() == 0
    finally:
        engine.dispose()


@pytest.fixture
def lab(database_url: str, tmp_path: Path) -> Any:
    srv = Server(database_url, tmp_path / "data", write_cluster(tmp_path, priority_classes=NO_MIN_RUNTIME))
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


def test_no_double_allocation_under_load(lab: Server) -> None:
    run_load(lab, jobs=60, seed=7)


def test_a_second_scheduler_stands_by(lab: Server, tmp_path: Path) -> None:
    """A second scheduler on the same database (the API's own runs already) schedules nothing: it
    finds the leader lease held, says so (on SQLite: that several replicas need PostgreSQL) and
    waits, while the first schedules a load on its own (server/leader.py)."""
    # the server's own scheduler leads first (on a loaded machine it may still be starting, and a
    # second one started before it takes the free lease, as a replica should)
    health = lambda: httpx.get(lab.url + "/healthz", timeout=5).json()  # noqa: E731
    wait_for(lambda: health().get("scheduler") == "leader", timeout=60)
    log = tmp_path / "second-scheduler.log"
    with open(log, "wb") as out:
        second = subprocess.Popen(
            [sys.executable, "-m", "corral.server.scheduler_main", "--database-url", lab.database_url],
            stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        wait_for(lambda: "standby: the scheduler of replica" in log.read_text(), timeout=30)
        if lab.database_url.startswith("sqlite"):
            assert "On SQLite the control plane is one machine" in log.read_text()
        run_load(lab, jobs=40, seed=11)
        assert second.poll() is None, log.read_text()  # still standing by, not crashed
        assert "leader lease taken" not in log.read_text()
        assert lab.proc is not None and lab.proc.poll() is None
        assert "Traceback" not in log.read_text() and "Traceback" not in lab.log.read_text()
    finally:
        second.send_signal(signal.SIGTERM)
        try:
            second.wait(10)
        except subprocess.TimeoutExpired:
            second.kill()
            second.wait()
