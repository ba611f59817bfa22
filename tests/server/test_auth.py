"""Tokens and rights (DESIGN.md 6.6) on every route of the live API, on SQLite and PostgreSQL.

Every route but `/healthz` needs a token: no token, a bad one and a revoked one get 401 on
every path and method the OpenAPI document lists. Members act only on their team's jobs and
queues and never on nodes, configuration, tokens, audit or admin verbs; agents only for their
own node and never on the jobs API. Revoking a token takes effect at once.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.server.harness import FakeAgent, Server, wait_for
from tests.server.scenario import events, job, running_server, submit, write_cluster

# plausible values for the path parameters of every route
PATH_VALUES = {"job_id": "j1", "node": "dgx01", "token_id": "t000000000000", "verb": "pause", "number": "1"}
BODIES: dict[str, Any] = {
    "/v1/jobs": {"queue": "research", "command": ["true"]},
    "/v1/agents/register": {"node": "dgx01", "gpus": 8, "gpu_model": "H100-80GB"},
    "/v1/agents/{node}/heartbeat": {"incarnation": 1},
    "/v1/agents/{node}/reports": {"incarnation": 1, "job": "j1", "attempt": 1, "status": "exited"},
    "/v1/queues/{name}": {"quota": 1},
    "/v1/config": {"name": "x", "queues": [{"name": "x"}]},
    "/v1/config/rollback": {"revision": 1},
    "/v1/tokens": {"name": "intruder", "role": "admin"},
    "/v1/admin/{verb}": {"path": "/tmp/corral-intruder.db"},
}  # fmt: skip


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One server for the module: these tests only read, or check that nothing changed."""
    tmp = tmp_path_factory.mktemp("auth")
    # hundreds of refused tokens on purpose: not throttled here (test_exposure.py tests the throttle)
    with running_server(request.param, tmp, write_cluster(tmp), ["--auth-failures", "0"]) as srv:
        yield srv


def fill(path: str) -> str:
    def value(m: re.Match[str]) -> str:
        name = m.group(1)
        if name == "action":
            return "drain" if path.startswith("/v1/nodes") else "cancel"
        if name == "name":
            return "dgx01" if path.startswith("/v1/nodes") else "research"
        return PATH_VALUES[name]

    return re.sub(r"\{(\w+)\}", value, path)


def routes(server: Server) -> list[tuple[str, str]]:
    """(method, path template) of every operation in the live OpenAPI document."""
    with server.client() as c:
        r = c.get("/openapi.json")
        assert r.status_code == 200, r.text
        doc = r.json()
    return sorted((m.upper(), p) for p, ops in doc["paths"].items() for m in ops)


def token_id(server: Server, name: str) -> str:
    with server.client() as c:
        found = [t for t in c.get("/v1/tokens").json()["tokens"] if t["name"] == name]
    assert len(found) == 1, found
    return str(found[0]["id"])


def revoked_token(server: Server, name: str) -> str:
    """A member token that worked (so the server cached it) and was then revoked."""
    secret = server.token(name, "member", team="research")
    with server.client(secret) as c:
        assert c.get("/v1/jobs").status_code == 200
    with server.client() as c:
        assert c.delete(f"/v1/tokens/{token_id(server, name)}").status_code == 200
    return secret


def snapshot(server: Server) -> dict[str, Any]:
    """What a refused call must not change: jobs, events, tokens, configuration, nodes, pause."""
    with server.client() as c:
        nodes = {n["name"]: n["state"] for n in c.get("/v1/nodes").json()["nodes"]}
        tokens = sorted((t["id"], t["revoked_at"], t["node"]) for t in c.get("/v1/tokens").json()["tokens"])
        return {
            "jobs": c.get("/v1/jobs").json()["jobs"],
            "events": events(c),
            "tokens": tokens,
            "config": c.get("/v1/config").json(),
            "revisions": len(c.get("/v1/config/revisions").json()["revisions"]),
            "nodes": nodes,
        }  # fmt: skip


