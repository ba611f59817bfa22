"""schemathesis over the live API's `/openapi.json`, with an admin and a member token (issue 13).

Every operation of the OpenAPI document gets `CASES` generated requests per role against one
real `corral server` (API and scheduler processes, SQLite): no answer may be a 5xx. Excluded, so
that the run is not ended or the machine written to: revoking a token (it could be the one in
use) and `POST /v1/admin/{verb}` (its `backup` writes a file wherever it is told;
`test_hostile_input.py` covers its paths). Long polls are asked not to wait. Afterwards the
scheduler must still decide: a job submitted after the run is started, and the scheduler process
never died. The number of cases and of 5xx answers is printed at the end (`pytest -s`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, settings

from tests.server.harness import Server, wait_for
from tests.server.scenario import Agent, write_cluster

CASES = 8  # per operation and role; schemathesis adds its own: about a thousand per role
EXCLUDED = (("DELETE", "/v1/tokens/{token_id}"), ("POST", "/v1/admin/{verb}"))
LONG_POLLS = ("wait",)


class Run:
    """The server under test, a token per role, and what the run saw."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.tokens = {"admin": server.admin_token, "member": server.token("fuzz", "member", team="research")}
        self.cases: Counter[str] = Counter()
        self.errors: list[str] = []


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    tmp: Path = tmp_path_factory.mktemp("fuzz")
    srv = Server(
        f"sqlite:///{tmp / 'corral.db'}", tmp / "data", write_cluster(tmp), extra=["--allow-dynamic-nodes"]
    )
    srv.start()
    try:
        Agent(srv, "dgx01")
        out = Run(srv)
        yield out
        print(f"\nschemathesis: {dict(out.cases)} cases; {len(out.errors)} answers 5xx: {out.errors[:20]}")
    finally:
        Agent.close_all()
        srv.stop()


@pytest.fixture(scope="module")
def api_schema(run: Run) -> Any:
    with run.server.client() as c:
        doc = c.get("/openapi.json").json()
    schema = schemathesis.openapi.from_dict(doc)
    for method, path in EXCLUDED:
        schema = schema.exclude(method=method, path=path)
    return schema


schema = schemathesis.pytest.from_fixture("api_schema")


def call(run: Run, role: str, case: Any) -> None:
    for name in LONG_POLLS:
        if case.query and name in case.query:
            case.query[name] = 0
    headers = {"Authorization": f"Bearer {run.tokens[role]}"}
    response = case.call(base_url=run.server.url, headers=headers, timeout=60)
    run.cases[role] += 1
    if response.status_code >= 500:
        run.errors.append(f"{role}: {case.method} {case.formatted_path} -> {response.status_code}")
    assert response.status_code < 500, (case.method, case.formatted_path, case.body, response.text[:500])


FUZZ = settings(
    max_examples=CASES,
    deadline=None,
    derandomize=True,  # the same cases on every run: CI is reproducible
    database=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),
)


@schema.parametrize()
@FUZZ
def test_no_server_error_as_admin(case: Any, run: Run) -> None:
    call(run, "admin", case)


@schema.parametrize()
@FUZZ
def test_no_server_error_as_member(case: Any, run: Run) -> None:
    call(run, "member", case)


def test_scheduler_still_decides_after_the_run(run: Run) -> None:
    """Whatever the run changed (paused, queues, nodes cordoned), a job submitted now starts."""
    srv = run.server
    assert run.cases["admin"] >= 300 and run.cases["member"] >= 300, run.cases
    with srv.client() as c:
        assert c.post("/v1/admin/resume").status_code == 200
        for j in c.get("/v1/jobs", params={"limit": 10_000}).json()["jobs"]:
            if j["state"] == "pending":  # the run's own submissions must not take the new node first
                c.post(f"/v1/jobs/{j['id']}/cancel")
        r = c.put(
            "/v1/queues/after-fuzz", json={"quota": 0, "limit": 8, "cohort": "after-fuzz", "teams": ["x"]}
        )
        assert r.status_code == 200, r.text
        Agent(srv, "after-fuzz-node")
        job = c.post("/v1/jobs", json={"queue": "after-fuzz", "gpus_per_replica": 8, "command": ["true"]})
        assert job.status_code == 201, job.text
        started = wait_for(
            lambda: c.get(f"/v1/jobs/{job.json()['id']}").json()["state"] in ("starting", "running"),
            timeout=30,
        )
        assert started
    assert "the scheduler process exited" not in srv.log.read_text()
    with httpx.Client() as plain:
        assert plain.get(srv.url + "/healthz").status_code == 200
