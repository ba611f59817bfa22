"""An ended attempt never starts (DESIGN.md 6.1): a node that was lost before it fetched a start
order, and asks for its orders when it comes back, is sent that start as a stop (`why: ended`),
so its agent does not launch the attempt and its cursor still moves past it."""

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