def test_every_route_needs_a_token(server: Server) -> None:
    ops = routes(server)
    assert ("GET", "/metrics") in ops and ("GET", "/healthz") in ops
    assert len(ops) >= 20, ops
    ops = [op for op in ops if op[1] != "/healthz"] + [
        ("GET", "/openapi.json"),
        ("GET", "/docs"),
        ("GET", "/redoc"),
    ]
    revoked = revoked_token(server, "revoked-member")
    before = snapshot(server)
    cases = {
        "no token": {},
        "bearer without a token": {"Authorization": "Bearer"},
        "another scheme": {"Authorization": f"Basic {server.admin_token}"},
        "bad token": {"Authorization": "Bearer crl_t000000000000_not-a-real-secret"},
        "revoked token": {"Authorization": f"Bearer {revoked}"},
    }
    wrong = []
    with httpx.Client(base_url=server.url, timeout=30) as c:
        for method, template in ops:
            path = fill(template)
            body = BODIES.get(template)
            for label, headers in cases.items():
                r = c.request(method, path, headers=headers, json=body)
                if r.status_code != 401 or "token" not in r.json()["error"]:
                    wrong.append(f"{method} {path} with {label}: {r.status_code} {r.text[:120]}")
            # a body that is not even JSON is refused for the token first, not parsed
            if method in ("POST", "PUT"):
                r = c.request(method, path, content=b"{nope", headers={"content-type": "application/json"})
                if r.status_code != 401:
                    wrong.append(f"{method} {path} with no token and a broken body: {r.status_code}")
        assert not wrong, "\n".join(wrong)
        assert c.get("/healthz").status_code == 200
    assert snapshot(server) == before
    with server.client() as c:  # the documents FastAPI serves without a token are off
        assert c.get("/docs").status_code == 404 and c.get("/redoc").status_code == 404
        metrics = c.get("/metrics")
        assert metrics.status_code == 200 and "corral_gpus" in metrics.text


def test_revoking_takes_effect_at_once(server: Server) -> None:
    member = server.token("soon-revoked", "member", team="research")
    with server.client(member) as m, server.client() as admin:
        for _ in range(3):  # cached now
            assert m.get("/v1/jobs").status_code == 200
        tid = token_id(server, "soon-revoked")
        assert admin.delete(f"/v1/tokens/{tid}").status_code == 200
        r = m.get("/v1/jobs")
        assert r.status_code == 401 and "revoked" in r.json()["error"]
        assert m.post("/v1/jobs", json={"queue": "research", "command": ["true"]}).status_code == 401
        r = admin.delete(f"/v1/tokens/{tid}")
        assert r.status_code == 404 and "no live token" in r.json()["error"]
        # an agent's token, bound to its node and cached by its heartbeats
        agent = FakeAgent(server, "dgx04", 8, "H100-80GB")
        agent.register()
        beat = {"incarnation": agent.incarnation}
        assert agent.http.post("/v1/agents/dgx04/heartbeat", json=beat).status_code == 200
        assert admin.delete(f"/v1/tokens/{token_id(server, 'agent-dgx04')}").status_code == 200
        assert agent.http.post("/v1/agents/dgx04/heartbeat", json=beat).status_code == 401
        assert agent.http.get("/v1/agents/dgx04/assignments").status_code == 401
        agent.close()
        assert admin.post("/v1/nodes/dgx04/cordon").status_code == 200  # no work for a node nobody runs
        # the revocations are audited
        actions = [(a["action"], a["result"]) for a in admin.get("/v1/audit").json()["audit"]]
        assert (f"DELETE /v1/tokens/{tid}", "200") in actions and (
            f"DELETE /v1/tokens/{tid}",
            "404",
        ) in actions


