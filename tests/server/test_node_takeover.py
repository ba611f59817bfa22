"""Issue 13, finding 4: a join token not bound to a node cannot take over a registered node; an
admin must first forget the node (`corral nodes forget`, `POST /v1/nodes/{name}/forget`), which
revokes the tokens bound to it (DESIGN.md 6.6: per-node join tokens bound at first registration)."""

from __future__ import annotations

from tests.cli.conftest import Cli, cli  # noqa: F401  (fixture)
from tests.server.harness import FakeAgent, Server, wait_for


def submit(server: Server) -> str:
    with server.client() as c:
        r = c.post(
            "/v1/jobs",
            json={"queue": "research", "gpus_per_replica": 8, "command": ["train"], "env": {"SECRET": "s3"}},
        )
        assert r.status_code == 201, r.text
        return str(r.json()["id"])


def events_of(server: Server, job_id: str) -> list[str]:
    with server.client() as c:
        return [e["event"] for e in c.get(f"/v1/jobs/{job_id}/events").json()["events"]]


def test_an_unbound_join_token_cannot_take_over_a_registered_node(server: Server) -> None:
    owner = FakeAgent(server, "dgx01", 8, "H100-80GB")
    owner.register()
    job_id = submit(server)
    orders = wait_for(lambda: owner.orders(wait=1), timeout=15)
    assert orders[0]["job"] == job_id
    assert owner.report(job_id, 1, "running").status_code == 200

    thief = server.token("stray", "agent")  # `corral token create stray --role agent`, no --node
    inventory = {"node": "dgx01", "gpus": 8, "gpu_model": "H100-80GB"}
    with server.client(thief) as c:
        r = c.post("/v1/agents/register", json={**inventory, "running": []})
        assert r.status_code == 403, r.text
        assert "already bound" in r.json()["error"] and "corral nodes forget dgx01" in r.json()["fix"]
        # still unbound: it reads no orders (job env included) and sends no reports for dgx01
        assert c.get("/v1/agents/dgx01/assignments").status_code == 403
        exited = {"incarnation": owner.incarnation, "job": job_id, "attempt": 1, "status": "exited"}
        assert c.post("/v1/agents/dgx01/reports", json={**exited, "exit_code": 1}).status_code == 403
    # the node's own agent is untouched: same incarnation, its attempt still running, nothing lost
    beat = owner.http.post("/v1/agents/dgx01/heartbeat", json={"incarnation": owner.incarnation})
    assert beat.status_code == 200, beat.text
    assert "lost" not in events_of(server, job_id)
    with server.client() as c:
        assert c.get(f"/v1/jobs/{job_id}").json()["state"] == "running"
    # the refused token may still join a node nobody holds
    with server.client(thief) as c:
        r = c.post("/v1/agents/register", json={**inventory, "node": "dgx02"})
        assert r.status_code == 200, r.text
    owner.close()


def test_an_admin_forgets_a_node_then_a_new_join_token_may_register_it(cli: Cli) -> None:  # noqa: F811
    server = cli.server
    owner = FakeAgent(server, "dgx01", 8, "H100-80GB")
    owner.register()
    member = server.token("alice", "member", team="research")
    refused = cli("nodes", "forget", "dgx01", token=member)
    assert refused.exit_code == 3 and "admin" in refused.stderr
    assert "forgotten" in cli.ok("nodes", "forget", "dgx01").stdout
    # the old agent's token is revoked at once
    beat = owner.http.post("/v1/agents/dgx01/heartbeat", json={"incarnation": owner.incarnation})
    assert beat.status_code == 401, beat.text
    newcomer = server.token("dgx01-new", "agent")
    with server.client(newcomer) as c:
        r = c.post("/v1/agents/register", json={"node": "dgx01", "gpus": 8, "gpu_model": "H100-80GB"})
        assert r.status_code == 200, r.text
    missing = cli("nodes", "forget", "dgx99")
    assert missing.exit_code == 3 and "no node dgx99" in missing.stderr
    owner.close()
