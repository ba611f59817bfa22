"""Configuration revisions against live work (issue 13, finding 2), on SQLite and PostgreSQL.

A revision that drops a queue (or a priority class) that pending or running jobs still use is
refused by the API with 409, naming the jobs and how to drain them; nothing changes. A revision
that reaches the database some other way (written straight into it here, as a buggy tool or an
old server could) is refused by the scheduler, which keeps the last good revision in force and
says so (log, audit record, `GET /v1/config`, `/metrics`) instead of crash-looping: a job
submitted afterwards still starts, before and after a restart.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine, insert, update

from corral.store import schema
from corral.store.engine import append_events, dumps
from tests.server.harness import Server, wait_for
from tests.server.scenario import LAB, Agent, submit, wait_state, write_cluster

CRASH = "the scheduler process exited"


@pytest.fixture
def lab(database_url: str, tmp_path: Path) -> Iterator[Server]:
    srv = Server(database_url, tmp_path / "data", write_cluster(tmp_path))
    srv.start()
    try:
        yield srv
    finally:
        Agent.close_all()
        srv.stop()


def without_queue(name: str) -> dict[str, Any]:
    body = copy.deepcopy(LAB)
    body["queues"] = [q for q in body["queues"] if q["name"] != name]
    return body


def busy_research(c: httpx.Client, agent: Agent) -> tuple[str, str]:
    """A running job and a pending one, both in queue research."""
    running = submit(c, queue="research", gpus_per_replica=8)["id"]
    agent.run(running)
    pending = submit(c, queue="research", replicas=4, gpus_per_replica=8)["id"]
    return running, pending


def still_decides(srv: Server, c: httpx.Client, agent: Agent) -> None:
    """A job submitted now is started, and the scheduler process never died."""
    fresh = submit(c, queue="prod", gpus_per_replica=8)["id"]
    agent.run(fresh)
    wait_state(c, fresh, "running")
    assert CRASH not in srv.log.read_text()


def test_api_refuses_a_revision_without_a_queue_in_use(lab: Server, tmp_path: Path) -> None:
    with lab.client() as c:
        agent = Agent(lab, "dgx01")
        running, pending = busy_research(c, agent)
        active = c.get("/v1/config").json()["revision"]
        r = c.put("/v1/config", json=without_queue("research"))
        assert r.status_code == 409, r.text
        err = r.json()
        assert "research" in err["error"] and running in err["error"] and pending in err["error"]
        assert "cancel" in err["fix"] and err["code"] == "config_conflicts_with_live_jobs"
        assert c.get("/v1/config").json()["revision"] == active
        # the same through a rollback to a revision from before a queue existed
        r = c.put("/v1/queues/tmp", json={"quota": 0, "limit": 8})
        assert r.status_code == 200, r.text
        in_tmp = submit(c, queue="tmp", gpus_per_replica=1)["id"]
        r = c.post("/v1/config/rollback", json={"revision": active})
        assert r.status_code == 409 and in_tmp in r.json()["error"], r.text
        assert c.post(f"/v1/jobs/{in_tmp}/cancel").status_code == 200  # would take a GPU of dgx02
        # a priority class that live jobs use cannot go either
        body = c.get("/v1/config").json()["config"]
        classes = {"normal": {"value": 100}, "urgent": {"value": 10000}}
        r = c.put("/v1/config", json={**body, "priority_classes": {**classes, "low": {"value": 0}}})
        assert r.status_code == 200, r.text  # `high` unused: fine
        low_job = submit(c, queue="prod", gpus_per_replica=8, priority="low")["id"]
        r = c.put("/v1/config", json={**body, "priority_classes": classes})
        assert r.status_code == 409 and low_job in r.json()["error"] and "low" in r.json()["error"], r.text
        assert c.post(f"/v1/jobs/{low_job}/cancel").status_code == 200  # pending: it would take dgx02
        still_decides(lab, c, Agent(lab, "dgx02"))
    # a cluster file given at start is checked the same way: the server says why and exits
    lab.stop()
    (tmp_path / "new").mkdir()
    dropped = Server(
        lab.database_url, lab.data_dir, write_cluster(tmp_path / "new", without_queue("research"))
    )
    with pytest.raises(RuntimeError, match=f"queue research is not in it.*{running}"):
        dropped.start()
    assert "Traceback" not in dropped.log.read_text()


def insert_revision(url: str, body: dict[str, Any]) -> int:
    """Store `body` as the active revision straight in the database, with its `cluster` line."""
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            rev = conn.execute(
                insert(schema.config_revisions).values(
                    created_at=time.time(), author="a script", comment="", body=dumps(body)
                )
            ).inserted_primary_key
            assert rev is not None
            t = schema.settings
            conn.execute(update(t).where(t.c.key == "config.active").values(value=str(rev[0])))
            append_events(conn, [{"event": "cluster", "revision": int(rev[0])}], url.startswith("sqlite"))
        return int(rev[0])
    finally:
        engine.dispose()


@pytest.mark.parametrize("kind", ["queue in use", "not a cluster file"])
def test_scheduler_refuses_a_stored_revision_it_cannot_apply(lab: Server, kind: str) -> None:
    with lab.client() as c:
        agent = Agent(lab, "dgx01")
        running, pending = busy_research(c, agent)
        good = c.get("/v1/config").json()["revision"]
        body = without_queue("research") if kind == "queue in use" else {"queues": "research"}
        bad = insert_revision(lab.database_url, body)

        def refused() -> dict[str, Any] | None:
            r = c.get("/v1/config")
            assert r.status_code == 200, r.text
            out: dict[str, Any] = r.json()
            return out if out.get("refused", {}).get("revision") == bad else None

        config = wait_for(refused, timeout=20)
        assert config["revision"] == good and config["config"] == LAB
        why = config["refused"]["reason"]
        assert ("research" in why and pending in why) if kind == "queue in use" else "queues" in why, why
        assert c.get("/v1/config/revisions").json()["active"] == good
        audit = c.get("/v1/audit").json()["audit"]
        assert any(a["principal"] == "scheduler" and a["result"] == "refused" for a in audit), audit
        metrics = c.get("/metrics").text
        assert "corral_config_refused_total" in metrics
        assert (
            f"corral_config_revision {float(good)}" in metrics or f"corral_config_revision {good}" in metrics
        )
        still_decides(lab, c, Agent(lab, "dgx02"))
        assert c.get(f"/v1/jobs/{running}").json()["state"] == "running"
    # a restart does not bring the refused revision back, nor crash
    lab.stop()
    lab.start()
    with lab.client() as c:
        assert c.get("/v1/config").json()["revision"] == good
        late = submit(c, queue="prod", gpus_per_replica=8)["id"]
        wait_for(lambda: c.get(f"/v1/jobs/{late}").json()["reason"], timeout=20)
    assert CRASH not in lab.log.read_text()
