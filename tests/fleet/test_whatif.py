"""The cluster's own history, exported and replayed (issue 19; docs/whatif.md): one live run of a
real control plane with the fleet (tests/fleet/whatif_live.py), then `corral trace export`,
`corral whatif` and the evidence kept with a change, all through the real command line."""

from __future__ import annotations

import csv
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import Result
from typer.testing import CliRunner

from corral.cli.main import app
from corral.config.cluster_file import load_cluster_file
from corral.sim.trace import read_trace
from tests.fleet.whatif_live import JOBS, LiveHistory, live_history

# The fleet starts a job tens of milliseconds after the scheduler's decision and reports its exit
# a little after the sleep ends; on a loaded 2-core machine more. A job's observed run time is its
# `sleep` plus that, never less.
START_LATENCY = 2.0


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveHistory]:
    yield from live_history(tmp_path_factory.mktemp("whatif"))


def corral(live: LiveHistory, *args: object, input: str | None = None) -> Result:
    env = {
        "CORRAL_SERVER": live.server.url,
        "CORRAL_TOKEN": live.server.admin_token,
        "CORRAL_CONFIG": str(live.tmp / "no-config.json"),
        "COLUMNS": "200",
    }
    return CliRunner().invoke(app, [str(a) for a in args], env=env, input=input)


def events(live: LiveHistory) -> list[dict[str, Any]]:
    with live.server.client() as c:
        return list(c.get("/v1/events", params={"limit": 10_000}).json())


def run_times(log: list[dict[str, Any]]) -> dict[str, float]:
    """Per job, the run time of its last attempt that ended, from the event log itself."""
    started: dict[str, float] = {}
    out: dict[str, float] = {}
    for e in log:
        if e["event"] == "start":
            started[e["job"]] = e["t"]
        elif e["event"] in ("finish", "fail", "cancel", "preempt", "lost", "restart") and e["job"] in started:
            out[e["job"]] = e["t"] - started.pop(e["job"])
    return out


def revisions(live: LiveHistory) -> list[dict[str, Any]]:
    with live.server.client() as c:
        return list(c.get("/v1/config/revisions").json()["revisions"])


def test_export_matches_the_event_log_job_by_job(live: LiveHistory, tmp_path: Path) -> None:
    out, cluster = tmp_path / "trace.csv", tmp_path / "cluster.yaml"
    result = corral(live, "trace", "export", "--since", "1h", "-o", out, "--cluster", cluster)
    assert result.exit_code == 0, result.output
    assert f"exported {JOBS + 2} of {JOBS + 4} jobs submitted" in result.output
    assert "still running" in result.output and "running 1" in result.output
    assert "1 pending before starting" in result.output and "1 cancelled before starting" in result.output

    trace = read_trace(out, largest_node_gpus=8)  # the simulator reads it as any trace
    with out.open() as handle:
        rows = {r["job_id"]: r for r in csv.DictReader(handle)}
    assert len(trace) == len(rows) == JOBS + 2
    log = events(live)
    ran = run_times(log)
    submits = {e["job"]: e for e in log if e["event"] == "submit"}
    origin = min(s["t"] for s in submits.values() if s["job"] in rows)
    for _, key, spec in live.jobs:
        job = live.ids[key]
        row = rows[job]
        shape = (row["queue"], int(row["gpus"]), int(row["replicas"]))
        assert shape == (spec["queue"], spec["gpus_per_replica"], 1)
        assert row["observed"] == "finished"
        assert float(row["duration"]) == pytest.approx(ran[job], abs=1e-5)
        slept = float(spec["command"][1])
        assert slept <= float(row["duration"]) <= slept + START_LATENCY, (job, row["duration"], slept)
        assert float(row["submit_time"]) == pytest.approx(submits[job]["t"] - origin, abs=1e-5)
        assert row["time_limit"] == "600" and row["user"] == submits[job]["user"]
    assert rows[live.extra["running"]]["observed"] == "running"
    assert rows[live.extra["cancelled_running"]]["observed"] == "cancelled"
    assert float(rows[live.extra["cancelled_running"]]["duration"]) == pytest.approx(
        ran[live.extra["cancelled_running"]], abs=1e-5
    )
    assert live.extra["pending"] not in rows and live.extra["cancelled_pending"] not in rows

    nodes = load_cluster_file(cluster)  # a valid cluster file: the nodes as they were
    assert sorted((n.name, n.gpus, n.gpu_model) for n in nodes.nodes) == [
        ("n1", 8, "H100-80GB"), ("n2", 8, "H100-80GB"),
    ]  # fmt: skip
    assert [q.name for q in nodes.queues] == ["research", "prod"]


