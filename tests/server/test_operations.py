"""What users and operators do to a running control plane, on SQLite and PostgreSQL.

Cancel, hold and release, requeue, restarts after worker failures, preemption across priority
classes, cordon, drain and undrain, queue changes and rollback, pause and resume, backup,
usage, audit and metrics. Nodes are FakeAgents that report what the test says. Each test ends
by checking the database (no GPU in two live allocations, no job with two live attempts) and
the event log against DESIGN.md 4.6.
"""

from __future__ import annotations

import sqlite3
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.server.harness import Server, wait_for
from tests.server.scenario import (
    NO_MIN_RUNTIME,
    Agent,
    allocation_problems,
    event_log_problems,
    events,
    job,
    kinds_of,
    submit,
    wait_state,
    write_cluster,
)


@pytest.fixture
def lab(database_url: str, tmp_path: Path) -> Iterator[Server]:
    """The lab cluster with priority classes that may be preempted at once (no min_runtime)."""
    srv = Server(database_url, tmp_path / "data", write_cluster(tmp_path, priority_classes=NO_MIN_RUNTIME))
    srv.start()
    try:
        yield srv
    finally:
        Agent.close_all()
        srv.stop()


def healthy(server: Server, c: httpx.Client) -> None:
    """The database and the event log keep their promises."""
    assert allocation_problems(server.database_url) == []
    assert event_log_problems(events(c)) == []


def gpus_of(order_or_job: dict[str, Any]) -> set[tuple[str, int]]:
    return {(p["node"], g) for p in order_or_job["placement"] for g in p["gpus"]}


def nodes(c: httpx.Client) -> dict[str, dict[str, Any]]:
    return {n["name"]: n for n in c.get("/v1/nodes").json()["nodes"]}


def test_cancel_pending_and_running(lab: Server) -> None:
    with lab.client() as c:
        pending = submit(c, queue="research", gpus_per_replica=8)["id"]  # no node yet: it waits
        r = c.post(f"/v1/jobs/{pending}/cancel")
        assert r.status_code == 200 and r.json()["state"] == "cancelled", r.text
        assert kinds_of(c, pending) == ["submit", "cancel"]
        ev = [e for e in events(c) if e.get("job") == pending][-1]
        assert "attempt" not in ev and "admin" in ev["reason"]
        r = c.post(f"/v1/jobs/{pending}/cancel")
        assert r.status_code == 409 and "cancelled" in r.json()["error"]

        agent = Agent(lab, "dgx01")
        running = submit(c, queue="research", gpus_per_replica=8, checkpoint={"grace": "5s"})["id"]
        order = agent.run(running)
        assert wait_state(c, running, "running")["attempt"] == 1
        waiting = submit(c, queue="research", gpus_per_replica=8)["id"]
        r = c.post(f"/v1/jobs/{running}/cancel")
        assert r.status_code == 200 and r.json()["state"] == "stopping", r.text
        stop = agent.expect("stop", running, 1)
        assert stop["grace"] == 5
        assert job(c, waiting)["state"] == "pending"  # the GPUs are still busy
        assert c.post(f"/v1/jobs/{running}/hold").status_code == 409
        agent.exit(running, 1, 143)
        done = wait_state(c, running, "cancelled")
        assert done["placement"] == [] and done["end_time"] is not None
        ending = [e for e in events(c) if e.get("job") == running][-1]
        assert ending["event"] == "cancel" and ending["attempt"] == 1
        # its GPUs are free: the waiting job starts on them
        assert gpus_of(agent.run(waiting)) == gpus_of(order)
        assert wait_state(c, waiting, "running")
        healthy(lab, c)


def test_hold_release_pause_resume(lab: Server) -> None:
    with lab.client() as c:
        held = submit(c, queue="research", gpus_per_replica=4)["id"]
        assert c.post(f"/v1/jobs/{held}/hold").json()["held"] is True
        agent = Agent(lab, "dgx01")
        free = submit(c, queue="research", gpus_per_replica=4)["id"]
        agent.run(free)  # the scheduler ran with 4 GPUs free; the held job did not take them
        agent.quiet("start", held, 1.0)
        j = job(c, held)
        assert j["state"] == "pending" and j["held"] and j["reason_code"] == "held", j
        r = c.post(f"/v1/jobs/{free}/hold")
        assert r.status_code == 409 and "only a pending job" in r.json()["error"]
        assert c.post(f"/v1/jobs/{held}/release").json()["held"] is False
        agent.run(held)
        assert {j["state"] for j in c.get("/v1/jobs").json()["jobs"]} == {"running"}

        # paused: decisions frozen, running jobs untouched; resumed: it starts
        assert c.post("/v1/admin/pause").json() == {"paused": True}
        agent.exit(free, 1, 0)
        wait_state(c, free, "finished")
        later = submit(c, queue="research", gpus_per_replica=4)["id"]
        agent.quiet("start", later, 1.0)
        assert job(c, later)["state"] == "pending" and job(c, held)["state"] == "running"
        assert c.post("/v1/admin/resume").json() == {"paused": False}
        agent.run(later)
        kinds = [e["event"] for e in events(c)]
        assert kinds.count("start") == 3 and "x.hold" not in kinds
        healthy(lab, c)


