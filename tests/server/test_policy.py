"""The scheduling policy is configuration: changed by an admin as a revision, checked first, rolled back."""

from __future__ import annotations

from tests.server.harness import Server


def test_policy_change_is_a_checked_revision_that_rolls_back(server: Server) -> None:
    with server.client() as c:
        before = c.get("/v1/config/revisions").json()["revisions"]
        bad = c.put("/v1/policy", json={"name": "shortest-first"})
        assert bad.status_code == 422 and "shortest-first" in bad.json()["error"]
        bad_arg = c.put("/v1/policy", json={"name": "default", "args": {"fair_share": {"nope": 1}}})
        assert bad_arg.status_code == 422 and "nope" in bad_arg.json()["error"]
        assert c.get("/v1/config/revisions").json()["revisions"] == before  # nothing written
        r = c.put("/v1/policy", json={"name": "fifo", "comment": "incident 42: back to FIFO"})
        assert r.status_code == 200, r.text
        assert c.get("/v1/config").json()["config"]["policy"] == "fifo"
        history = c.get("/v1/config/revisions").json()
        assert history["revisions"][-1]["comment"] == "incident 42: back to FIFO"
        assert history["active"] == r.json()["revision"]
        back = c.post("/v1/config/rollback", json={"revision": before[-1]["revision"]})
        assert back.status_code == 200
        assert "policy" not in c.get("/v1/config").json()["config"]
        member = server.token("alice", "member", team="research")
    with server.client(member) as m:
        assert m.put("/v1/policy", json={"name": "fifo"}).status_code == 403
