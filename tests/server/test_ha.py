"""Several `corral server` replicas on one PostgreSQL, with real processes: one scheduler decides
at a time, a standby takes over when the leader's replica is killed, and a deposed leader lands
nothing (server/leader.py, server/replica.py; docs/runbook.md, High availability)."""

from __future__ import annotations

import os
import random
import re
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from corral.server.scheduler import FAULT_STOP_BEFORE_COMMIT
from tests.server.harness import FakeAgent, Server, wait_for
from tests.server.scenario import (
    NO_MIN_RUNTIME,
    allocation_problems,
    database,
    event_log_problems,
    events,
    write_cluster,
)
from tests.server.test_double_allocation import TERMINAL, BusyNode, shapes


@pytest.fixture
def pg_url(tmp_path: Path) -> Iterator[str]:
    with database("postgresql", tmp_path) as url:
        yield url


def health(srv: Server) -> dict[str, Any]:
    body: dict[str, Any] = httpx.get(srv.url + "/healthz", timeout=5).json()
    return body


def replicas(
    url: str, tmp_path: Path, env_a: dict[str, str] | None = None, extra: list[str] | None = None
) -> tuple[Server, Server]:
    """Replica a (started first: the leader) and replica b (a standby), on one database."""
    cluster = write_cluster(tmp_path, priority_classes=NO_MIN_RUNTIME)
    a = Server(url, tmp_path / "a", cluster, env=env_a, extra=extra)
    a.start()
    wait_for(lambda: health(a)["scheduler"] == "leader", timeout=30, interval=0.2)
    b = Server(url, tmp_path / "b", cluster, extra=extra)
    b.start()
    b._token = a.admin_token  # one database, one admin token
    return a, b


