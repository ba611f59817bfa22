"""Job arrays and dependencies through the real control plane (server and scheduler processes,
a node agent over HTTP): `%N` never exceeded, pipelines in order, impossible ones cancelled."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx

from tests.server.harness import FakeAgent, Server, wait_for


def events(c: httpx.Client) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    while True:
        page = c.get("/v1/events", params={"after": out[-1]["seq"] if out else 0, "limit": 10_000}).json()
        if not page:
            return out
        out += page


def run_orders(agent: FakeAgent, exit_code: Callable[[str], int] = lambda job: 0) -> int:
    """Carry out one batch of the agent's orders: every start runs and exits at once."""
    orders = agent.orders(wait=0.5)
    for order in orders:
        if order["kind"] == "start":
            assert agent.report(order["job"], order["attempt"], "running").status_code == 200
            code = exit_code(order["job"])
            assert agent.report(order["job"], order["attempt"], "exited", code).status_code == 200
    return len(orders)


def max_running(log: list[dict[str, Any]], jobs: set[str]) -> int:
    running, peak = 0, 0
    for e in log:
        if e.get("job") not in jobs:
            continue
        if e["event"] == "start":
            running += 1
        elif e["event"] in ("finish", "fail", "cancel", "preempt", "lost", "restart") and "attempt" in e:
            running -= 1
        peak = max(peak, running)
    return peak


def test_an_array_of_1000_tasks_capped_at_4_never_runs_more_than_4(server: Server) -> None:
    agent = FakeAgent(server, "dgx01", 8, "H100-80GB")
    agent.register()
    with server.client() as c:
        spec = {"name": "sweep", "queue": "research", "gpus_per_replica": 1, "command": ["true"]}
        r = c.post("/v1/jobs", json={**spec, "array": "0-999%4"})
        assert r.status_code == 201, r.text
        array = r.json()
        assert array["tasks"] == 1000 and array["max_running"] == 4
        base = array["id"]
        tasks = c.get("/v1/jobs", params={"array": base, "limit": 10_000}).json()["jobs"]
        assert [t["id"] for t in tasks] == [f"{base}_{i}" for i in range(1000)]
        assert tasks[10]["reason"] == f"waits for a slot: array {base} runs at most 4 tasks at once (%4)"

        def done() -> bool:
            run_orders(agent)
            return bool(c.get(f"/v1/jobs/{base}").json()["states"] == {"finished": 1000})

        wait_for(done, timeout=600, interval=0)
        log = events(c)
        ids = {t["id"] for t in tasks}
        assert sum(1 for e in log if e["event"] == "finish" and e["job"] in ids) == 1000
        assert max_running(log, ids) == 4  # reached, never exceeded
        submits = [e for e in log if e["event"] == "submit" and e["job"] in ids]
        assert {e["array"] for e in submits} == {base} and submits[3]["array_task"] == 3
    agent.close()


def test_array_tasks_see_their_index_in_the_environment(server: Server) -> None:
    agent = FakeAgent(server, "dgx01", 8, "H100-80GB")
    agent.register()
    with server.client() as c:
        r = c.post("/v1/jobs", json={"queue": "research", "array": "1,3,5-9:2", "command": ["true"]})
        assert r.status_code == 201, r.text
        base = r.json()["id"]
        orders = wait_for(lambda: agent.orders(wait=1))
        env = {o["job"]: o["spec"]["env"] for o in orders}
        assert sorted(env) == sorted(f"{base}_{i}" for i in (1, 3, 5, 7, 9))
        e3 = env[f"{base}_3"]
        assert e3["CORRAL_ARRAY_TASK_ID"] == e3["SLURM_ARRAY_TASK_ID"] == "3"
        assert e3["CORRAL_ARRAY_JOB_ID"] == e3["SLURM_ARRAY_JOB_ID"] == base
        assert (e3["SLURM_ARRAY_TASK_COUNT"], e3["SLURM_ARRAY_TASK_MIN"], e3["SLURM_ARRAY_TASK_MAX"]) == (
            "5",
            "1",
            "9",
        )
    agent.close()


