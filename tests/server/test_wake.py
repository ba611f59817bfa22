"""Time-based conditions wake the real scheduler process by themselves, and pending jobs say
what they wait for (issue 14, defects 1 and 4): a victim's `min_runtime` ending, scheduling
paused by an admin."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tests.server.harness import FakeAgent, Server, wait_for
from tests.server.scenario import LAB, events, job, submit, wait_state, write_cluster

MIN_RUNTIME = 5.0  # low's protection: long enough to read the reason during it, short for a test


def _cluster(tmp_path: Path) -> Path:
    body: dict[str, Any] = {
        **LAB,
        "queues": [
            {"name": "research", "weight": 1, "quota": 32, "limit": 32,
             "priorities": ["low", "normal", "high", "urgent"]},
        ],
        "priority_classes": {
            "low": {"value": 0, "min_runtime": f"{MIN_RUNTIME:.0f}s"},
            "normal": {"value": 100},
            "high": {"value": 1000},
            "urgent": {"value": 10000},
        },
    }  # fmt: skip
    return write_cluster(tmp_path, body)


def _started(server: Server, agents: list[FakeAgent], job_id: str) -> None:
    """Every agent got the job's start order and answers that its workers run."""
    for agent in agents:
        orders = wait_for(lambda a=agent: a.orders(wait=1), timeout=15)
        assert any(o["kind"] == "start" and o["job"] == job_id for o in orders), orders
        assert agent.report(job_id, 1, "running").status_code == 200


def _event(c: Any, job_id: str, kind: str) -> dict[str, Any] | None:
    return next((e for e in events(c) if e.get("job") == job_id and e["event"] == kind), None)


def test_an_urgent_job_preempts_when_the_victims_protection_ends_with_nothing_else_happening(
    database_url: str, tmp_path: Path
) -> None:
    server = Server(database_url, tmp_path / "data", _cluster(tmp_path))
    server.start()
    agents: list[FakeAgent] = []
    try:
        agents = [FakeAgent(server, f"dgx0{i}", 8, "H100-80GB") for i in range(1, 5)]
        for agent in agents:
            agent.register()
        with server.client() as c:
            gang = submit(c, queue="research", priority="low", replicas=4, gpus_per_replica=8)["id"]
            _started(server, agents, gang)
            start = _event(c, gang, "start")
            assert start is not None
            protected_until = start["t"] + MIN_RUNTIME  # its first attempt: min_runtime not doubled
            urgent = submit(c, queue="research", priority="urgent", gpus_per_replica=8)["id"]
            # while the gang is protected the urgent job says until when, as a clock time
            waiting = wait_for(lambda: (j := job(c, urgent))["reason_code"] and j, timeout=MIN_RUNTIME)
            assert time.time() < protected_until, "the reason came too late to check it"
            clock = datetime.fromtimestamp(protected_until, UTC).strftime("%H:%M:%S UTC")
            assert waiting["reason_code"] == "limit", waiting
            assert waiting["reason"] == (
                "queue research is at its limit (32 of 32 GPUs in use; this job needs 8); "
                f"the jobs it may preempt are protected by min_runtime until {clock}"
            )
            assert waiting["reason_at"] == protected_until
            # nothing else happens (only reads from here): the scheduler must wake by itself
            preempting = wait_for(lambda: _event(c, gang, "preempting"), timeout=MIN_RUNTIME + 15)
            assert preempting["by"] == urgent
            late = preempting["t"] - protected_until
            assert 0 <= late <= 2.0, f"preempted {late:.2f} s after the protection ended"
            # the victims stop (a non-zero exit on one node ends the gang); the urgent job starts
            for agent in agents:
                wait_for(lambda a=agent: any(o["kind"] == "stop" for o in a.orders(wait=1)), timeout=10)
            assert agents[0].report(gang, 1, "exited", 143).status_code == 200
            started = wait_state(c, urgent, "starting", "running", timeout=15)
            assert started["attempt"] == 1
    finally:
        for agent in agents:
            agent.close()
        server.stop()


def test_pending_jobs_say_scheduling_is_paused_and_by_whom(database_url: str, tmp_path: Path) -> None:
    server = Server(database_url, tmp_path / "data", _cluster(tmp_path))
    server.start()
    try:
        with server.client() as c:
            before = submit(c, queue="research", gpus_per_replica=8)["id"]  # no node yet: waits
            wait_for(lambda: job(c, before)["reason_code"] == "capacity")
            r = c.post("/v1/admin/pause")
            assert r.status_code == 200, r.text
            after = submit(c, queue="research", gpus_per_replica=8)["id"]
            for job_id in (before, after):
                j = wait_for(lambda i=job_id: (x := job(c, i))["reason_code"] == "paused" and x)
                assert j["reason"].startswith("scheduling is paused by admin since "), j
                assert j["reason"].endswith(" UTC; `corral admin resume` lets jobs start"), j
                assert j["reason_at"] is not None and j["reason_at"] <= time.time()
            r = c.post("/v1/admin/resume")
            assert r.status_code == 200, r.text
            for job_id in (before, after):
                wait_for(lambda i=job_id: job(c, i)["reason_code"] == "capacity")
    finally:
        server.stop()
