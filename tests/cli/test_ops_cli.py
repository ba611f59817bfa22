"""The operators' commands against a real control plane (SQLite and PostgreSQL): `nodes` and its
cordon/drain/undrain, `queues set|history|rollback`, `token create|list|revoke`, `audit`, `admin
pause|resume|backup|restore`, and refusals to people who may not (exit code 3)."""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path

from sqlalchemy import create_engine, text

from corral.store.inuse import exclusive
from tests.cli.conftest import Cli
from tests.server.harness import PG_ENV, FakeAgent, drop_postgres, fresh_postgres, wait_for


def test_nodes_cordon_drain_undrain(cli: Cli) -> None:
    agent = FakeAgent(cli.server, "dgx01", 8, "H100-80GB")
    agent.register()
    table = cli.ok("nodes").stdout.splitlines()
    assert table[0].split()[:4] == ["NODE", "STATE", "GPUS", "USED"]
    assert table[1].split()[:5] == ["dgx01", "up", "0/8", "8", "H100-80GB"]
    assert table[2].split()[:2] == ["dgx02", "down"] and "waiting for its agent" in table[2]
    before = time.time()
    assert cli.ok("nodes", "drain", "dgx01", "--deadline", "10m", "--reason", "new NICs").stdout == (
        "dgx01: draining (new NICs)\n"
    )
    node = next(n for n in cli.json("nodes")["nodes"] if n["name"] == "dgx01")
    assert node["state"] == "draining" and before + 600 <= node["drain_deadline"] <= time.time() + 600
    assert "new NICs (deadline " in cli.ok("nodes").stdout
    assert cli.json("nodes", "undrain", "dgx01") == {"name": "dgx01", "state": "up", "reason": ""}
    assert cli.ok("nodes", "cordon", "dgx01").stdout == "dgx01: cordoned (cordoned by admin)\n"
    assert cli.ok("nodes", "uncordon", "dgx01").stdout == "dgx01: up\n"
    bad = cli("nodes", "drain", "dgx01", "--deadline", "10")
    assert bad.exit_code == 2 and "--deadline '10': duration '10' has no unit" in bad.stderr
    missing = cli("nodes", "undrain", "dgx99")
    assert (
        missing.exit_code == 3
        and "error: no node dgx99 (fix: list them with `corral nodes`)" in missing.stderr
    )
    agent.close()


def test_the_server_says_where_it_is(cli: Cli) -> None:
    log = cli.server.log.read_text()
    url = cli.server.url
    assert f"corral server: API {url}/v1 (OpenAPI schema {url}/openapi.json)" in log
    assert f"  dashboard  {url}/" in log and f"  data       {cli.server.data_dir.resolve()}" in log
    assert "  scheduler  its own process, policy default" in log
    help_text = cli("server", "--help").output
    assert "--no-scheduler" in help_text and "--no-no-scheduler" not in help_text


def test_nodes_lists_unhealthy_gpus(cli: Cli) -> None:
    """The API gives unhealthy GPUs as {index: why}; the table shows their indices as ranges."""
    agent = FakeAgent(cli.server, "dgx01", 8, "H100-80GB", unhealthy={"3": "Xid 79", "4": "ECC", "6": "lost"})
    agent.register()
    table = cli.ok("nodes").stdout.splitlines()
    assert table[1].split()[:6] == ["dgx01", "draining", "0/8", "0", "H100-80GB", "3-4,6"]
    assert "GPU 3 unhealthy: Xid 79" in table[1]
    gpus = {g["index"]: g for g in cli.json("nodes", "--gpus")["nodes"][0]["gpu_list"]}
    assert gpus[3]["state"] == "unhealthy" and gpus[3]["reason"] == "Xid 79"
    assert "unhealthy (Xid 79)" in cli.ok("nodes", "--gpus").stdout
    agent.close()


def test_audit_filters_and_leaves_accepted_agent_reports_out(cli: Cli) -> None:
    agent = FakeAgent(cli.server, "dgx01", 8, "H100-80GB")
    agent.register()
    job = cli.json("submit", "--queue", "research", "--gpus", 1, "--", "true")["id"]
    start = wait_for(lambda: [o for o in agent.orders(wait=1.0) if o["kind"] == "start"], timeout=20)[0]
    assert agent.report(job, start["attempt"], "running").status_code == 200
    assert agent.report("j999", 1, "running").status_code >= 400  # a refused report is kept
    cli.ok("nodes", "cordon", "dgx01")
    actions = [a["action"] for a in cli.json("audit")["audit"]]
    assert "POST /v1/agents/register" in actions and "POST /v1/jobs" in actions
    assert actions.count("POST /v1/agents/dgx01/reports") == 1  # only the refused one
    assert [a["action"] for a in cli.json("audit", "--action", "/v1/nodes")["audit"]] == [
        "POST /v1/nodes/dgx01/cordon"
    ]
    mine = cli.json("audit", "--who", "agent-dgx01")["audit"]
    assert mine and {a["principal"] for a in mine} == {"agent-dgx01"}
    assert cli.json("audit", "--since", "1h")["audit"] and not cli.json("audit", "--since", "0s")["audit"]
    bad = cli("audit", "--since", "5")
    assert bad.exit_code == 2 and "--since '5'" in bad.stderr
    agent.close()


