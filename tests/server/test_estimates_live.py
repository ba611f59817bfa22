"""The live scheduler learns run times from its own finished jobs and keeps them across a restart
(issue 16): a job waiting behind a job without a time limit is told when estimates will hold
GPUs for it (under the `estimated` policy); the `start` event records the estimate the job was
queued with (bench/estimate_quality.py --live reads it back)."""

from __future__ import annotations

import time
from typing import Any

import httpx

from tests.server.harness import FakeAgent, Server, wait_for
from tests.server.scenario import events, job, submit


def _start(agent: FakeAgent, job_id: str) -> None:
    seen: list[dict[str, object]] = []  # a restart may first repeat older orders (a stop)

    def started() -> bool:
        seen.extend(agent.orders(wait=1))
        return any(o["kind"] == "start" and o["job"] == job_id for o in seen)

    wait_for(started, timeout=15)
    assert agent.report(job_id, 1, "running").status_code == 200


def _run_one(c: httpx.Client, agent: FakeAgent, **spec: Any) -> str:
    """Submit a job, start it, let it run half a second and exit 0: history for the next ones."""
    done = str(submit(c, **spec)["id"])
    _start(agent, done)
    time.sleep(0.5)
    assert agent.report(done, 1, "exited", 0).status_code == 200
    wait_for(lambda: job(c, done)["state"] == "finished")
    return done


def test_estimates_survive_a_restart_and_name_their_history(server: Server) -> None:
    agent = FakeAgent(server, "dgx01", 8, "H100-80GB")  # the only node that registers: 8 GPUs
    agent.register()
    try:
        with server.client() as c:
            done = submit(c, queue="research", name="train", gpus_per_replica=6)["id"]
            _start(agent, done)
            assert agent.report(done, 1, "exited", 0).status_code == 200
            wait_for(lambda: job(c, done)["state"] == "finished")
    finally:
        agent.close()
    server.stop()
    server.start()  # nothing but the tables carries the history over
    agent = FakeAgent(server, "dgx01", 8, "H100-80GB")
    agent.register()
    try:
        with server.client() as c:
            chosen = c.put("/v1/policy", json={"name": "estimated"})  # the policy that reads estimates
            assert chosen.status_code == 200, chosen.text
            running = submit(c, queue="research", name="train", gpus_per_replica=6)["id"]
            _start(agent, running)
            waiting = submit(c, queue="research", name="train", gpus_per_replica=4)["id"]
            # `estimated` holds GPUs on estimates for a job that has waited a day (hold_after): until
            # then its reason says when; without the history read back at start there is no
            # estimate at all ("held by jobs without a time limit", no reservation)
            found = wait_for(lambda: "estimated ends" in (j := job(c, waiting))["reason"] and j, timeout=15)
            assert "GPUs are reserved for it from their estimated ends at" in found["reason"], found
            log = events(c)
    finally:
        agent.close()
    # the new jobs' estimates draw on the job that finished before the restart: the scheduler's
    # (the `start` event: the estimate it queued the job with) and the API's (the job object)
    start = next(e for e in log if e["event"] == "start" and e["job"] == running)
    assert (start["estimate_drawn_on"], start["estimate_basis"]) == (1, "the cluster"), start
    assert (found["estimate_drawn_on"], found["estimate_basis"]) == (1, "the cluster"), found
    assert found["estimate"] == start["estimate"]  # one history, read back from the tables by both


def test_a_start_event_carries_the_estimate_the_job_was_queued_with(server: Server) -> None:
    agent = FakeAgent(server, "dgx01", 8, "H100-80GB")
    agent.register()
    try:
        with server.client() as c:
            first = _run_one(c, agent, queue="research", name="train", gpus_per_replica=6)
            second = submit(c, queue="research", name="train", gpus_per_replica=6)["id"]
            _start(agent, second)
            log = events(c)
    finally:
        agent.close()
    starts = {e["job"]: e for e in log if e["event"] == "start"}
    assert "estimate" not in starts[first]  # no history yet: no estimate, no field
    finish = next(e for e in log if e["event"] == "finish" and e["job"] == first)
    ran = finish["t"] - starts[first]["t"]  # the scheduler learns it when it reads the ending
    found = starts[second]
    assert ran - 0.01 <= found["estimate"] < ran + 5.0, (ran, found)
    assert found["estimate_drawn_on"] == 1  # one finished job: only the cluster level may use it
    assert found["estimate_basis"] == "the cluster"


