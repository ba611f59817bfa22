"""Orders across an agent's absence (DESIGN.md 6.1). An ended attempt never starts: a node that was
lost before it fetched a start order, and asks for its orders when it comes back, is sent that
start as a stop (`why: ended`), so its agent does not launch the attempt and its cursor still
moves past it. A stop sent while an agent was down reaches it once it registers again (the
registration hands it a cursor past every older order)."""

from __future__ import annotations

from pathlib import Path

from tests.agent.test_agent import job
from tests.server.conftest import LAB
from tests.server.harness import FakeAgent, lost_after_server, wait_for

LOST_AFTER = 2.0


def test_the_start_of_an_attempt_that_ended_is_served_as_a_stop(tmp_path: Path) -> None:
    srv = lost_after_server(tmp_path, LAB, LOST_AFTER)
    try:
        one, two = FakeAgent(srv, "dgx01", 8, "H100-80GB"), FakeAgent(srv, "dgx02", 8, "H100-80GB")
        one.register()
        with srv.client() as c:
            r = c.post("/v1/jobs", json={"queue": "research", "command": ["train"], "gpus_per_replica": 8})
            assert r.status_code == 201, r.text
            job_id = r.json()["id"]
        wait_for(lambda: job(srv, job_id)["attempt"] == 1, timeout=10, interval=0.05)  # started on dgx01
        # dgx01 neither heartbeats nor fetches its order: lost, and attempt 1 ends with it
        ended = wait_for(lambda: (j := job(srv, job_id))["state"] == "pending" and j, timeout=LOST_AFTER + 10)
        assert ended["attempt"] == 1 and ended["restarts"] == 0, ended

        (order,) = one.orders()  # what an agent that was cut off meanwhile reads when it is back
        assert order["kind"] == "stop" and order["why"] == "ended", order
        assert (order["job"], order["attempt"], order["grace"]) == (job_id, 1, 0.0), order
        assert one.orders() == []  # the cursor moved past it

        two.register()  # a live attempt's start is served as it was written
        (start,) = wait_for(lambda: two.orders(wait=1), timeout=10)
        assert (start["kind"], start["job"], start["attempt"]) == ("start", job_id, 2), start
        one.close()
        two.close()
    finally:
        srv.stop()


def test_a_stop_sent_while_the_agent_was_down_reaches_it_after_it_registers_again(tmp_path: Path) -> None:
    srv = lost_after_server(tmp_path, LAB, 30.0)
    try:
        one = FakeAgent(srv, "dgx01", 8, "H100-80GB")
        one.register()
        with srv.client() as c:
            r = c.post("/v1/jobs", json={"queue": "research", "command": ["train"], "gpus_per_replica": 8})
            assert r.status_code == 201, r.text
            job_id = r.json()["id"]
        (start,) = wait_for(lambda: one.orders(wait=1), timeout=10)
        assert start["kind"] == "start" and one.report(job_id, 1, "running").status_code == 200
        # the agent is down: the job is cancelled meanwhile
        with srv.client() as c:
            assert c.post(f"/v1/jobs/{job_id}/cancel").status_code == 200
        # started again, it registers with the attempt it adopted and reads on from its new cursor
        r = one.http.post(
            "/v1/agents/register", json={**one.inventory, "running": [{"job": job_id, "attempt": 1}]}
        )
        assert r.status_code == 200 and r.json()["live"] == [{"job": job_id, "attempt": 1}], r.text
        one.incarnation, one.after = r.json()["incarnation"], r.json()["after"]
        (stop,) = wait_for(lambda: one.orders(wait=1), timeout=10)
        assert (stop["kind"], stop["job"], stop["attempt"], stop["why"]) == ("stop", job_id, 1, "cancel"), (
            stop
        )
        assert one.report(job_id, 1, "exited", 0).status_code == 200
        wait_for(lambda: job(srv, job_id)["state"] == "cancelled", timeout=10)
        one.close()
    finally:
        srv.stop()