def test_queues_set_history_rollback(cli: Cli) -> None:
    listed = cli.ok("queues").stdout.splitlines()
    assert listed[0].split()[:5] == ["QUEUE", "WEIGHT", "QUOTA", "LIMIT", "COHORT"]
    assert listed[1].split()[:5] == ["research", "2", "16", "32", "main"]
    assert cli.ok(
        "queues", "set", "research", "--quota", 12, "--weight", 3, "--comment", "q3 plan"
    ).stdout == ("queue research changed: configuration revision 2\n")
    research = next(q for q in cli.json("queues")["queues"] if q["name"] == "research")
    assert (research["quota"], research["weight"]) == (12, 3.0)
    history = cli.json("queues", "history")
    assert history["active"] == 2 and [r["comment"] for r in history["revisions"]][-1] == "q3 plan"
    assert "* 2" in cli.ok("queues", "history").stdout
    assert cli.json("queues", "rollback", 1) == {"revision": 3}
    research = next(q for q in cli.json("queues")["queues"] if q["name"] == "research")
    assert (research["quota"], research["weight"]) == (16, 2.0)
    too_big = cli("queues", "set", "research", "--quota", 40)
    assert too_big.exit_code == 2 and "quota 40 exceeds the queue's limit 32" in too_big.stderr
    nothing = cli("queues", "set", "research")
    assert nothing.exit_code == 2 and "nothing to change" in nothing.stderr
    assert cli("queues", "rollback", 99).exit_code == 3
    assert cli.json("queues", "history")["active"] == 3  # the refusals changed nothing


def test_tokens_create_list_revoke_and_refusals_exit_3(cli: Cli) -> None:
    made = cli.json("token", "create", "bob", "--role", "member", "--team", "prod")
    assert made["role"] == "member" and made["team"] == "prod" and made["token"].startswith("crl_")
    bob = made["token"]
    research_job = cli.json("submit", "--queue", "research", "--gpus", 1, "--", "true")["id"]
    assert cli.json("jobs", token=bob) == {"jobs": []}  # not his team's
    assert [q["name"] for q in cli.json("queues", token=bob)["queues"]] == ["prod"]
    refusals = {
        ("show", research_job): f"no job {research_job} that you may see",
        ("cancel", research_job): f"no job {research_job} that you may see",
        ("nodes", "drain", "dgx01"): "only an admin may drain a node",
        ("queues", "set", "prod", "--quota", 1): "only an admin may change a queue",
        ("token", "list"): "only an admin may list tokens",
        ("audit",): "only an admin may read the audit log",
        ("submit", "--queue", "research", "--", "true"): "team prod may not submit to queue research",
    }
    for args, message in refusals.items():
        result = cli(*args, token=bob)
        assert result.exit_code == 3, (args, result.output)
        assert message in result.stderr
    assert cli.json("submit", "--queue", "prod", "--gpus", 1, "--", "true", token=bob)["user"] == "bob"
    listed = {t["id"]: t for t in cli.json("token", "list")["tokens"]}
    assert listed[made["id"]]["name"] == "bob" and "hash" not in listed[made["id"]]
    assert made["id"] in cli.ok("token", "list").stdout and bob not in cli.ok("token", "list").stdout
    assert cli.ok("token", "revoke", made["id"]).stdout == f"token {made['id']} revoked\n"
    revoked = cli("jobs", token=bob)
    assert revoked.exit_code == 3 and "the token is unknown or revoked" in revoked.stderr
    assert cli("token", "revoke", made["id"]).exit_code == 3
    wrong = cli("token", "create", "x", "--role", "wizard")
    assert wrong.exit_code == 2 and "unknown role 'wizard'" in wrong.stderr
    actions = [a["action"] for a in cli.json("audit")["audit"]]
    assert f"DELETE /v1/tokens/{made['id']}" in actions and "POST /v1/tokens" in actions