def test_cancel_hold_release_act_on_a_whole_array_or_one_task(server: Server) -> None:
    with server.client() as c:
        spec = {"queue": "research", "array": "0-5%2", "command": ["true"]}
        base = c.post("/v1/jobs", json=spec).json()["id"]
        held = c.post(f"/v1/jobs/{base}/hold")
        assert held.status_code == 200, held.text
        tasks = c.get("/v1/jobs", params={"array": base}).json()["jobs"]
        assert all(t["held"] for t in tasks)
        assert c.post(f"/v1/jobs/{base}/release").status_code == 200
        assert c.post(f"/v1/jobs/{base}_4/cancel").json()["state"] == "cancelled"
        whole = c.post(f"/v1/jobs/{base}/cancel").json()
        assert whole["states"] == {"cancelled": 6} and whole["state"] == "cancelled"
        assert c.get(f"/v1/jobs/{base}").json()["tasks"] == 6


def test_an_afterok_pipeline_runs_in_order(server: Server) -> None:
    agent = FakeAgent(server, "dgx01", 8, "H100-80GB")
    agent.register()
    with server.client() as c:
        base = {"queue": "research", "command": ["true"]}
        a = c.post("/v1/jobs", json={**base, "name": "prep"}).json()["id"]
        b = c.post("/v1/jobs", json={**base, "name": "train", "dependency": f"afterok:{a}"}).json()
        assert b["reason"] == f"waits for {a} to finish successfully"
        c3 = c.post("/v1/jobs", json={**base, "name": "eval", "dependency": f"afterok:{b['id']}"}).json()

        def done() -> bool:
            run_orders(agent)
            return bool(c.get(f"/v1/jobs/{c3['id']}").json()["state"] == "finished")

        wait_for(done, timeout=60, interval=0)
        log = events(c)
        starts = [e["job"] for e in log if e["event"] == "start"]
        assert starts == [a, b["id"], c3["id"]]
        seq = {(e["event"], e["job"]): e["seq"] for e in log if e["event"] in ("start", "finish")}
        b_id, c_id = b["id"], c3["id"]
        assert seq[("finish", a)] < seq[("start", b_id)] < seq[("finish", b_id)] < seq[("start", c_id)]
    agent.close()


def test_a_failed_first_step_cancels_the_rest_with_the_reason(server: Server) -> None:
    agent = FakeAgent(server, "dgx01", 8, "H100-80GB")
    agent.register()
    with server.client() as c:
        base = {"queue": "research", "command": ["true"], "max_restarts": 0}
        a = c.post("/v1/jobs", json=base).json()["id"]
        b = c.post("/v1/jobs", json={**base, "dependency": f"afterok:{a}"}).json()["id"]
        d = c.post("/v1/jobs", json={**base, "dependency": f"afterok:{b}"}).json()["id"]
        other = c.post("/v1/jobs", json={**base, "dependency": f"afternotok:{a}"}).json()["id"]

        def ended() -> bool:
            run_orders(agent, lambda job: 3 if job == a else 0)
            return bool(c.get(f"/v1/jobs/{d}").json()["state"] == "cancelled")

        wait_for(ended, timeout=60, interval=0)
        assert c.get(f"/v1/jobs/{a}").json()["state"] == "failed"
        jb = c.get(f"/v1/jobs/{b}").json()
        assert jb["state"] == "cancelled" and jb["start_time"] is None
        assert jb["reason"] == f"dependency never satisfied: {a} did not finish successfully (afterok:{a})"
        assert c.get(f"/v1/jobs/{d}").json()["reason"].startswith(f"dependency never satisfied: {b}")
        wait_for(lambda: run_orders(agent) >= 0 and c.get(f"/v1/jobs/{other}").json()["state"] == "finished")
        cancels = [e for e in events(c) if e["event"] == "cancel"]
        assert [e["job"] for e in cancels] == [b, d] and "never satisfied" in cancels[0]["reason"]
    agent.close()


