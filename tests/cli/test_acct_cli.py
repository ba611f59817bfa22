"""`corral acct` against a real control plane (SQLite and PostgreSQL): one row per job and attempt,
filters, `--format`, JSON and CSV, paging by cursor, and members limited to their team."""

from __future__ import annotations

import csv
import io
import json
from typing import Any

from tests.cli.conftest import Cli
from tests.server.harness import FakeAgent, wait_for


def _state(cli: Cli, job: str) -> str:
    return str(cli.json("show", job)["state"])


def _history(cli: Cli) -> dict[str, str]:
    """A small history on dgx01: finished, failed, requeued then running, pending, cancelled."""
    alice = cli.server.token("alice", "member", team="research")
    bob = cli.server.token("bob", "member", team="prod")
    agent = FakeAgent(cli.server, "dgx01", 8, "H100-80GB")
    agent.register()

    def run(job: str, attempt: int) -> None:
        wait_for(lambda: _state(cli, job) == "starting" and cli.json("show", job)["attempt"] == attempt)
        assert agent.report(job, attempt, "running").status_code == 200

    ok = cli.json("submit", "--name", "ok", "--gpus", 2, "--", "true", token=alice)["id"]
    run(ok, 1)
    assert agent.report(ok, 1, "exited", 0).status_code == 200
    wait_for(lambda: _state(cli, ok) == "finished")
    bad = cli.json("submit", "--name", "bad", "--max-restarts", 0, "--", "false", token=alice)["id"]
    run(bad, 1)
    assert agent.report(bad, 1, "exited", 3).status_code == 200
    wait_for(lambda: _state(cli, bad) == "failed")
    moved = cli.json(
        "submit", "--name", "moved", "--queue", "prod", "--gpus", 4, "--", "sleep", 9, token=bob
    )["id"]
    run(moved, 1)
    cli.ok("requeue", moved)
    assert agent.report(moved, 1, "exited", 143).status_code == 200
    run(moved, 2)
    waits = cli.json("submit", "--name", "waits", "--gpus", 8, "--", "true", token=alice)["id"]
    wait_for(lambda: cli.json("show", waits)["reason"])
    gone = cli.json("submit", "--name", "gone", "--gpus", 8, "--", "true", token=alice)["id"]
    cli.ok("cancel", gone, token=alice)
    agent.close()
    return {"ok": ok, "bad": bad, "moved": moved, "waits": waits, "gone": gone, "alice": alice, "bob": bob}


