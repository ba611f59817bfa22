"""Issue 13, finding 3: an attempt lost before it launched (its node refused to launch it: the lease
had expired) backs off before the next placement and counts against a budget, so no job loops
between placement and loss (the audit saw attempts 1 to 10 in 0.25 s). A real control plane; the
node speaks the agents' API as `corral agent` does when its lease has lapsed (`Attempt._launch`)."""

from __future__ import annotations

from typing import Any

from corral.server.endings import LAUNCH_BACKOFF, LAUNCH_LOSSES
from tests.server.harness import FakeAgent, Server, wait_for


def not_launched(agent: FakeAgent, job: str, attempt: int) -> None:
    body = {
        "incarnation": agent.incarnation,
        "job": job,
        "attempt": attempt,
        "status": "exited",
        "exit_code": 1,
        "why": "lost",
        "message": f"not launched on {agent.node}: its lease had expired",
    }
    r = agent.http.post(f"/v1/agents/{agent.node}/reports", json=body)
    assert r.status_code == 200, r.text


def job_events(server: Server, job_id: str) -> list[dict[str, Any]]:
    with server.client() as c:
        out: list[dict[str, Any]] = c.get(f"/v1/jobs/{job_id}/events").json()["events"]
        return out


def starts_of(agent: FakeAgent, job_id: str) -> list[int]:
    return [o["attempt"] for o in agent.orders(wait=0.5) if o["kind"] == "start" and o["job"] == job_id]


def test_losses_before_launch_back_off_and_end_the_job_after_a_budget(server: Server) -> None:
    agent = FakeAgent(server, "dgx01", 8, "H100-80GB")
    agent.register()
    with server.client() as c:
        r = c.post("/v1/jobs", json={"queue": "research", "gpus_per_replica": 8, "command": ["train"]})
        assert r.status_code == 201, r.text
        job_id = r.json()["id"]
    for attempt in range(1, LAUNCH_LOSSES + 1):
        started = wait_for(lambda: starts_of(agent, job_id), timeout=60)
        assert started == [attempt], started
        not_launched(agent, job_id, attempt)
    with server.client() as c:
        done = wait_for(
            lambda: (j := c.get(f"/v1/jobs/{job_id}").json())["state"] != "pending" and j, timeout=20
        )
    assert done["state"] == "failed" and done["attempt"] == LAUNCH_LOSSES, done
    assert f"not launched {LAUNCH_LOSSES} times in a row" in done["reason"], done["reason"]
    log = job_events(server, job_id)
    starts = [e for e in log if e["event"] == "start"]
    losses = [e for e in log if e["event"] == "lost"]
    assert len(starts) == LAUNCH_LOSSES and len(losses) == LAUNCH_LOSSES - 1
    assert "1 of 5 in a row" in losses[0]["reason"], losses[0]
    # each next placement waited its backoff: 1, 2, 4, 8 s after the loss
    for n, (lost, start) in enumerate(zip(losses, starts[1:], strict=True)):
        assert start["t"] - lost["t"] >= LAUNCH_BACKOFF * 2**n * 0.99, (n, lost, start)
    assert agent.orders(wait=1.0) == []  # and nothing more is placed
    agent.close()


def test_a_launched_attempt_starts_the_count_again(server: Server) -> None:
    agent = FakeAgent(server, "dgx01", 8, "H100-80GB")
    agent.register()
    with server.client() as c:
        r = c.post("/v1/jobs", json={"queue": "research", "gpus_per_replica": 8, "command": ["train"]})
        job_id = r.json()["id"]
    wait_for(lambda: starts_of(agent, job_id), timeout=20)
    not_launched(agent, job_id, 1)
    assert wait_for(lambda: starts_of(agent, job_id), timeout=20) == [2]
    assert agent.report(job_id, 2, "running").status_code == 200
    lost = {**{"why": "lost", "message": "killed on dgx01: its lease expired"}}
    r = agent.http.post(
        "/v1/agents/dgx01/reports",
        json={"incarnation": agent.incarnation, "job": job_id, "attempt": 2, "status": "exited", **lost},
    )
    assert r.status_code == 200, r.text
    # a loss after launch is a plain disruption: placed again at once, no backoff, no count
    assert wait_for(lambda: starts_of(agent, job_id), timeout=20) == [3]
    not_launched(agent, job_id, 3)
    wait_for(lambda: any(e["event"] == "lost" and e["attempt"] == 3 for e in job_events(server, job_id)))
    third = next(e for e in job_events(server, job_id) if e["event"] == "lost" and e["attempt"] == 3)
    assert "1 of 5 in a row" in third["reason"], third
    agent.close()