def test_unknown_ids_and_cycles_are_refused_at_submit(server: Server) -> None:
    with server.client() as c:
        base = {"queue": "research", "command": ["true"]}
        r = c.post("/v1/jobs", json={**base, "dependency": "afterok:j999"})
        assert r.status_code == 422 and "no job or array j999" in r.json()["error"], r.text
        first = c.post("/v1/jobs", json=base).json()["id"]
        nxt = f"j{int(first[1:]) + 1}"  # the id this submission would get
        r = c.post("/v1/jobs", json={**base, "dependency": f"afterok:{first}:{nxt}"})
        assert r.status_code == 422 and r.json()["code"] == "dependency_cycle", r.text
        assert f"{nxt} would wait for itself" in r.json()["error"]
        r = c.post("/v1/jobs", json={**base, "array": "0-3%0"})
        assert r.status_code == 422 and "%N" in r.json()["error"] and "0-999%8" in r.json()["fix"]
        r = c.post("/v1/jobs", json={**base, "dependency": "afterwards:j1"})
        assert r.status_code == 422 and "not a dependency type" in r.json()["error"]
        assert c.get("/v1/jobs").json()["jobs"][-1]["id"] == first  # nothing refused was written


def test_singleton_waits_for_earlier_jobs_of_the_same_name(server: Server) -> None:
    agent = FakeAgent(server, "dgx01", 8, "H100-80GB")
    agent.register()
    with server.client() as c:
        base = {"queue": "research", "command": ["true"], "name": "nightly"}
        c.post("/v1/admin/pause")
        first = c.post("/v1/jobs", json=base).json()["id"]
        second = c.post("/v1/jobs", json={**base, "dependency": "singleton"}).json()
        assert second["dependency"] == "singleton"
        assert second["reason"] == f"waits for {first} to end"
        c.post("/v1/admin/resume")

        def done() -> bool:
            run_orders(agent)
            return bool(c.get(f"/v1/jobs/{second['id']}").json()["state"] == "finished")

        wait_for(done, timeout=60, interval=0)
        starts = [e["job"] for e in events(c) if e["event"] == "start"]
        assert starts == [first, second["id"]]
    agent.close()


def test_gates_survive_a_scheduler_restart(server: Server) -> None:
    import os
    import signal
    import subprocess

    agent = FakeAgent(server, "dgx01", 8, "H100-80GB")
    agent.register()
    with server.client() as c:
        first = c.post("/v1/jobs", json={"queue": "research", "command": ["true"]}).json()["id"]
        after = c.post(
            "/v1/jobs", json={"queue": "research", "command": ["true"], "dependency": f"afterok:{first}"}
        )
        spec = {"queue": "research", "array": "0-11%2", "command": ["true"]}
        base = c.post("/v1/jobs", json=spec).json()["id"]
        wait_for(lambda: agent.orders(wait=1))  # the first starts are out: nothing reported yet
        assert server.proc is not None
        children = subprocess.run(["pgrep", "-P", str(server.proc.pid)], capture_output=True, text=True)
        os.kill(int(children.stdout.split()[0]), signal.SIGKILL)  # the scheduler; the server restarts it
        agent.after = 0  # hear the orders again, as a restarted agent would
        waiting = c.get(f"/v1/jobs/{after.json()['id']}").json()
        assert (
            waiting["state"] == "pending" and waiting["reason"] == f"waits for {first} to finish successfully"
        )

        def done() -> bool:
            run_orders(agent)
            states = c.get(f"/v1/jobs/{base}").json()["states"]
            return bool(
                states == {"finished": 12}
                and c.get(f"/v1/jobs/{after.json()['id']}").json()["state"] == "finished"
            )

        wait_for(done, timeout=120, interval=0)
        log = events(c)
        tasks = {e["job"] for e in log if e.get("array") == base}
        assert max_running(log, tasks) == 2
    agent.close()
