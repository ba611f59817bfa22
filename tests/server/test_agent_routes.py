"""The agents' hot routes served without FastAPI's request handling (heartbeat, assignments)
check their input as the declared routes do: 422 with the field and the fix."""

from __future__ import annotations

from tests.server.harness import FakeAgent, Server


def test_assignments_check_their_query(server: Server) -> None:
    agent = FakeAgent(server, "dgx01", 8, "H100-80GB")
    agent.register()
    try:
        assert agent.orders() == []
        for query, field in (
            ("after=-1", "query.after"),
            ("wait=61", "query.wait"),
            ("after=x", "query.after"),
        ):
            r = agent.http.get(f"/v1/agents/dgx01/assignments?{query}")
            assert r.status_code == 422 and field in r.json()["error"] and r.json()["fix"], r.text
        r = agent.http.get("/v1/agents/dgx01/assignments", params={"after": 0, "wait": 0.1, "other": 1})
        assert r.status_code == 200 and r.json() == {"orders": []}
        assert agent.http.get("/v1/agents/dgx02/assignments").status_code == 403  # not its node
    finally:
        agent.close()
