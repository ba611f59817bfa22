"""What the dashboard asks of the server, over HTTP: the public shell and assets (and nothing
else public), one-time login links, who am I, the newest event, GPU use over time, simulation
reports, and jobs newest first."""

from __future__ import annotations

import httpx

from tests.server.harness import wait_for
from tests.web.conftest import corral, report
from tests.web.fleet import Fleet


def test_only_the_shell_and_its_assets_are_public(fleet: Fleet) -> None:
    url = fleet.server.url
    for path in ("/", "/login"):
        page = httpx.get(url + path)
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert "script-src 'self'" in page.headers["content-security-policy"]
        assert '<script type="module" src="/ui/js/main.js">' in page.text
    script = httpx.get(url + "/ui/js/main.js")
    assert script.status_code == 200 and "javascript" in script.headers["content-type"]
    assert script.headers["cache-control"] == "no-cache"
    assert httpx.get(url + "/ui/app.css").status_code == 200
    assert httpx.get(url + "/ui/missing.js").status_code == 404
    assert httpx.get(url + "/ui/../../etc/passwd").status_code in (401, 404)
    for path in ("/v1/nodes", "/v1/whoami", "/v1/usage/series", "/v1/reports", "/metrics", "/index.html"):
        assert httpx.get(url + path).status_code == 401, path
    assert httpx.post(url + "/v1/login-links").status_code == 401


def test_a_login_link_stands_for_its_token_once(fleet: Fleet) -> None:
    server = fleet.server
    dana = server.token("dana", "member", team="research")
    with server.client(dana) as c:
        made = c.post("/v1/login-links").raise_for_status().json()
        assert made["path"] == f"/login#code={made['code']}" and made["expires_in"] == 3600
        who = c.get("/v1/whoami").json()
        assert who == {"name": "dana", "role": "member", "team": "research", "node": ""}
    first = httpx.post(server.url + "/login", json={"code": made["code"]})
    assert first.status_code == 200 and first.json() == {"token": dana}
    again = httpx.post(server.url + "/login", json={"code": made["code"]})
    assert again.status_code == 401 and "used already" in again.json()["error"]
    assert httpx.post(server.url + "/login", json={"code": "forged"}).status_code == 401
    assert httpx.post(server.url + "/login", json={}).status_code == 422
    agent = fleet.agents["dgx01"].http
    assert agent.post("/v1/login-links").status_code == 403
    with server.client() as c:
        audit = c.get("/v1/audit").json()["audit"]
    assert {"POST /v1/login-links", "POST /login"} <= {a["action"] for a in audit}


def test_corral_dashboard_prints_a_working_link(fleet: Fleet) -> None:
    server = fleet.server
    frank = server.token("frank", "member", team="prod")
    shown = corral(server, frank, "dashboard")
    assert shown["url"] == server.url + "/" and shown["expires_in"] == 3600
    code = shown["login_link"].removeprefix(server.url + "/login#code=")
    assert httpx.post(server.url + "/login", json={"code": code}).json() == {"token": frank}


def test_usage_series_counts_gpus_in_use_and_waiting(fleet: Fleet) -> None:
    server = fleet.server
    erin = server.token("erin", "member", team="prod")
    with server.client(erin) as c:
        latest = c.get("/v1/events/latest").json()["seq"]
    jobs = [
        corral(server, erin, f"submit --name wide-{i} --queue batch --gpus 8 -- sleep 9") for i in range(2)
    ]
    with server.client(erin) as c:
        wait_for(lambda: c.get(f"/v1/jobs/{jobs[1]['id']}").json()["reason"])
        assert c.get("/v1/events/latest").json()["seq"] > latest
        series = c.get("/v1/usage/series", params={"span": 600, "points": 60}).json()
        nodes = c.get("/v1/nodes").json()["nodes"]
    assert len(series["t"]) == 60 and series["step"] == 10.0 and series["gpus"] == 64
    queues = {q["name"]: q for q in series["queues"]}
    assert "research" not in queues  # not erin's to see; the cluster line counts it
    assert queues["batch"]["allocated_now"] == 8 and queues["batch"]["pending_now"] == 8
    assert queues["batch"]["allocated"][-1] > 0 and queues["batch"]["pending"][-1] > 0
    assert series["cluster"]["allocated_now"] == sum(n["allocated"] for n in nodes)
    for job in jobs:
        corral(server, erin, f"cancel {job['id']}")
    with server.client() as c:
        wait_for(lambda: all(c.get(f"/v1/jobs/{j['id']}").json()["state"] == "cancelled" for j in jobs))


def test_jobs_newest_first_in_pages(fleet: Fleet) -> None:
    server = fleet.server
    made = [
        corral(server, server.admin_token, f"submit --name page-{i} --queue batch --gpus 1 -- true")
        for i in range(3)
    ]
    with server.client() as c:
        first = c.get("/v1/jobs", params={"before": 2**53, "limit": 2}).json()["jobs"]
        second = c.get("/v1/jobs", params={"before": first[-1]["seq"], "limit": 2}).json()["jobs"]
        oldest = c.get("/v1/jobs", params={"limit": 1}).json()["jobs"]
    seqs = [j["seq"] for j in first + second]
    assert seqs == sorted(seqs, reverse=True) and len(set(seqs)) == 4
    assert [j["name"] for j in first] == ["page-2", "page-1"]
    assert oldest[0]["seq"] == 1
    for job in made:
        corral(server, server.admin_token, f"cancel {job['id']}")


def test_reports_are_listed_and_served_sandboxed(fleet: Fleet) -> None:
    report(fleet)
    with fleet.server.client() as c:
        listed = c.get("/v1/reports").json()
        page = c.get("/v1/reports/policies")
        assert c.get("/v1/reports/..%2Fcorral.db").status_code == 404
        assert c.get("/v1/reports/nothing").status_code == 404
    assert [r["name"] for r in listed["reports"]] == ["policies"]
    assert listed["reports"][0]["title"] == "web" and listed["folder"].endswith("reports")
    assert page.status_code == 200 and page.headers["content-security-policy"] == "sandbox"
    assert "Key measures" in page.text
    assert fleet.agents["dgx01"].http.get("/v1/reports").status_code == 403
