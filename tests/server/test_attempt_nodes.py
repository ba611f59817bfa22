"""One answer to "which attempts run on node N" (server/allocations.py, table `attempt_nodes`):
registration's reconcile, a report's check of the reporting node and the master ports taken on
a node all read it, and agree, for a 0-GPU job (which holds no allocation row) and for a gang
on two nodes; a drain stops the 0-GPU job too. On SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from corral.server.allocations import master_ports, placed_on
from corral.store.engine import make_engines
from tests.server.harness import Server
from tests.server.scenario import Agent, allocation_problems, job, submit, wait_state, write_cluster

NODES = ("dgx01", "dgx02", "dgx03", "dgx04")


@pytest.fixture
def lab(database_url: str, tmp_path: Path) -> Iterator[Server]:
    srv = Server(database_url, tmp_path / "data", write_cluster(tmp_path))
    srv.start()
    try:
        yield srv
    finally:
        Agent.close_all()
        srv.stop()


def started(lab: Server) -> tuple[dict[str, Agent], dict[str, dict[str, Any]]]:
    """A gang of 2 x 8 GPUs, a 0-GPU job and a 1-GPU job, each started: their start orders."""
    agents = {n: Agent(lab, n) for n in NODES}
    with lab.client() as c:
        ids = [
            submit(c, queue="research", replicas=2, gpus_per_replica=8)["id"],
            submit(c, queue="research", gpus_per_replica=0)["id"],
            submit(c, queue="research", gpus_per_replica=1)["id"],
        ]
        placements = {i: wait_state(c, i, "starting")["placement"] for i in ids}
    orders: dict[str, dict[str, Any]] = {}
    for i, placement in placements.items():
        for node in {p["node"] for p in placement}:
            orders[i] = agents[node].expect("start", i, 1)
    assert len({p["node"] for p in placements[ids[0]]}) == 2  # the gang spans two nodes
    assert placements[ids[1]][0]["gpus"] == []  # the 0-GPU job holds no GPU
    return agents, orders


def test_the_three_answers_agree(lab: Server) -> None:
    agents, orders = started(lab)
    everything = [{"job": i, "attempt": 1} for i in orders]
    expected = {n: {i for i, o in orders.items() if n in {p["node"] for p in o["placement"]}} for n in NODES}
    assert any(len(s) >= 2 for s in expected.values())
    engines = make_engines(lab.database_url)
    try:
        with engines.reader.connect() as conn:
            by_node = {n: {p.job for p in placed_on(conn, [n])} for n in NODES}
            ports = master_ports(conn, NODES)
    finally:
        engines.dispose()
    assert by_node == expected
    # master ports: on the node of replica 0 only, the port the start order names
    assert ports == {
        n: {o["master_port"] for o in orders.values() if o["placement"][0]["node"] == n} for n in NODES
    }
    for node in NODES:  # two attempts with replica 0 on one node never share a master port
        masters = [o for o in orders.values() if o["placement"][0]["node"] == node]
        assert len(ports[node]) == len(masters), (node, masters)
    for node, agent in agents.items():
        # a report is accepted from exactly the nodes the attempt runs on
        for i in orders:
            status = agent.report(i, 1, "running").status_code
            assert status == (200 if i in expected[node] else 404), (node, i, status)
        # a registration that claims every attempt: the server knows those on the node, the rest are stale
        agent.inventory["running"] = everything
        answer = agent.register()
        assert {x["job"] for x in answer["live"]} == expected[node]
        assert set(answer["stale"]) == {f"{i}/1" for i in orders if i not in expected[node]}
    assert allocation_problems(lab.database_url) == []


def test_a_drain_stops_a_job_without_gpus(lab: Server) -> None:
    agents, orders = started(lab)
    cpu_only = next(i for i, o in orders.items() if o["placement"][0]["gpus"] == [])
    node = orders[cpu_only]["placement"][0]["node"]
    with lab.client() as c:
        r = c.post(f"/v1/nodes/{node}/drain", json={"reason": "test", "deadline": 0})
        assert r.status_code == 200, r.text
        stop = agents[node].expect("stop", cpu_only, 1)
        assert stop["job"] == cpu_only
        assert job(c, cpu_only)["state"] == "stopping"