def test_a_pending_and_a_running_job_carry_their_estimates(server: Server) -> None:
    """The job object (GET one, the list, the reply to a submission) carries a pending job's
    estimated run time and what it drew on, its reserved start, and a running job's estimated end
    (server/estimated.py); a finished job none."""
    agent = FakeAgent(server, "dgx01", 8, "H100-80GB")
    agent.register()
    try:
        with server.client() as c:
            first = submit(c, queue="research", name="train", gpus_per_replica=6)
            assert first["estimate"] is None and first["estimated_end"] is None  # no history yet
            _start(agent, first["id"])
            time.sleep(0.5)
            assert agent.report(first["id"], 1, "exited", 0).status_code == 200
            wait_for(lambda: job(c, first["id"])["state"] == "finished")
            log = events(c)
            start = next(e for e in log if e["event"] == "start" and e["job"] == first["id"])
            finish = next(e for e in log if e["event"] == "finish" and e["job"] == first["id"])
            ran = finish["t"] - start["t"]  # what history holds: the attempt's run time

            running = submit(c, queue="research", name="train", gpus_per_replica=6, time_limit="1h")
            # the reply to a submission already estimates (once the API has read the finished job)
            assert running["estimate"] is None or running["estimate_drawn_on"] == 1, running
            _start(agent, running["id"])
            waiting = submit(c, queue="research", name="eval", gpus_per_replica=4)["id"]  # 2 GPUs free
            # (the API reads newly finished jobs at most every 2 s: server/estimated.py REFRESH)
            found = wait_for(lambda: (j := job(c, waiting))["reserved_start"] and j["estimate"] and j, 15)
            shown = wait_for(lambda: (j := job(c, running["id"]))["estimate"] is not None and j, timeout=15)
            listed = {j["id"]: j for j in c.get("/v1/jobs", params={"state": "active"}).json()["jobs"]}
            done = job(c, first["id"])
            log = events(c)
    finally:
        agent.close()
    assert abs(found["estimate"] - ran) < 0.01, (found, ran)  # the median of one run: that run
    assert (found["estimate_drawn_on"], found["estimate_basis"]) == (1, "the cluster")
    assert found["estimated_end"] is None  # not running
    # the reservation's start is its reason's time: when the running job's limit ends
    assert found["reserved_start"] == found["reason_at"] and found["reserved_start"] is not None
    starts = {e["job"]: e for e in log if e["event"] == "start"}
    assert abs(found["reserved_start"] - (starts[running["id"]]["t"] + 3600)) < 1.0, found
    begun = starts[running["id"]]["t"]
    if shown["estimate_drawn_on"]:  # read before it ran longer than the finished job
        assert abs(shown["estimated_end"] - (begun + ran)) < 0.01, (shown, begun, ran)
        assert shown["estimate_basis"] == "the cluster"
    else:  # it already ran longer: twice what it has run so far, never a limit
        assert shown["estimated_end"] > begun + ran, shown
    assert shown["reserved_start"] is None
    for key in ("estimate", "estimate_drawn_on", "estimate_basis", "estimated_end", "reserved_start"):
        assert listed[waiting][key] == found[key], key
    assert listed[running["id"]]["estimate_basis"] == shown["estimate_basis"]
    assert done["estimate"] is None and done["reserved_start"] is None  # a finished job: none


def test_a_job_array_carries_a_tasks_estimate_and_its_running_tasks_end(server: Server) -> None:
    """An array's object (the reply to its submission, `GET /v1/jobs/{array}`) carries the estimate
    of a task not yet run, and the latest estimated end of its running tasks (server/estimated.py
    `array_fields`); an array with no task left pending or running carries none."""
    agent = FakeAgent(server, "dgx01", 8, "H100-80GB")
    agent.register()
    try:
        with server.client() as c:
            first = _run_one(c, agent, queue="research", name="sweep", gpus_per_replica=4)
            ran = _ran(events(c), first)
            time.sleep(2.1)  # the API reads newly finished jobs at most every 2 s (REFRESH)
            made = submit(c, queue="research", name="sweep", gpus_per_replica=4, array="0-2%1")
            base = made["id"]
            _start(agent, f"{base}_0")  # %1: one task at a time
            whole = wait_for(lambda: (a := job(c, base))["estimated_end"] is not None and a, timeout=15)
            task = job(c, f"{base}_0")
            log = events(c)
            for i in range(3):  # every task ends: nothing left to estimate
                if i:
                    _start(agent, f"{base}_{i}")
                assert agent.report(f"{base}_{i}", 1, "exited", 0).status_code == 200
                wait_for(lambda i=i: job(c, f"{base}_{i}")["state"] == "finished")
            done = job(c, base)
    finally:
        agent.close()
    assert made["array"] and abs(made["estimate"] - ran) < 0.01, (made, ran)  # one run: its time
    assert (made["estimate_drawn_on"], made["estimate_basis"]) == (1, "the cluster"), made
    # the reply is built after the array is written: its first task may already have started
    assert made["reserved_start"] is None, made
    assert abs(whole["estimate"] - ran) < 0.01 and whole["estimate_drawn_on"] == 1, whole
    # its running task's end, as the task's own object gives it (the task ran less than `ran` yet,
    # or it is estimated at twice what it ran: either way, the same end)
    begun = next(e["t"] for e in log if e["event"] == "start" and e["job"] == f"{base}_0")
    assert task["estimated_end"] is not None and task["estimated_end"] > begun
    assert abs(whole["estimated_end"] - task["estimated_end"]) < 1.0, (whole, task)
    assert done["state"] == "finished" and done["estimate"] is None and done["estimated_end"] is None, done


def _ran(log: list[dict[str, Any]], job_id: str) -> float:
    start = next(e for e in log if e["event"] == "start" and e["job"] == job_id)
    finish = next(e for e in log if e["event"] == "finish" and e["job"] == job_id)
    return float(finish["t"] - start["t"])