def test_teams_see_and_touch_only_their_jobs(server: Server) -> None:
    research = server.token("ana", "member", team="research")
    prod = server.token("bo", "member", team="prod")
    with server.client(research) as r, server.client(prod) as p, server.client() as admin:
        assert admin.post("/v1/admin/pause").status_code == 200  # the jobs stay pending meanwhile
        theirs = submit(r, name="secret", queue="research", gpus_per_replica=8, command=["sleep", "1"])
        jid = theirs["id"]
        assert theirs["team"] == "research" and theirs["user"] == "ana"
        mine = submit(p, queue="prod", gpus_per_replica=1)
        # the other team: 404 (it cannot even learn the job exists), nothing changes
        for method, path in [("GET", f"/v1/jobs/{jid}"), ("GET", f"/v1/jobs/{jid}/events")] + [
            ("POST", f"/v1/jobs/{jid}/{action}") for action in ("cancel", "hold", "release", "requeue")
        ]:
            resp = p.request(method, path)
            assert resp.status_code in (403, 404), (method, path, resp.text)
            assert "secret" not in resp.text
        assert jid not in [x["id"] for x in p.get("/v1/jobs").json()["jobs"]]
        assert jid not in [x["id"] for x in p.get("/v1/jobs", params={"queue": "research"}).json()["jobs"]]
        assert mine["id"] in [x["id"] for x in p.get("/v1/jobs").json()["jobs"]]
        assert all(e.get("job") != jid for e in events(p))
        assert any(e.get("job") == mine["id"] for e in events(p))
        assert [q["name"] for q in p.get("/v1/queues").json()["queues"]] == ["prod"]
        assert all(u["queue"] == "prod" for u in p.get("/v1/usage").json()["usage"])
        # nor may it submit to the other team's queue
        resp = p.post("/v1/jobs", json={"queue": "research", "command": ["true"]})
        assert resp.status_code == 403
        assert "may not submit to queue research" in resp.json()["error"] and "prod" in resp.json()["fix"]
        # the job is untouched, and its own team and the admin see it
        after = job(admin, jid)
        assert after["state"] == "pending" and not after["held"]
        assert jid in [x["id"] for x in r.get("/v1/jobs").json()["jobs"]]
        assert [e["event"] for e in r.get(f"/v1/jobs/{jid}/events").json()["events"]] == ["submit"]
        assert any(e.get("job") == jid for e in events(r))
        assert mine["id"] not in [x["id"] for x in r.get("/v1/jobs").json()["jobs"]]
        # its own team may act on it
        assert r.post(f"/v1/jobs/{jid}/hold").status_code == 200
        assert r.post(f"/v1/jobs/{jid}/cancel").status_code == 200
        assert job(r, jid)["state"] == "cancelled"
        assert p.post(f"/v1/jobs/{mine['id']}/cancel").status_code == 200
        assert admin.post("/v1/admin/resume").status_code == 200


def test_members_cannot_run_the_cluster(server: Server) -> None:
    member = server.token("cy", "member", team="research")
    some_token = token_id(server, "cy")
    before = snapshot(server)
    refused = [
        *[("POST", f"/v1/nodes/dgx01/{a}", {"deadline": 0}) for a in ("cordon", "drain", "undrain")],
        ("PUT", "/v1/queues/research", {"quota": 32, "limit": 32}),
        ("PUT", "/v1/queues/mine", {"quota": 0, "teams": ["research"]}),
        ("PUT", "/v1/config", {"name": "mine", "queues": [{"name": "research"}]}),
        ("POST", "/v1/config/rollback", {"revision": 1}),
        ("GET", "/v1/tokens", None),
        ("POST", "/v1/tokens", {"name": "me-admin", "role": "admin"}),
        ("DELETE", f"/v1/tokens/{some_token}", None),
        ("GET", "/v1/audit", None),
        *[("POST", f"/v1/admin/{verb}", {"path": "/tmp/x.db"}) for verb in ("pause", "resume", "backup")],
    ]
    with server.client(member) as m:
        for method, path, body in refused:
            r = m.request(method, path, json=body)
            assert r.status_code == 403, (method, path, r.text)
            assert "only an admin" in r.json()["error"], r.text
        # what members may do: look
        for path in (
            "/v1/nodes",
            "/v1/queues",
            "/v1/config",
            "/v1/config/revisions",
            "/v1/usage",
            "/metrics",
        ):
            assert m.get(path).status_code == 200, path
        assert m.get("/v1/jobs").status_code == 200  # the token still works
        # nor may a member speak for a node
        r = m.post("/v1/agents/register", json={"node": "dgx01", "gpus": 8, "gpu_model": "H100-80GB"})
        assert r.status_code == 403
        assert m.get("/v1/agents/dgx01/assignments").status_code == 403
    assert snapshot(server) == before


