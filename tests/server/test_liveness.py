"""Lost nodes, readmission only clean, planned maintenance and GPU health, through the agents' API
of a real control plane (issue 6; DESIGN.md 5, 6.1). Agents are FakeAgents with a heartbeat
thread, so that silence is something a test decides."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.agent.test_agent import events, job
from tests.server.conftest import LAB
from tests.server.harness import FakeAgent, Server, lost_after_server, wait_for

LOST_AFTER = 3.0


class Beating(FakeAgent):
    """A FakeAgent that heartbeats every 0.5 s while `alive` is set."""

    def __init__(self, server: Server, node: str) -> None:
        super().__init__(server, node, 8, "H100-80GB")
        self.alive = threading.Event()
        self.done = threading.Event()
        self.answers: list[dict[str, Any]] = []
        self.thread = threading.Thread(target=self._beat, daemon=True)

    def start(self) -> None:
        self.register()
        self.alive.set()
        self.thread.start()

    def beat(self, **extra: Any) -> Any:
        return self.http.post(
            f"/v1/agents/{self.node}/heartbeat", json={"incarnation": self.incarnation, **extra}
        )

    def _beat(self) -> None:
        while not self.done.wait(0.5):
            if self.alive.is_set():
                try:
                    r = self.beat()
                except httpx.HTTPError:  # the server stopped at the end of the test
                    return
                if r.status_code == 200:
                    self.answers.append(r.json())

    def close(self) -> None:
        self.done.set()
        self.thread.join(5)
        super().close()


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Server]:
    srv = lost_after_server(tmp_path, LAB, LOST_AFTER)
    try:
        yield srv
    finally:
        srv.stop()


def node(server: Server, name: str) -> dict[str, Any]:
    with server.client() as c:
        return next(n for n in c.get("/v1/nodes").json()["nodes"] if n["name"] == name)


def submit(server: Server, **spec: Any) -> str:
    with server.client() as c:
        r = c.post("/v1/jobs", json={"queue": "research", "command": ["train"], **spec})
        assert r.status_code == 201, r.text
        return str(r.json()["id"])


def test_a_silent_node_is_lost_its_job_runs_elsewhere_and_it_returns_only_clean(lab: Server) -> None:
    one, two = Beating(lab, "dgx01"), Beating(lab, "dgx02")
    one.start()
    job_id = submit(lab, gpus_per_replica=8)
    wait_for(lambda: one.orders(wait=1), timeout=10)
    assert one.report(job_id, 1, "running").status_code == 200
    old = one.incarnation
    two.start()
    one.alive.clear()  # dgx01 goes silent
    orders = wait_for(lambda: two.orders(wait=1), timeout=LOST_AFTER + 10)
    assert orders[0]["kind"] == "start" and orders[0]["attempt"] == 2, orders
    lost = node(lab, "dgx01")
    assert lost["state"] == "lost" and "no heartbeat" in lost["reason"], lost
    ended = [e for e in events(lab, job_id) if e["event"] == "lost"]
    assert ended and ended[0]["attempt"] == 1 and "dgx01 lost" in ended[0]["reason"], ended
    assert job(lab, job_id)["restarts"] == 0  # a disruption, not a failure

    # dgx01 comes back: heartbeats and stale reports are refused; it must register again
    r = one.beat()
    assert r.status_code == 409 and "declared lost" in r.json()["error"], r.text
    assert one.report(job_id, 1, "exited", 0).status_code == 409
    # its agent still runs attempt 1: readmitted only once that is killed
    r = one.http.post(
        "/v1/agents/register", json={**one.inventory, "running": [{"job": job_id, "attempt": 1}]}
    )
    assert r.status_code == 200 and r.json()["stale"] == [f"{job_id}/1"] and r.json()["state"] == "lost"
    stale_incarnation = r.json()["incarnation"]
    one.register()  # clean now
    assert one.incarnation > stale_incarnation > old
    assert node(lab, "dgx01")["state"] == "up"
    assert job(lab, job_id)["attempt"] == 2  # the job was never given back to dgx01
    one.close()
    two.close()


def test_a_node_silent_for_half_of_lost_after_takes_no_new_work_until_it_answers(tmp_path: Path) -> None:
    """Slurm's NOT_RESPONDING: an agent this silent may be past its lease (it could not launch), so
    the scheduler places nothing there; the node keeps its state and its first heartbeat ends it."""
    lost_after = 12.0  # not responding after 6 s, lost after 12 s
    srv = lost_after_server(tmp_path, LAB, lost_after)
    one = Beating(srv, "dgx01")
    try:
        one.start()
        assert node(srv, "dgx01")["responding"] is True
        one.alive.clear()
        silent = wait_for(lambda: (x := node(srv, "dgx01"))["responding"] is False and x, timeout=lost_after)
        assert silent["state"] == "up" and silent["free"] == 0, silent
        job_id = submit(srv, gpus_per_replica=8)
        assert one.orders(wait=1.5) == []  # the only node with GPUs is not answering
        assert job(srv, job_id)["state"] == "pending"
        one.alive.set()  # answers again before it is lost: the job starts there
        orders = wait_for(lambda: one.orders(wait=1), timeout=10)
        assert orders[0]["kind"] == "start" and orders[0]["job"] == job_id, orders
        back = node(srv, "dgx01")
        assert back["responding"] is True and back["state"] == "up", back
        assert one.report(job_id, 1, "running").status_code == 200
    finally:
        one.close()
        srv.stop()


def test_with_lost_after_0_a_silent_node_is_never_lost_but_takes_no_work_past_its_lease(
    tmp_path: Path,
) -> None:
    """Issue 13: `--lost-after 0` loses no node, but a node silent for three quarters of the 20 s
    lease still gets no new work (its agent may be past its lease and refuse to launch)."""
    srv = lost_after_server(tmp_path, LAB, 0)
    one = Beating(srv, "dgx01")
    try:
        one.start()
        one.alive.clear()
        silent = wait_for(lambda: (x := node(srv, "dgx01"))["responding"] is False and x, timeout=30)
        assert silent["state"] == "up" and silent["free"] == 0, silent
        one.alive.set()
        wait_for(lambda: node(srv, "dgx01")["responding"], timeout=10)
    finally:
        one.close()
        srv.stop()


def test_maintenance_keeps_silent_nodes_and_extends_leases(lab: Server) -> None:
    one = Beating(lab, "dgx01")
    one.start()
    wait_for(lambda: one.answers, timeout=15)
    assert one.answers[-1]["lease_s"] == pytest.approx(LOST_AFTER * 2 / 3)
    with lab.client() as c:
        r = c.post("/v1/admin/maintenance", json={"seconds": 60})
        assert r.status_code == 200, r.text
        assert c.post("/v1/admin/maintenance", json={"seconds": -1}).status_code == 422
    lease = one.beat().json()["lease_s"]
    assert 60 < lease <= 60 + LOST_AFTER
    one.alive.clear()
    threading.Event().wait(LOST_AFTER + 2)
    assert node(lab, "dgx01")["state"] == "up"  # not lost during maintenance
    with lab.client() as c:
        assert c.post("/v1/admin/maintenance", json={"seconds": 0}).json() == {"maintenance_until": None}
    wait_for(lambda: node(lab, "dgx01")["state"] == "lost", timeout=LOST_AFTER + 5)
    one.close()


def test_an_unhealthy_gpu_requeues_its_gang_and_drains_the_node(lab: Server) -> None:
    one, two = Beating(lab, "dgx01"), Beating(lab, "dgx02")
    one.start()
    job_id = submit(lab, gpus_per_replica=8, checkpoint={"grace": "5s"})
    wait_for(lambda: one.orders(wait=1), timeout=10)
    one.report(job_id, 1, "running")
    two.start()
    r = one.beat(unhealthy={"3": "XID 79"})
    assert r.status_code == 200, r.text
    (stop,) = wait_for(lambda: one.orders(wait=1), timeout=15)
    assert stop["kind"] == "stop" and stop["attempt"] == 1 and stop["grace"] == 5, stop
    drained = node(lab, "dgx01")
    assert drained["state"] == "draining" and drained["reason"] == "GPU 3 unhealthy: XID 79", drained
    assert drained["unhealthy"] == {"3": "XID 79"}
    one.report(job_id, 1, "exited", 143)  # it saved and stopped on the signal
    (start,) = wait_for(lambda: two.orders(wait=1), timeout=10)
    assert start["attempt"] == 2 and start["placement"][0]["node"] == "dgx02"
    state = job(lab, job_id)
    assert state["restarts"] == 0, state
    ending = [
        e for e in events(lab, job_id) if e.get("attempt") == 1 and e["event"] in ("preempt", "restart")
    ]
    assert ending and ending[0]["event"] == "preempt" and "unhealthy GPU dgx01:3" in ending[0]["reason"]
    one.close()
    two.close()


def test_processes_that_survive_a_kill_keep_new_work_off_the_node(lab: Server) -> None:
    one = Beating(lab, "dgx01")
    one.start()
    r = one.beat(unclean=["j7/1"])
    assert r.status_code == 200, r.text
    stuck = node(lab, "dgx01")
    assert stuck["state"] == "draining" and "processes of j7/1 survived their kill" in stuck["reason"]
    job_id = submit(lab, gpus_per_replica=8)
    assert not one.orders(wait=1.5)  # no new work while they remain
    assert one.beat(unclean=[]).status_code == 200
    assert node(lab, "dgx01")["state"] == "up"
    orders = wait_for(lambda: one.orders(wait=1), timeout=15)
    assert orders[0]["job"] == job_id
    one.close()