def test_admin_pause_resume_backup_restore(cli: Cli, tmp_path: Path) -> None:
    assert cli.json("admin", "pause") == {"paused": True}
    job = cli.json("submit", "--name", "kept", "--queue", "research", "--gpus", 1, "--", "true")["id"]
    assert cli.ok("admin", "resume").stdout == "scheduling resumed\n"
    backup = tmp_path / "corral.backup"
    out = cli.json("admin", "backup", backup)
    assert out["path"] == str(backup) and out["bytes"] == backup.stat().st_size > 0
    cli.server.stop()
    if cli.server.database_url.startswith("sqlite"):
        target_url, name = f"sqlite:///{tmp_path / 'restored.db'}", ""
    else:
        target_url, name = fresh_postgres(os.environ[PG_ENV])
    try:
        assert cli("admin", "restore", backup, "--database-url", target_url, input="n\n").exit_code == 1
        restored = cli.ok("admin", "restore", backup, "--database-url", target_url, "--yes")
        assert restored.stdout == f"restored {target_url} from {backup}; start the server again\n"
        if name:
            engine = create_engine(target_url)
            with engine.connect() as conn:
                rows = conn.execute(text("SELECT id, name FROM jobs")).all()
            engine.dispose()
        else:
            with sqlite3.connect(tmp_path / "restored.db") as conn:
                rows = conn.execute("SELECT id, name FROM jobs").fetchall()
        assert [tuple(r) for r in rows] == [(job, "kept")]
    finally:
        if name:
            drop_postgres(os.environ[PG_ENV], name)
    missing = cli("admin", "restore", tmp_path / "nope", "--database-url", target_url, "--yes")
    assert missing.exit_code == 2 and "no backup file" in missing.stderr


def test_admin_restore_refuses_a_database_a_server_uses(cli: Cli, tmp_path: Path) -> None:
    """The server (and its scheduler) hold a lease on the database: restore refuses, nothing changes;
    once it is stopped the restore runs; a server does not start while a restore holds it."""
    kept = cli.json("submit", "--name", "kept", "--queue", "research", "--gpus", 1, "--", "true")["id"]
    backup = tmp_path / "corral.backup"
    cli.json("admin", "backup", backup)
    later = cli.json("submit", "--name", "later", "--queue", "research", "--gpus", 1, "--", "true")["id"]
    url = cli.server.database_url
    refused = cli("admin", "restore", backup, "--database-url", url, "--yes")
    assert refused.exit_code == 1, refused.output
    assert "restore refused: the database" in refused.stderr
    assert "is in use by a running corral server or scheduler (fix: stop the server" in refused.stderr
    assert {j["id"] for j in cli.json("jobs")["jobs"]} == {kept, later}  # untouched, still served
    cli.server.stop()  # the scheduler process may take a moment longer to end and free the lease
    done = wait_for(
        lambda: (r := cli("admin", "restore", backup, "--database-url", url, "--yes")).exit_code == 0 and r
    )
    assert done.stdout.startswith("restored")
    with exclusive(url):
        try:
            cli.server.start()
            raise AssertionError("a server started on a database being restored")
        except RuntimeError as exc:
            assert "is being restored; start the server when it is done" in str(exc)
    cli.server.start()
    assert [j["id"] for j in cli.json("jobs")["jobs"]] == [kept]


def test_admin_policy_is_a_revision(cli: Cli) -> None:
    shown = cli.json("admin", "policy")  # GET /v1/policy: the server's --policy while no revision names one
    assert (shown["name"], shown["args"], shown["source"]) == ("default", {}, "the server's --policy")
    assert shown["plugins"]["fair_share"]["half_life"] > 0
    out = cli.ok("admin", "policy", "fifo", "--comment", "freeze: strict order").stdout
    assert out.startswith("policy fifo is active (configuration revision 2)")
    assert cli.json("queues", "history")["revisions"][-1]["comment"] == "freeze: strict order"
    tuned = cli.json("admin", "policy", "default", "--arg", "fair_share.half_life=604800")
    assert tuned == {"revision": 3}
    shown = cli.json("admin", "policy")
    assert (shown["name"], shown["revision"], shown["source"]) == ("default", 3, "configuration revision 3")
    assert shown["plugins"]["fair_share"]["half_life"] == 604800
    text = cli.ok("admin", "policy").stdout
    assert text.startswith("policy default (from configuration revision 3)\n")
    assert "half_life=604800 (set)" in text
    history = cli.ok("queues", "history").stdout.splitlines()
    assert history[0].split()[:5] == ["REVISION", "CREATED", "AUTHOR", "POLICY", "COMMENT"]
    assert "fifo" in history[2] and "default (fair_share.half_life=604800)" in history[3]
    assert [r["policy"] for r in cli.json("queues", "history")["revisions"]] == ["default", "fifo", "default"]
    unknown = cli("admin", "policy", "shortest")
    assert unknown.exit_code == 2 and "shortest" in unknown.stderr
    malformed = cli("admin", "policy", "default", "--arg", "half_life")
    assert malformed.exit_code == 2 and "PLUGIN.KEY=VALUE" in malformed.stderr
    assert cli.json("queues", "history")["active"] == 3
