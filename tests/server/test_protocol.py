"""The node protocol (`corral.protocol`, docs/node-protocol.md) as the server speaks it: versioned,
its answers and orders are the protocol's models, and a report's `why` is one of a fixed set."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from corral.protocol import (
    PROTOCOL_VERSION,
    ExitWhy,
    Orders,
    ProtocolMismatch,
    Registered,
    StopOrder,
    StopWhy,
    check_version,
    stop_order,
)
from tests.server.harness import Server, wait_for
from tests.server.scenario import NO_MIN_RUNTIME, Agent, events, submit, wait_state, write_cluster


@pytest.fixture
def lab(tmp_path: Path) -> Any:
    srv = Server(
        f"sqlite:///{tmp_path / 'corral.db'}",
        tmp_path / "data",
        write_cluster(tmp_path, priority_classes=NO_MIN_RUNTIME),
    )
    srv.start()
    try:
        yield srv
    finally:
        Agent.close_all()
        srv.stop()


def test_an_agent_of_another_version_is_refused_with_both_versions(lab: Server) -> None:
    agent = Agent(lab, "dgx01")  # registers with this version: accepted, and told the server's
    answer = Registered.model_validate(agent.register())
    assert answer.protocol == PROTOCOL_VERSION and answer.lease_s > 0 and answer.node == "dgx01"
    r = agent.http.post("/v1/agents/register", json={**agent.inventory, "protocol": PROTOCOL_VERSION + 1})
    assert r.status_code == 426, r.text
    error = r.json()["error"]
    assert f"protocol {PROTOCOL_VERSION + 1}" in error and f"speaks {PROTOCOL_VERSION}" in error
    assert r.json()["fix"]


def test_the_agent_side_checks_the_servers_version() -> None:
    check_version(PROTOCOL_VERSION)
    check_version(None)  # a server from before the field speaks version 1
    with pytest.raises(ProtocolMismatch, match=f"node protocol {PROTOCOL_VERSION + 1}"):
        check_version(PROTOCOL_VERSION + 1)


def test_orders_are_the_protocols_models_and_stops_say_why(lab: Server) -> None:
    agent = Agent(lab, "dgx01")
    with lab.client() as c:
        job = submit(c, queue="research", gpus_per_replica=8, checkpoint={"grace": "5s"})["id"]
        agent.run(job)
        wait_state(c, job, "running")
        assert c.post(f"/v1/jobs/{job}/cancel").status_code == 200
        stop = agent.expect("stop", job, 1)
    orders = Orders.model_validate({"orders": agent.seen}).orders
    start, parsed = orders[0], orders[-1]
    assert start.kind == "start" and start.job == job and start.spec and start.seq > 0
    assert isinstance(parsed, StopOrder) and parsed.why is StopWhy.CANCEL and parsed.grace == 5
    assert {k: v for k, v in stop.items() if k != "seq"} == stop_order(job, 1, 5.0, StopWhy.CANCEL)


def test_a_reports_why_is_one_of_a_fixed_set(lab: Server) -> None:
    agent = Agent(lab, "dgx01")
    with lab.client() as c:
        job = submit(c, queue="research", gpus_per_replica=8)["id"]
        agent.run(job)
        wait_state(c, job, "running")
        body = {"incarnation": agent.incarnation, "job": job, "attempt": 1, "status": "exited"}
        r = agent.http.post("/v1/agents/dgx01/reports", json={**body, "exit_code": 137, "why": "bogus"})
        assert r.status_code == 422 and "why" in r.json()["error"], r.text
        r = agent.http.post("/v1/agents/dgx01/reports", json={**body, "status": "paused"})
        assert r.status_code == 422 and "status" in r.json()["error"], r.text
        lost = {**body, "exit_code": None, "why": ExitWhy.LOST.value, "message": "fenced"}
        r = agent.http.post("/v1/agents/dgx01/reports", json=lost)
        assert r.status_code == 200, r.text
        # lost: a disruption, the job requeued (not failed)
        ending = wait_for(lambda: [e for e in events(c) if e.get("job") == job and e["event"] == "lost"])
        assert ending[0]["attempt"] == 1