def test_whatif_of_a_quota_change_side_by_side_with_report(live: LiveHistory, tmp_path: Path) -> None:
    queues = tmp_path / "queues.yaml"
    queues.write_text(
        "queues:\n  - {name: research, weight: 1, quota: 2}\n  - {name: prod, weight: 1, quota: 12}\n"
    )
    report = tmp_path / "report"
    result = corral(live, "whatif", "--since", "1h", "--queues", queues, "--report", report, "--json")
    assert result.exit_code == 0, result.output
    found = json.loads(result.stdout)
    assert found["fidelity_text"].startswith("fidelity: ")
    fid = found["fidelity"]["queues"]
    assert set(fid) == {"research", "prod", "(all)"}
    assert fid["(all)"]["jobs"] == JOBS + 2  # every job that started live
    for queue in ("research", "prod", "(all)"):
        for side in ("baseline", "proposed"):
            assert found[side][queue]["avg_wait"] is not None and found[side][queue]["gpu_hours"] > 0
    assert found["proposed"]["prod"]["quota_gpu_hours"] > 2.5 * found["baseline"]["prod"]["quota_gpu_hours"]
    base, prop = found["baseline"]["prod"], found["proposed"]["prod"]
    diff = found["difference"]["prod"]["quota_gpu_hours"]
    assert diff == pytest.approx(prop["quota_gpu_hours"] - base["quota_gpu_hours"])
    html = (report / "index.html").read_text()
    assert "baseline (revision" in html and "proposed: queues of queues.yaml" in html

    text = corral(live, "whatif", "--since", "1h", "--queues", queues)
    assert text.exit_code == 0, text.output
    assert text.output.splitlines()[0].startswith("fidelity: baseline average wait per queue")
    assert "avg wait (s)" in text.output and "GPU-hours of quota" in text.output


def test_queues_set_what_if_keeps_the_evidence_with_the_revision_and_audit(live: LiveHistory) -> None:
    before = len(revisions(live))
    result = corral(
        live, "queues", "set", "prod", "--quota", "6", "--what-if", "--since", "1h", "--yes",
        "--report", "whatif-prod-quota",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[0].startswith("fidelity: ")
    assert "the what-if is kept with it" in result.output
    revs = revisions(live)
    assert len(revs) == before + 1
    evidence = revs[-1]["evidence"]["what_if"]
    assert evidence["window_days"] == pytest.approx(1 / 24, rel=0.01) and evidence["jobs"] == JOBS + 2
    assert evidence["report"] == "whatif-prod-quota" and evidence["summary"].startswith("fidelity: ")
    history = corral(live, "queues", "history")
    assert "what-if 0.0417d" in history.output and "report whatif-prod-quota" in history.output
    with live.server.client() as c:
        audit = c.get("/v1/audit", params={"action": "/v1/queues/prod"}).json()
        assert any("what-if over 0.0417 days" in r["detail"] for r in audit["audit"]), audit
        listed = c.get("/v1/reports").json()["reports"]
        assert any(r["name"] == "whatif-prod-quota" and r["title"].startswith("what-if") for r in listed)
        one = c.get(f"/v1/config/revisions/{revs[-1]['revision']}").json()
        assert one["evidence"]["what_if"]["report"] == "whatif-prod-quota"
        assert next(q for q in one["config"]["queues"] if q["name"] == "prod")["quota"] == 6


def test_a_server_requiring_evidence_refuses_a_blind_change_unless_forced(live: LiveHistory) -> None:
    before = len(revisions(live))
    blind = corral(live, "queues", "set", "research", "--weight", "2")
    assert blind.exit_code == 1 and "requires a what-if over at least 0.01 days" in blind.output
    short = corral(live, "queues", "set", "research", "--weight", "2", "--what-if", "--since", "5m", "--yes")
    assert short.exit_code == 1 and "got a what-if over 0.00347" in short.output
    no_reason = corral(live, "queues", "set", "research", "--weight", "2", "--force")
    assert no_reason.exit_code == 2 and "--force needs a reason" in no_reason.output
    assert len(revisions(live)) == before  # nothing applied
    forced = corral(live, "admin", "policy", "default", "--force", "--reason", "incident 42: revert now")
    assert forced.exit_code == 0, forced.output
    revs = revisions(live)
    assert revs[-1]["evidence"] == {"forced": {"reason": "incident 42: revert now", "required_days": 0.01}}
    with live.server.client() as c:
        audit = c.get("/v1/audit", params={"action": "/v1/policy"}).json()["audit"]
        assert "forced: incident 42: revert now" in audit[-1]["detail"]


def test_bad_input_is_refused_with_nothing_applied(live: LiveHistory) -> None:
    before = len(revisions(live))
    hour_ago = time.time() - 3600
    early = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(hour_ago - 600))
    late = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(hour_ago))
    empty = corral(live, "whatif", "--since", early, "--until", late, "--policy", "fifo")
    assert empty.exit_code == 2 and "no finished job" in empty.output and "longer window" in empty.output
    unknown = corral(live, "whatif", "--since", "1h", "--revision", "999")
    assert unknown.exit_code == 3 and "no configuration revision 999" in unknown.output
    invalid = corral(live, "queues", "set", "prod", "--quota", "64", "--what-if", "--since", "1h", "--yes")
    assert invalid.exit_code == 2 and "the proposed configuration" in invalid.output, invalid.output
    bad_policy = corral(live, "admin", "policy", "nosuch", "--what-if", "--since", "1h", "--yes")
    assert bad_policy.exit_code == 2 and "nosuch" in bad_policy.output, bad_policy.output
    member = live.server.token("viewer", "member", team="research")
    with live.server.client(member) as c:
        refused = c.get("/v1/history", params={"since": hour_ago})
        assert refused.status_code == 403 and "only an admin" in refused.json()["error"]
    declined = corral(
        live, "queues", "set", "prod", "--quota", "5", "--what-if", "--since", "1h", input="n\n"
    )
    assert declined.exit_code == 1 and "not applied" in declined.output
    assert len(revisions(live)) == before