def _settled(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows without what grows while a row is live (elapsed, GPU-hours, a pending job's wait)."""
    return [{k: v for k, v in r.items() if k not in ("elapsed", "gpu_hours", "wait")} for r in rows]


def _keys(rows: list[dict[str, Any]]) -> list[tuple[str, Any, str]]:
    return [(r["id"], r["attempt"], r["state"]) for r in rows]


def test_acct_rows_filters_formats_paging_and_team_scoping(cli: Cli) -> None:
    h = _history(cli)
    everything = cli.json("acct", "--all")
    rows = everything["rows"]
    assert everything["next"] is None
    assert _keys(rows) == [
        (h["ok"], 1, "finished"),
        (h["bad"], 1, "failed"),
        (h["moved"], 1, "requeued"),
        (h["moved"], 2, "running"),
        (h["waits"], None, "pending"),
        (h["gone"], None, "cancelled"),
    ]
    by = {(r["id"], r["attempt"]): r for r in rows}
    ok, bad = by[(h["ok"], 1)], by[(h["bad"], 1)]
    assert (ok["user"], ok["queue"], ok["gpus"], ok["nodes"], ok["exit_code"]) == (
        "alice",
        "research",
        2,
        ["dgx01"],
        0,
    )
    assert ok["submit"] <= ok["start"] <= ok["end"] and ok["elapsed"] == ok["end"] - ok["start"]
    assert abs(ok["gpu_hours"] - 2 * ok["elapsed"] / 3600) < 1e-6 and ok["wait"] == ok["start"] - ok["submit"]
    assert (bad["exit_code"], bad["job_state"]) == (3, "failed")
    first, second = by[(h["moved"], 1)], by[(h["moved"], 2)]
    assert first["reason"] == "requeued by admin" and first["job_state"] == "running"
    assert second["end"] is None and second["wait"] == max(0.0, second["start"] - first["end"])
    waits = by[(h["waits"], None)]
    assert waits["gpus"] == 8 and waits["start"] is None and waits["reason"] and waits["gpu_hours"] == 0

    # filters: state (repeat or comma list), user, queue, time window
    assert _keys(cli.json("acct", "--state", "failed")["rows"]) == [(h["bad"], 1, "failed")]
    both = cli.json("acct", "--state", "requeued,running")["rows"]
    assert [r["attempt"] for r in both] == [1, 2]
    assert {r["user"] for r in cli.json("acct", "--user", "alice")["rows"]} == {"alice"}
    assert {r["id"] for r in cli.json("acct", "--queue", "prod")["rows"]} == {h["moved"]}
    live = cli.json("acct", "--since", "2999-01-01")["rows"]  # only what has not ended
    assert _keys(live) == [(h["moved"], 2, "running"), (h["waits"], None, "pending")]
    assert cli.json("acct", "--until", "2000-01-01T00:00:00+00:00")["rows"] == []
    assert len(cli.json("acct", "--since", "1h")["rows"]) == 6

    # members see their team's jobs only; admins all
    mine = cli.json("acct", token=h["alice"])["rows"]
    assert {r["id"] for r in mine} == {h["ok"], h["bad"], h["waits"], h["gone"]}
    assert {r["id"] for r in cli.json("acct", token=h["bob"])["rows"]} == {h["moved"]}
    assert cli.json("acct", "--queue", "prod", token=h["alice"])["rows"] == []

    # paging: a stable order, a cursor per page, the same rows as one request
    pages, cursor = [], "0.0"
    while cursor is not None:
        page = cli.json("acct", "--limit", 4, "--page", cursor)
        pages.append(page["rows"])
        cursor = page["next"]
    assert [len(p) for p in pages] == [4, 2] and _settled([r for p in pages for r in p]) == _settled(rows)
    partial = cli("acct", "--limit", 4)
    assert partial.exit_code == 0 and "more rows: add --page " in partial.stderr
    assert len(partial.stdout.strip().splitlines()) == 5  # a header and 4 rows
    assert _settled(cli.json("acct", "--limit", 4, "--all")["rows"]) == _settled(rows)


def test_acct_formats_csv_table_and_bad_field_names(cli: Cli) -> None:
    h = _history(cli)
    out = cli.ok("acct", "--csv", "--format", "ID,attempt,state,gpus,nodes,start").stdout
    table = list(csv.reader(io.StringIO(out)))
    assert table[0] == ["id", "attempt", "state", "gpus", "nodes", "start"]
    assert table[1][:5] == [h["ok"], "1", "finished", "2", "dgx01"] and table[1][5].endswith("Z")
    assert table[5] == [h["waits"], "", "pending", "8", "", ""]
    every = list(csv.reader(io.StringIO(cli.ok("acct", "--csv").stdout)))
    assert every[0][:3] == ["id", "attempt", "name"] and len(every) == 7 and "gpu_hours" in every[0]
    picked = cli.json("acct", "--format", "id,gpu_hours")["rows"]
    assert all(set(r) == {"id", "gpu_hours"} for r in picked)
    plain = cli.ok("acct").stdout.splitlines()
    assert plain[0].split()[:6] == ["ID", "ATTEMPT", "NAME", "USER", "QUEUE", "STATE"]
    assert plain[1].split()[:6] == [h["ok"], "1", "ok", "alice", "research", "finished"]
    bad = cli("acct", "--format", "id,elapsd,nodez")
    assert bad.exit_code == 2
    assert "unknown fields elapsd, nodez" in bad.stderr and "id,attempt,name,user" in bad.stderr
    assert cli("acct", "--state", "nonsense").exit_code == 2
    assert "unknown state 'nonsense'" in cli("acct", "--state", "nonsense").stderr
    assert cli("acct", "--since", "yesterday-ish").exit_code == 2
    fields = cli.ok("acct", "--help-format").stdout
    assert fields.splitlines()[0].startswith("id ") and "gpu_hours" in fields
    with cli.server.client(cli.server.agent_token("dgx01")) as agent:
        assert agent.get("/v1/acct").status_code == 403
    with cli.server.client() as admin:
        refused = admin.get("/v1/acct", params={"after": "x"})
        assert refused.status_code == 422 and "cursor" in json.loads(refused.text)["error"]
