"""Clients of two `corral server` replicas on one PostgreSQL (real processes on loopback).

Both replicas run a scheduler; A, started first, holds the leader lease and B stands by (the
lease itself is tests/server/test_ha.py's business). This file checks what the clients promise
(docs/cli.md, "Several servers"): a client given both addresses loses and duplicates no submission when the
replica it uses is killed with -9 mid-request, the CLI works with a dead first address, and an
agent given both addresses keeps its lease and its work when its replica dies.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from typer.testing import CliRunner

from corral.agent.records import lease_until
from corral.cli.main import app
from corral.client import Client, ClientError
from tests.server.harness import PG_ENV, Server, drop_postgres, free_port, fresh_postgres, wait_for

LAB = Path(__file__).resolve().parents[2] / "examples" / "lab.yaml"
SPEC = {"queue": "research", "command": ["true"], "gpus_per_replica": 1}
AS_ROOT = ["--default-user", "root", "--allow-root-jobs"] if os.geteuid() == 0 else []


@pytest.fixture
def replicas(tmp_path: Path) -> Iterator[tuple[Server, Server]]:
    """Replica A (scheduler and API) and replica B (API only) on one fresh PostgreSQL database."""
    admin = os.environ.get(PG_ENV)
    if not admin:
        pytest.skip(f'{PG_ENV} is not set: start one with `eval "$(bash scripts/postgres.sh start)"`')
    url, name = fresh_postgres(admin)
    a = Server(url, tmp_path / "a", LAB, extra=["--lost-after", "30"])
    b = Server(url, tmp_path / "b", None, extra=["--lost-after", "30"])
    try:
        a.start()
        b.start()
        b._token = a.admin_token  # one database, one admin token
        yield a, b
    finally:
        b.stop()
        a.stop()
        drop_postgres(admin, name)


def database_rows(url: str) -> tuple[list[str], dict[str, str]]:
    """Every job id, and every idempotency key with the job it made."""
    engine = create_engine(url)
    with engine.connect() as conn:
        jobs = [str(r[0]) for r in conn.execute(text("SELECT id FROM jobs"))]
        keys = {str(k): str(j) for k, j in conn.execute(text('SELECT "key", job_id FROM idempotency_keys'))}
    engine.dispose()
    return jobs, keys


def test_a_replica_killed_mid_request_loses_and_doubles_nothing(replicas: tuple[Server, Server]) -> None:
    a, b = replicas
    acknowledged: dict[str, str] = {}  # key -> the job id the client was answered
    errors: list[str] = []
    stop = threading.Event()
    lock = threading.Lock()

    def submitter() -> None:
        with Client(f"{a.url},{b.url}", a.admin_token) as c:
            while not stop.is_set():
                key = str(uuid.uuid4())
                try:
                    job = c.submit(SPEC, key=key)
                except ClientError as err:
                    errors.append(str(err))
                    continue
                with lock:
                    acknowledged[key] = job["id"]

    threads = [threading.Thread(target=submitter) for _ in range(8)]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: len(acknowledged) >= 100, timeout=60)
        a.kill()  # -9, with submissions in flight on its connections
        at_kill = len(acknowledged)
        wait_for(lambda: len(acknowledged) >= at_kill + 100, timeout=60)
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    assert errors == []  # B answered every request A could not
    jobs, keys = database_rows(a.database_url)
    # every acknowledged job exists, once, under the key it was submitted with, and no job
    # exists that no acknowledgement names (a retry that made a second job would be one)
    assert sorted(jobs) == sorted(acknowledged.values())
    assert len(set(acknowledged.values())) == len(acknowledged)
    assert keys == acknowledged
    with b.client() as c:
        replayed = [
            line
            for line in c.get("/metrics").text.splitlines()
            if line.startswith("corral_submissions_total")
        ]
    print(f"{len(acknowledged)} submissions; on B after the kill: {replayed}")


def test_a_retry_after_the_answer_was_lost_returns_the_same_job(replicas: tuple[Server, Server]) -> None:
    a, b = replicas
    key = str(uuid.uuid4())
    with a.client() as direct:  # A writes the job; its answer is then "lost" with A
        made = direct.post("/v1/jobs", json=SPEC, headers={"Idempotency-Key": key})
        assert made.status_code == 201, made.text
    a.kill()
    with Client(f"{a.url},{b.url}", a.admin_token) as c:
        again = c.submit(SPEC, key=key)
        assert again["id"] == made.json()["id"] and c.server == b.url
    jobs, keys = database_rows(a.database_url)
    assert jobs == [made.json()["id"]] and keys == {key: made.json()["id"]}


def test_the_cli_works_with_a_dead_first_address(replicas: tuple[Server, Server], tmp_path: Path) -> None:
    a, b = replicas
    dead = f"http://127.0.0.1:{free_port()}"
    env = {"CORRAL_CONFIG": str(tmp_path / "none.json"), "CORRAL_SERVER": "", "CORRAL_TOKEN": ""}
    runner = CliRunner()
    both = f"{dead},{b.url}"
    out = runner.invoke(
        app, ["submit", "--server", both, "--token", a.admin_token, "--json", "--", "true"], env=env
    )
    assert out.exit_code == 0, out.output
    job_id = json.loads(out.output)["id"]
    listed = runner.invoke(
        app, ["jobs", "--json"], env={**env, "CORRAL_SERVER": both, "CORRAL_TOKEN": a.admin_token}
    )
    assert listed.exit_code == 0, listed.output
    assert job_id in [j["id"] for j in json.loads(listed.output)["jobs"]]
    # both dead: exit code 4 and each address named
    a.kill()
    b.kill()
    down = runner.invoke(app, ["jobs", "--server", f"{dead},{b.url}", "--token", a.admin_token], env=env)
    assert down.exit_code == 4
    assert f"{dead}: connection refused" in down.output and f"{b.url}: connection refused" in down.output


def test_an_agent_keeps_its_lease_and_runs_work_when_its_replica_dies(
    replicas: tuple[Server, Server], tmp_path: Path
) -> None:
    a, b = replicas
    data = tmp_path / "agent"
    log = tmp_path / "agent.log"
    command = [sys.executable, "-c", "from corral.cli.main import main; main()", "agent"]
    command += ["--server", f"{b.url},{a.url}", "--token", a.agent_token("dgx01"), "--node", "dgx01"]
    command += ["--gpus", "8", "--gpu-model", "H100-80GB", "--data-dir", str(data)]
    command += ["--checkpoint-root", str(tmp_path / "ckpt"), *AS_ROOT]
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    with open(log, "wb") as out:
        agent = subprocess.Popen(
            command, env=clean, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        wait_for(lambda: f"joined {b.url}" in log.read_text(), timeout=30)  # the first address
        b.kill()  # the replica the agent talks to
        killed = time.monotonic()
        # a heartbeat sent after the kill was accepted (by A): the lease (20 s) runs from then
        wait_for(lambda: (lease_until(data) or 0.0) > killed + 20.0, timeout=30)
        with a.client() as c:
            job = c.post("/v1/jobs", json=SPEC).json()["id"]
            wait_for(lambda: c.get(f"/v1/jobs/{job}").json()["state"] == "finished", timeout=60)
            node = next(n for n in c.get("/v1/nodes").json()["nodes"] if n["name"] == "dgx01")
            assert node["state"] != "lost", node
        assert agent.poll() is None, log.read_text()
    finally:
        if agent.poll() is None:
            os.killpg(agent.pid, 15)
            agent.wait(30)
