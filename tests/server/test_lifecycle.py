"""A job's life through the real control plane: submit, start on a registered node, run, finish."""

from __future__ import annotations

from tests.server.harness import FakeAgent, Server, wait_for


def job(c, job_id):  # type: ignore[no-untyped-def]
    return c.get(f"/v1/jobs/{job_id}").json()


def test_submit_start_run_finish(server: Server) -> None:
    with server.client() as c:
        spec = {"name": "train", "queue": "research", "gpus_per_replica": 4, "command": ["true"]}
        r = c.post("/v1/jobs", json=spec)
        assert r.status_code == 201, r.text
        j = r.json()
        assert j["state"] == "pending" and j["id"]
        agent = FakeAgent(server, "dgx01", 8, "H100-80GB")
        agent.register()
        orders = wait_for(lambda: agent.orders(wait=2))
        assert orders[0]["kind"] == "start" and orders[0]["job"] == j["id"]
        assert len(orders[0]["placement"][0]["gpus"]) == 4
        started = job(c, j["id"])
        assert started["state"] == "starting" and started["attempt"] == 1
        assert started["placement"] == orders[0]["placement"]
        assert agent.report(j["id"], 1, "running").status_code == 200
        assert job(c, j["id"])["state"] == "running"
        assert agent.report(j["id"], 1, "exited", 0).status_code == 200
        done = wait_for(lambda: (x := job(c, j["id"]))["state"] == "finished" and x)
        assert done["exit_code"] == 0
        kinds = [e["event"] for e in c.get("/v1/events").json()]
        assert kinds == ["cluster", "submit", "start", "finish"]
        agent.close()


def test_a_killed_scheduler_process_is_restarted(server: Server) -> None:
    import os
    import signal
    import subprocess

    assert server.proc is not None
    children = subprocess.run(["pgrep", "-P", str(server.proc.pid)], capture_output=True, text=True)
    schedulers = [int(p) for p in children.stdout.split()]
    assert len(schedulers) == 1, children.stdout
    os.kill(schedulers[0], signal.SIGKILL)
    agent = FakeAgent(server, "dgx01", 8, "H100-80GB")
    agent.register()
    with server.client() as c:
        r = c.post("/v1/jobs", json={"queue": "research", "gpus_per_replica": 8, "command": ["true"]})
        assert r.status_code == 201
        orders = wait_for(lambda: agent.orders(wait=1), timeout=15)
        assert orders[0]["job"] == r.json()["id"]
    agent.close()
