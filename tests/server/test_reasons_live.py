"""A pending job's reason follows what it says (issue 14, defect 4): a sentence whose code stays
the same is rewritten as soon as its numbers change, through a real scheduler process."""

from __future__ import annotations

from tests.server.harness import FakeAgent, Server, wait_for
from tests.server.scenario import job, submit


def _run(agent: FakeAgent, job_id: str) -> None:
    orders = wait_for(lambda: agent.orders(wait=1), timeout=15)
    assert any(o["kind"] == "start" and o["job"] == job_id for o in orders), orders
    assert agent.report(job_id, 1, "running").status_code == 200


def test_a_reason_is_rewritten_when_its_numbers_change(server: Server) -> None:
    agent = FakeAgent(server, "dgx01", 8, "H100-80GB")  # the only node that registers: 8 GPUs
    agent.register()
    try:
        with server.client() as c:
            _run(agent, submit(c, queue="research", gpus_per_replica=6)["id"])
            waiting = submit(c, queue="research", gpus_per_replica=4)["id"]
            first = wait_for(lambda: (j := job(c, waiting))["reason_code"] and j)
            assert first["reason_code"] == "capacity"
            assert first["reason"].startswith("needs 4 GPUs; 2 GPUs are free in the cluster"), first
            _run(agent, submit(c, queue="research", gpus_per_replica=2)["id"])  # takes the last 2
            # the same code, new numbers: written at once, not after a refresh period (nor never,
            # when no other cycle comes)
            now = wait_for(
                lambda: (j := job(c, waiting))["reason"].startswith("needs 4 GPUs; 0 GPUs are free") and j,
                timeout=5,
            )
            assert now["reason_code"] == "capacity"
    finally:
        agent.close()