def metric(srv: Server, name: str) -> float:
    with srv.client() as c:
        text = c.get("/metrics").text
    found = re.search(rf"^{name} ([0-9.e+]+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


def test_kill_9_of_the_leader_a_standby_takes_over(pg_url: str, tmp_path: Path) -> None:
    a, b = replicas(pg_url, tmp_path)
    nodes: list[BusyNode] = []
    try:
        first = health(a)["epoch"]
        assert health(b) | {"uptime_s": 0} == {
            "ok": True, "uptime_s": 0, "scheduler": "standby", "epoch": first, "leader": health(a)["leader"],
        }  # fmt: skip
        assert metric(a, "corral_leader") == 1 and metric(b, "corral_leader") == 0
        nodes = [BusyNode(b, f"dgx0{i}", i) for i in (1, 2)]  # the agents talk to the survivor
        for n in nodes:
            n.thread.start()
        rng = random.Random(5)
        ids = []
        with a.client() as ca, b.client() as cb:
            for k in range(30):  # through both replicas
                r = (ca if k % 2 else cb).post("/v1/jobs", json=shapes(rng))
                assert r.status_code == 201, r.text
                ids.append(r.json()["id"])
            wait_for(lambda: len([e for e in events(cb) if e["event"] == "start"]) >= 3, timeout=30)
            killed = time.monotonic()
            a.kill()  # kill -9 of the leader's server and scheduler
            wait_for(lambda: health(b)["scheduler"] == "leader", timeout=40, interval=0.1)
            took = time.monotonic() - killed
            assert health(b)["epoch"] > first
            for _ in range(10):  # the new leader schedules what comes next too
                r = cb.post("/v1/jobs", json=shapes(rng))
                assert r.status_code == 201, r.text
                ids.append(r.json()["id"])

            def unfinished() -> list[str]:
                listed = cb.get("/v1/jobs", params={"limit": 1000}).json()["jobs"]
                states = {j["id"]: j["state"] for j in listed}
                return [i for i in ids if states[i] not in TERMINAL]

            wait_for(lambda: not unfinished(), timeout=120, interval=0.3)
            log = events(cb)
        assert took < 10 + 2 + 10  # the lease, a standby's poll, and slack for a loaded machine
        for n in nodes:
            assert n.errors == [] and n.conflicts == []  # no GPU given twice
        assert allocation_problems(pg_url) == []
        assert event_log_problems(log) == []
        starts = [(e["job"], e["attempt"]) for e in log if e["event"] == "start"]
        assert len(starts) == len(set(starts))  # no start decided twice
        assert {j for j, _ in starts} == set(ids)  # every acknowledged job ran
    finally:
        for n in nodes:
            n.close()
        a.kill()
        b.stop()


REFUSED = "corral_stale_commits_refused_total"


def stopped_pids(group: int) -> list[int]:
    """Processes of the process group `group` that are stopped (SIGSTOP)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] == "T" and int(fields[2]) == group:
            out.append(int(entry))
    return out


def test_a_leader_paused_past_its_lease_lands_nothing(pg_url: str, tmp_path: Path) -> None:
    flag = tmp_path / "stop-before-commit"
    a, b = replicas(pg_url, tmp_path, env_a={FAULT_STOP_BEFORE_COMMIT: str(flag)})
    agent = None
    try:
        assert a.proc is not None
        first = health(a)["epoch"]
        agent = FakeAgent(b, "dgx01", 8, "H100-80GB")
        agent.register()
        flag.touch()
        with a.client() as ca, b.client() as cb:
            r = ca.post("/v1/jobs", json={"queue": "research", "gpus_per_replica": 1, "command": ["x"]})
            assert r.status_code == 201, r.text
            job = r.json()["id"]
            wait_for(lambda: not flag.exists(), timeout=30)  # a's scheduler decided the start, stopped
            paused = wait_for(lambda: stopped_pids(a.proc.pid), timeout=10)
            # while it is stopped, scheduling is paused: whoever decides next must start nothing
            assert cb.post("/v1/admin/pause").status_code == 200
            wait_for(lambda: health(b)["scheduler"] == "leader", timeout=40, interval=0.2)
            assert health(b)["epoch"] > first
            for pid in paused:
                os.kill(pid, signal.SIGCONT)  # the old leader goes on with what it decided

            def state() -> str:
                return str(cb.get(f"/v1/jobs/{job}").json()["state"])

            # refused (with the fence), or landed (without it: the job would start while paused)
            wait_for(lambda: metric(a, REFUSED) >= 1 or state() != "pending", timeout=30, interval=0.2)
            assert state() == "pending"  # its start was refused
            assert metric(a, REFUSED) == 1
            assert [e for e in events(cb) if e["event"] == "start"] == []
            assert health(a)["scheduler"] == "standby" and health(b)["scheduler"] == "leader"
            assert cb.post("/v1/admin/resume").status_code == 200  # the new leader starts it, once
            wait_for(lambda: cb.get(f"/v1/jobs/{job}").json()["state"] == "starting", timeout=30)
            assert [(e["job"], e["attempt"]) for e in events(cb) if e["event"] == "start"] == [(job, 1)]
        assert "stepping down as leader" in a.log.read_text()
    finally:
        if agent is not None:
            agent.close()
        a.kill()
        b.stop()


def node(srv: Server, name: str) -> dict[str, Any]:
    with srv.client() as c:
        found: dict[str, Any] = next(n for n in c.get("/v1/nodes").json()["nodes"] if n["name"] == name)
        return found


def test_a_node_heard_by_one_replica_is_alive_on_all(pg_url: str, tmp_path: Path) -> None:
    # not responding after half of --lost-after (6 s): more than what sharing adds to a heartbeat's
    # age (a beat a second, written by b and read by a every 2 s each, slower on a loaded machine)
    a, b = replicas(pg_url, tmp_path, extra=["--lost-after", "12"])
    agent = None
    stop = threading.Event()
    refused: list[str] = []
    try:
        agent = FakeAgent(a, "dgx01", 8, "H100-80GB")
        agent.register()
        incarnation = agent.incarnation

        def beat() -> None:  # its heartbeats reach replica b only, every second
            with b.client(agent.token) as beats:
                while not stop.wait(1.0):
                    r = beats.post("/v1/agents/dgx01/heartbeat", json={"incarnation": incarnation})
                    if r.status_code != 200:
                        refused.append(r.text)

        beats = threading.Thread(target=beat, daemon=True)
        beats.start()
        for _ in range(26):  # more than twice --lost-after: replica a alone would have lost it
            time.sleep(1)
            assert (node(a, "dgx01")["state"], node(a, "dgx01")["responding"]) == ("up", True)
        a.stop()  # a replica's restart does not mark nodes heard through another one unheard
        a.start()
        assert (node(a, "dgx01")["state"], node(a, "dgx01")["responding"]) == ("up", True)
        time.sleep(8)
        assert (node(a, "dgx01")["state"], node(a, "dgx01")["responding"]) == ("up", True)
        stop.set()
        beats.join(10)
        assert refused == []
        # silent now: declared lost (12 s, and a few of sharing)
        wait_for(lambda: node(b, "dgx01")["state"] == "lost", timeout=40, interval=0.5)
        assert "Traceback" not in a.log.read_text() + b.log.read_text()
    finally:
        stop.set()
        if agent is not None:
            agent.close()
        a.kill()
        b.stop()


def test_tokens_and_login_codes_hold_on_every_replica(pg_url: str, tmp_path: Path) -> None:
    a, b = replicas(pg_url, tmp_path)
    try:
        member = a.token("ada", "member", team="research")
        with b.client(member) as on_b:
            assert on_b.get("/v1/jobs").status_code == 200  # cached on b now
            with a.client() as admin:
                token_id = next(
                    t["id"] for t in admin.get("/v1/tokens").json()["tokens"] if t["name"] == "ada"
                )
                assert admin.delete(f"/v1/tokens/{token_id}").status_code == 200  # revoked through a
            # refused on b too, within about a second (the cache is dropped on the change's mark)
            wait_for(lambda: on_b.get("/v1/jobs").status_code == 401, timeout=10, interval=0.2)
        with a.client() as admin:
            code = admin.post("/v1/login-links").json()["code"]  # made through a
        assert httpx.post(b.url + "/login", json={"code": code}).json() == {"token": a.admin_token}
        assert httpx.post(a.url + "/login", json={"code": code}).status_code == 401  # used once
    finally:
        a.kill()
        b.stop()