def test_requeue_restart_and_fail(lab: Server) -> None:
    with lab.client() as c:
        agent = Agent(lab, "dgx01")
        moved = submit(c, queue="research", gpus_per_replica=2)["id"]
        agent.run(moved)
        r = c.post(f"/v1/jobs/{moved}/requeue")
        assert r.status_code == 200 and r.json()["state"] == "stopping", r.text
        agent.expect("stop", moved, 1)
        agent.exit(moved, 1, 143)
        agent.run(moved, attempt=2)  # pending again, then started as attempt 2
        j = wait_state(c, moved, "running")
        assert j["attempt"] == 2 and j["restarts"] == 0  # a requeue never counts as a restart
        preempt = next(e for e in events(c) if e.get("job") == moved and e["event"] == "preempt")
        assert preempt["attempt"] == 1 and "requeued by admin" in preempt["reason"]
        assert kinds_of(c, moved) == ["submit", "start", "preempt", "start"]

        # a worker failure with a restart left: `restart`, then pending with a backoff
        flaky = submit(c, queue="research", gpus_per_replica=2, max_restarts=1)["id"]
        agent.run(flaky)
        agent.exit(flaky, 1, 1, rank=0)
        j = wait_state(c, flaky, "pending")
        assert j["restarts"] == 1 and j["exit_code"] == 1
        restart = next(e for e in events(c) if e.get("job") == flaky and e["event"] == "restart")
        assert (restart["attempt"], restart["exit_code"], restart["rank"]) == (1, 1, 0)
        j = wait_for(lambda: (x := job(c, flaky))["reason_code"] == "backoff" and x)
        assert "backoff" in j["reason"] and j["state"] == "pending"
        agent.quiet("start", flaky, 1.0)  # 10 s of backoff: not now, though 4 GPUs are free

        # no restart left: `fail` with the exit code
        broken = submit(c, queue="research", gpus_per_replica=2, max_restarts=0)["id"]
        agent.run(broken)
        agent.exit(broken, 1, 3, rank=1)
        j = wait_state(c, broken, "failed")
        assert j["exit_code"] == 3
        fail = [e for e in events(c) if e.get("job") == broken][-1]
        assert fail["event"] == "fail" and fail["attempt"] == 1 and fail["exit_code"] == 3
        assert "no restarts left" in fail["reason"]
        healthy(lab, c)


def test_preemption_across_priorities(lab: Server) -> None:
    with lab.client() as c:
        agent = Agent(lab, "dgx01")
        low = submit(c, queue="research", gpus_per_replica=8, priority="low", checkpoint={"grace": "20s"})
        low = low["id"]
        placed = agent.run(low)
        urgent = submit(c, queue="research", gpus_per_replica=8, priority="urgent")["id"]
        stop = agent.expect("stop", low, 1)
        assert 0 < stop["grace"] <= 20
        wait_state(c, low, "stopping")
        preempting = next(e for e in events(c) if e.get("job") == low and e["event"] == "preempting")
        assert preempting["by"] == urgent and preempting["attempt"] == 1
        assert job(c, urgent)["state"] == "pending"  # nominated, waiting for the GPUs to be free
        agent.exit(low, 1, 143)
        assert gpus_of(agent.run(urgent)) == gpus_of(placed)
        preempt = next(e for e in events(c) if e.get("job") == low and e["event"] == "preempt")
        assert preempt["attempt"] == 1 and urgent in preempt["reason"]
        j = wait_state(c, low, "pending")
        assert j["restarts"] == 0 and j["attempt"] == 1
        # an equal class never preempts
        peer = submit(c, queue="research", gpus_per_replica=8, priority="urgent")["id"]
        agent.quiet("stop", urgent, 1.0)
        assert job(c, peer)["state"] == "pending"
        metrics = c.get("/metrics").text
        assert 'corral_preemptions_total{reason="preempt"} 1.0' in metrics
        for name in (
            "corral_pending_jobs",
            "corral_gpus",
            "corral_scheduling_cycle_seconds_count",
            "corral_admission_wait_seconds_count",
            "corral_node_heartbeat_age_seconds",
        ):
            assert name in metrics, name
        assert 'corral_pending_jobs{queue="research"} 2.0' in metrics
        assert 'corral_gpus{status="allocated"} 8.0' in metrics
        assert 'corral_node_heartbeat_age_seconds{node="dgx01"}' in metrics
        healthy(lab, c)