def test_agents_act_only_for_their_node(server: Server) -> None:
    a = FakeAgent(server, "dgx01", 8, "H100-80GB")
    a.register()
    b = FakeAgent(server, "dgx02", 8, "H100-80GB")
    b.register()
    with server.client() as admin:
        wait_for(
            lambda: {n["name"]: n["state"] for n in admin.get("/v1/nodes").json()["nodes"]}["dgx02"] == "up"
        )
        jid = submit(admin, queue="prod", gpus_per_replica=8, command=["sleep", "60"])["id"]
        # whichever of the two nodes holds the job, the other node's agent must not speak for it
        placed = wait_for(lambda: job(admin, jid)["placement"])
        owner, other = (a, b) if placed[0]["node"] == "dgx01" else (b, a)
        # another node's routes, with this node's token
        reg = {"node": owner.node, "gpus": 8, "gpu_model": "H100-80GB"}
        exited = {
            "incarnation": owner.incarnation,
            "job": jid,
            "attempt": 1,
            "status": "exited",
            "exit_code": 0,
        }
        for method, path, body in [
            ("POST", "/v1/agents/register", reg),
            ("POST", f"/v1/agents/{owner.node}/heartbeat", {"incarnation": owner.incarnation}),
            ("GET", f"/v1/agents/{owner.node}/assignments", None),
            ("POST", f"/v1/agents/{owner.node}/reports", exited),
        ]:
            r = other.http.request(method, path, json=body)
            assert r.status_code == 403, (method, path, r.text)
            assert f"belongs to node {other.node}" in r.json()["error"]
        # reporting the other node's job on its own node is refused too
        r = other.report(jid, 1, "exited", 0)
        assert r.status_code == 404, r.text
        assert job(admin, jid)["state"] in ("starting", "running")
        # the jobs API, the event log and admin routes are closed to agents
        for method, path in [
            ("GET", "/v1/jobs"), ("POST", "/v1/jobs"), ("GET", f"/v1/jobs/{jid}"),
            ("GET", f"/v1/jobs/{jid}/events"), ("POST", f"/v1/jobs/{jid}/cancel"),
            ("POST", f"/v1/jobs/{jid}/requeue"), ("GET", "/v1/events"), ("POST", "/v1/nodes/dgx01/drain"),
            ("PUT", "/v1/queues/prod"), ("GET", "/v1/audit"), ("POST", "/v1/admin/pause"),
            ("GET", "/v1/tokens"), ("GET", "/v1/usage"),
        ]:  # fmt: skip
            body = {"queue": "prod", "command": ["true"]} if path == "/v1/jobs" else {}
            r = other.http.request(method, path, json=body)
            assert r.status_code == 403, (method, path, r.text)
        assert job(admin, jid)["state"] in ("starting", "running")
        # a token bound to a node at creation cannot register as another
        bound = server.token("agent-for-dgx03", "agent", node="dgx03")
        with server.client(bound) as c:
            r = c.post("/v1/agents/register", json={"node": "dgx04", "gpus": 8, "gpu_model": "H100-80GB"})
            assert r.status_code == 403 and "belongs to node dgx03" in r.json()["error"]
        # a join token not yet bound may only register: it cannot read or speak for a node meanwhile
        unbound = server.token("agent-unbound", "agent")
        with server.client(unbound) as c:
            for method, path, body in [
                ("GET", f"/v1/agents/{owner.node}/assignments", None),
                ("POST", f"/v1/agents/{owner.node}/heartbeat", {"incarnation": owner.incarnation}),
                ("POST", f"/v1/agents/{owner.node}/reports", exited),
            ]:
                r = c.request(method, path, json=body)
                assert r.status_code == 403, (method, path, r.text)
            # it may not register a node another token is bound to (dgx03's, made with --node)
            r = c.post("/v1/agents/register", json={"node": "dgx03", "gpus": 8, "gpu_model": "H100-80GB"})
            assert r.status_code == 403 and "already bound" in r.json()["error"], r.text
            # and once bound to one node at its first registration, it stays bound
            r = c.post("/v1/agents/register", json={"node": "dgx04", "gpus": 8, "gpu_model": "H100-80GB"})
            assert r.status_code == 200, r.text
            r = c.post("/v1/agents/register", json={"node": owner.node, "gpus": 8, "gpu_model": "H100-80GB"})
            assert r.status_code == 403
            assert c.get(f"/v1/agents/{owner.node}/assignments").status_code == 403
        assert job(admin, jid)["state"] in ("starting", "running")
        assert admin.post(f"/v1/jobs/{jid}/cancel").status_code == 200
    a.close()
    b.close()
