"""What each token role may see of the configuration, login links, and failed authentications
(issue 13, finding 9), against a live server on SQLite and PostgreSQL.

Members see their team's queues only in `/v1/config` (as in `/v1/queues`) and no authors or
comments in `/v1/config/revisions`; agents see neither. A login code made before its token
was revoked no longer hands that token back, and `/login`'s answer is never cached. Failed
authentications are throttled per address (429 with Retry-After) while a valid token from the
same address is never refused.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import httpx
import pytest

from tests.server.harness import Server
from tests.server.scenario import running_server, write_cluster

BURST = 5


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("exposure")
    with running_server(request.param, tmp, write_cluster(tmp), ["--auth-failures", str(BURST)]) as srv:
        with srv.client() as c:
            r = c.put("/v1/queues/prod", json={"mount_allowlist": ["/secret/prod-data"], "teams": ["prod"]})
            assert r.status_code == 200, r.text
        yield srv


def test_members_see_their_queues_only_and_agents_nothing(server: Server) -> None:
    member = server.token("ana", "member", team="research")
    agent = server.token("agent-x", "agent", node="dgx01")
    with server.client() as admin, server.client(member) as m, server.client(agent) as a:
        full = admin.get("/v1/config").json()["config"]
        assert {q["name"] for q in full["queues"]} == {"research", "prod"}
        mine = m.get("/v1/config")
        assert mine.status_code == 200, mine.text
        body = mine.json()["config"]
        assert [q["name"] for q in body["queues"]] == ["research"]
        assert "prod-data" not in mine.text and '"prod"' not in mine.text
        assert body["topology"] == full["topology"]  # what the dashboard draws
        history = m.get("/v1/config/revisions").json()
        assert history["revisions"]
        assert all(set(r) == {"revision", "created_at"} for r in history["revisions"])
        assert "admin" not in str(history["revisions"]) and "queue prod" not in str(history)
        assert {"author", "comment"} <= set(admin.get("/v1/config/revisions").json()["revisions"][-1])
        for path in ("/v1/config", "/v1/config/revisions"):
            r = a.get(path)
            assert r.status_code == 403 and "agent tokens" in r.json()["error"], r.text


def test_login_link_of_a_revoked_token(server: Server) -> None:
    secret = server.token("bo", "member", team="research")
    with server.client(secret) as b:
        fresh = b.post("/v1/login-links").json()["code"]
        stale = b.post("/v1/login-links").json()["code"]
    r = httpx.post(server.url + "/login", json={"code": fresh})
    assert r.status_code == 200 and r.json()["token"] == secret, r.text
    assert "no-store" in r.headers["cache-control"]
    with server.client() as admin:
        tid = next(t["id"] for t in admin.get("/v1/tokens").json()["tokens"] if t["name"] == "bo")
        assert admin.delete(f"/v1/tokens/{tid}").status_code == 200
    r = httpx.post(server.url + "/login", json={"code": stale})
    assert r.status_code == 401 and "revoked" in r.json()["error"], r.text
    assert secret not in r.text


def until_throttled(send: Callable[[], httpx.Response]) -> tuple[list[int], httpx.Response]:
    """Send failures until one is answered 429 (the bucket regains one a second, so on a slow
    machine a few more 401s may come first); returns the statuses before it, and the 429."""
    statuses: list[int] = []
    for _ in range(200):
        r = send()
        if r.status_code == 429:
            return statuses, r
        statuses.append(r.status_code)
    raise AssertionError(f"never throttled: {statuses}")


def test_failed_authentications_are_throttled_but_valid_tokens_pass(server: Server) -> None:
    bad = {"Authorization": "Bearer crl_t000000000000_guess"}
    before, r = until_throttled(lambda: httpx.get(server.url + "/v1/jobs", headers=bad))
    assert len(before) >= BURST and set(before) == {401}, before
    assert int(r.headers["retry-after"]) >= 1 and "too many failed" in r.json()["error"], r.text
    until_throttled(lambda: httpx.get(server.url + "/v1/jobs"))  # no token at all: a failure too
    until_throttled(lambda: httpx.post(server.url + "/login", json={"code": "guessed"}))
    # a valid token from the same address, cached or not, is never refused
    with server.client() as admin:
        assert admin.get("/v1/jobs").status_code == 200
    never_used = server.token("cy", "member", team="research")
    with server.client(never_used) as c:
        assert c.get("/v1/jobs").status_code == 200
    assert httpx.get(server.url + "/healthz").status_code == 200