def test_cordon_drain_undrain(lab: Server) -> None:
    with lab.client() as c:
        a, b = Agent(lab, "dgx01"), Agent(lab, "dgx02")
        r = c.post("/v1/nodes/dgx01/cordon", json={"reason": "bad fan"})
        assert r.status_code == 200 and r.json()["state"] == "cordoned"
        assert nodes(c)["dgx01"]["state"] == "cordoned" and nodes(c)["dgx01"]["reason"] == "bad fan"
        first = submit(c, queue="research", gpus_per_replica=8)["id"]
        second = submit(c, queue="research", gpus_per_replica=8)["id"]
        b.run(first)
        a.quiet("start", second, 1.0)  # a cordoned node takes no new work
        assert job(c, second)["state"] == "pending"
        assert c.post("/v1/nodes/dgx01/uncordon").json() == {"name": "dgx01", "state": "up", "reason": ""}
        assert c.post("/v1/nodes/dgx01/uncordon").json()["state"] == "up"  # nothing to lift: no change
        a.run(second)

        # drain: no new work, and the node's attempts are told to stop by the deadline
        r = c.post("/v1/nodes/dgx01/drain", json={"deadline": 0, "reason": "maintenance"})
        assert r.status_code == 200 and r.json()["state"] == "draining", r.text
        stop = a.expect("stop", second, 1)
        assert stop.get("why") == "drain"
        assert b.find("stop", first) is None
        assert job(c, second)["state"] == "stopping"
        a.exit(second, 1, 143)
        j = wait_state(c, second, "pending")
        last = [e for e in events(c) if e.get("job") == second][-1]
        assert last["event"] == "preempt" and last["reason"] == "requeued by the drain of dgx01 (admin)", last
        a.quiet("start", second, 1.0)  # dgx01 is draining and dgx02 is full
        assert j["attempt"] == 1 and nodes(c)["dgx01"]["state"] == "draining"
        r = c.post("/v1/nodes/dgx01/uncordon")  # a cordon's lifting does not end a drain
        assert r.status_code == 409 and "dgx01 is draining, not cordoned" in r.json()["error"], r.text
        assert "corral nodes undrain dgx01" in r.json()["fix"]
        assert c.post("/v1/nodes/dgx01/undrain").json()["state"] == "up"
        a.run(second, attempt=2)
        assert job(c, first)["state"] == "running"
        # members may not do any of this, and a node that does not exist is a 404
        assert c.post("/v1/nodes/dgx99/cordon").status_code == 404
        healthy(lab, c)


def test_queue_change_and_rollback(lab: Server) -> None:
    with lab.client() as c:
        Agent(lab, "dgx01"), Agent(lab, "dgx02")
        start = c.get("/v1/config/revisions").json()
        before = start["active"]
        r = c.put("/v1/queues/research", json={"quota": 8, "limit": 8})
        assert r.status_code == 200, r.text
        changed = r.json()["revision"]
        revs = c.get("/v1/config/revisions").json()
        assert revs["active"] == changed > before
        assert [x["revision"] for x in revs["revisions"]][-1] == changed
        newest = revs["revisions"][-1]
        assert "quota=8, limit=8" in newest["comment"] and newest["author"] == "admin"
        queue = next(q for q in c.get("/v1/queues").json()["queues"] if q["name"] == "research")
        assert queue["limit"] == 8
        # the API checks against the new limit at once, the scheduler honours it
        r = c.post(
            "/v1/jobs", json={"queue": "research", "replicas": 2, "gpus_per_replica": 8, "command": ["t"]}
        )
        assert r.status_code == 422 and "limited to 8" in r.json()["error"]
        one = submit(c, queue="research", gpus_per_replica=8)["id"]
        two = submit(c, queue="research", gpus_per_replica=8)["id"]
        wait_state(c, one, "starting", "running")
        j = wait_for(lambda: (x := job(c, two))["reason_code"] and x)
        assert j["state"] == "pending" and j["reason_code"] == "limit", j
        # rollback: a new revision with the old body; the second job may start now
        r = c.post("/v1/config/rollback", json={"revision": before})
        assert r.status_code == 200, r.text
        rolled = r.json()["revision"]
        revs = c.get("/v1/config/revisions").json()
        assert revs["active"] == rolled > changed
        assert f"rollback to revision {before}" in revs["revisions"][-1]["comment"]
        queue = next(q for q in c.get("/v1/queues").json()["queues"] if q["name"] == "research")
        assert queue["limit"] == 32
        wait_state(c, two, "starting", "running")
        assert c.post("/v1/config/rollback", json={"revision": 999}).status_code == 404
        # an invalid change is refused and changes nothing
        r = c.put("/v1/queues/research", json={"quota": 64, "limit": 8})
        assert r.status_code == 422, r.text
        assert c.get("/v1/config/revisions").json()["active"] == rolled
        healthy(lab, c)


def test_usage_audit_backup(lab: Server, tmp_path: Path) -> None:
    member = lab.token("ana", "member", team="research")
    with lab.client() as c, lab.client(member) as m:
        agent = Agent(lab, "dgx01")
        done = submit(m, queue="research", gpus_per_replica=8)["id"]
        agent.run(done)
        time.sleep(0.3)
        agent.exit(done, 1, 0)
        wait_state(c, done, "finished")
        usage = c.get("/v1/usage").json()["usage"]
        assert [(u["queue"], u["user"]) for u in usage] == [("research", "ana")]
        assert usage[0]["gpu_hours"] > 0
        assert c.get("/v1/usage", params={"since": time.time() + 10}).json()["usage"] == []
        # audit: who, what, result for every mutating call, refused ones included
        assert m.post("/v1/nodes/dgx01/cordon").status_code == 403
        assert c.post("/v1/admin/pause").status_code == 200
        assert c.post("/v1/admin/resume").status_code == 200
        expected = [
            ("admin", "POST /v1/tokens", "201"),
            ("agent-dgx01", "POST /v1/agents/register", "200"),
            ("ana", "POST /v1/jobs", "201"),
            ("ana", "POST /v1/nodes/dgx01/cordon", "403"),
            ("admin", "POST /v1/admin/pause", "200"),
            ("admin", "POST /v1/admin/resume", "200"),
        ]

        def recorded() -> list[tuple[str, str, str]]:
            return [(a["principal"], a["action"], a["result"]) for a in c.get("/v1/audit").json()["audit"]]

        wait_for(lambda: set(expected) <= set(recorded()))
        assert not [r for r in recorded() if r[1].endswith("/reports")]  # agents' traffic is not audited
        assert ("(anonymous)", "POST /v1/jobs", "401") not in recorded()
        httpx.post(lab.url + "/v1/jobs", json={})
        wait_for(lambda: ("(anonymous)", "POST /v1/jobs", "401") in recorded())
        # a backup is a copy of the database that can be read on its own
        if lab.database_url.startswith("sqlite"):
            path = tmp_path / "backup.db"
            r = c.post("/v1/admin/backup", json={"path": str(path)})
            assert r.status_code == 200 and r.json()["bytes"] > 0, r.text
            with sqlite3.connect(path) as db:
                assert db.execute("SELECT COUNT(*) FROM jobs").fetchone() == (1,)
                assert db.execute("SELECT state FROM jobs").fetchone() == ("finished",)
        else:
            path = tmp_path / "backup.pgdump"
            r = c.post("/v1/admin/backup", json={"path": str(path)})
            assert r.status_code == 200 and r.json()["bytes"] > 0, r.text
            listing = subprocess.run(
                ["pg_restore", "--list", str(path)], capture_output=True, text=True, check=True
            )
            assert "TABLE DATA public jobs" in listing.stdout
        r = c.post("/v1/admin/backup", json={"path": str(tmp_path / "no" / "such" / "dir.db")})
        assert r.status_code == 422 and "no directory" in r.json()["error"]
        assert c.post("/v1/admin/backup", json={}).status_code == 422
        healthy(lab, c)


def test_gang_ends_on_every_node(lab: Server) -> None:
    with lab.client() as c:
        a, b = Agent(lab, "dgx01"), Agent(lab, "dgx02")
        gang = submit(c, queue="research", replicas=2, gpus_per_replica=8, max_restarts=0)["id"]
        a.run(gang)
        b.run(gang)
        assert {p["node"] for p in job(c, gang)["placement"]} == {"dgx01", "dgx02"}
        # the job that waits for the gang's GPUs can only go to dgx02, the node that did not fail
        assert c.post("/v1/nodes/dgx01/cordon", json={"reason": "test"}).status_code == 200
        waiting = submit(c, queue="research", gpus_per_replica=8)["id"]
        a.exit(gang, 1, 1, rank=0)  # one node's workers fail: the gang is over on both nodes
        assert wait_state(c, gang, "failed")["exit_code"] == 1
        # both orders are committed before dgx02 fetches any: it must get the stop first
        assert wait_state(c, waiting, "starting")["placement"][0]["node"] == "dgx02"
        stop = b.expect("stop", gang, 1)
        assert stop["grace"] == 0
        started = b.expect("start", waiting, 1)
        # the other node hears of the stop before it is given anything new on those GPUs
        assert b.seen.index(stop) < b.seen.index(started), b.seen
        r = b.report(gang, 1, "exited", 137)
        assert r.status_code == 409 and "has ended" in r.json()["error"]
        assert kinds_of(c, gang) == ["submit", "start", "fail"]
        healthy(lab, c)
