"""`corral submit`, `jobs`, `show`, `cancel`, `hold`, `release`, `requeue`, `events`, `usage` against a
real control plane (SQLite and PostgreSQL): what they print, and the exit codes a script relies on."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.cli.conftest import Cli
from tests.server.harness import FakeAgent, free_port, wait_for

CLI = [sys.executable, "-c", "from corral.cli.main import main; main()"]


def test_submit_with_every_flag_prints_the_job_object_of_the_api(cli: Cli) -> None:
    cli.ok("admin", "pause")  # no scheduling cycle: the job stays as submitted, but for its reason
    cli.ok("queues", "set", "research", "--mount-allow", "/datasets")
    job = cli.json(
        "submit", "--name", "train", "--queue", "research", "--priority", "high", "--replicas", 2,
        "--gpus-per-replica", 4, "--launch", "per_node", "--gpu-model", "H100-80GB", "--pack", "leaf",
        "--pack-required", "--time-limit", "2h", "--no-preemptible", "--checkpoint-signal", "SIGUSR1",
        "--checkpoint-grace", "90s", "--max-restarts", 1, "--env", "WANDB_MODE=offline",
        "--mount", "/datasets/imagenet:/data:ro", "--", "python", "train.py", "--epochs", "3",
    )  # fmt: skip
    assert job["state"] == "pending" and job["queue"] == "research" and job["name"] == "train"
    assert (job["replicas"], job["gpus_per_replica"], job["launch"]) == (2, 4, "per_node")
    assert (job["priority_class"], job["time_limit"], job["preemptible"]) == ("high", 7200, False)
    assert job["topology"] == {"pack": "leaf", "required": True} and job["gpu_model"] == ["H100-80GB"]
    assert job["command"] == ["python", "train.py", "--epochs", "3"] and job["max_restarts"] == 1

    def but_reason(j: dict[str, Any]) -> dict[str, Any]:
        assert j["reason_code"] in ("", "paused"), j  # pending jobs say that scheduling is paused
        return {k: v for k, v in j.items() if not k.startswith("reason")}

    with cli.server.client() as c:
        assert but_reason(c.get(f"/v1/jobs/{job['id']}").json()) == but_reason(job)
    assert but_reason(cli.json("show", job["id"])) == but_reason(job)
    plain = cli.ok("submit", "--queue", "prod", "--gpus", 2, "--", "sleep", "1").stdout
    assert plain.split()[0] == "j2" and "queue prod (2 GPUs): pending" in plain


def test_submit_from_a_file_with_flags_that_override_it(cli: Cli, tmp_path: Path) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text("name: from-file\nqueue: research\ngpus_per_replica: 2\ncommand: [python, eval.py]\n")
    job = cli.json("submit", "-f", spec, "--gpus-per-replica", 4, "--name", "overridden")
    assert (job["name"], job["queue"], job["gpus_per_replica"]) == ("overridden", "research", 4)
    assert job["command"] == ["python", "eval.py"]
    spec.write_text("name: x\ntime_limit: 4\ncommand: [echo]\n")
    bad = cli("submit", "-f", spec)
    assert bad.exit_code == 2
    assert f"error: {spec}:2: time_limit: duration 4 has no unit" in bad.stderr
    spec.write_text("name: x\ngpu_per_replica: 4\ncommand: [echo]\n")
    typo = cli("submit", "-f", spec)
    assert typo.exit_code == 2 and [j["id"] for j in cli.json("jobs")["jobs"]] == [job["id"]]
    assert (
        f"error: {spec}:2: gpu_per_replica: unknown field `gpu_per_replica` "
        "(fix: did you mean `gpus_per_replica`?)" in typo.stderr
    )


def test_bad_input_exits_2_and_a_job_that_can_never_run_exits_1(cli: Cli) -> None:
    cases = {
        ("submit", "--queue", "nope", "--", "true"): "unknown queue 'nope' (fix: use one of: research, prod)",
        ("submit", "--", "python train.py"): 'write the argv as a list: ["python", "train.py"]',
        ("submit", "--gpus", 12, "--", "true"): "--gpus 12: 12 GPUs do not fit one node (the largest has 8) "
        "(fix: split them: --replicas 3 --gpus-per-replica 4)",
        ("submit", "--env", "NOVALUE", "--", "true"): "--env: 'NOVALUE' is not NAME=VALUE",
        ("submit", "--gpus", 2, "--replicas", 2, "--", "true"): "--gpus is shorthand",
        ("submit", "--time-limit", "4", "--", "true"): "time_limit: duration '4' has no unit",
    }
    for args, message in cases.items():
        result = cli(*args)
        assert result.exit_code == 2, (args, result.output)
        assert result.stderr.startswith("error: ") and message in result.stderr, result.stderr
    never = cli("submit", "--queue", "research", "--gpu-model", "A100*", "--gpus", 1, "--", "true")
    assert never.exit_code == 1 and "can never run on this cluster" in never.stderr
    with cli.server.client() as c:
        assert c.get("/v1/jobs", params={"state": "pending"}).json()["jobs"] == []


def test_jobs_show_hold_release_cancel_requeue(cli: Cli) -> None:
    first = cli.json("submit", "--name", "a", "--queue", "research", "--gpus", 4, "--", "sleep", "9")["id"]
    second = cli.json("submit", "--name", "b", "--queue", "prod", "--gpus", 8, "--", "sleep", "9")["id"]
    waiting = wait_for(lambda: cli.json("show", first)["reason"])  # no node is up yet
    shown = cli.ok("show", first).stdout
    assert "state:       pending" in shown and f"reason:      {waiting}" in shown
    assert "history:" in shown and "submit     queue research, 4 GPUs, normal" in shown
    assert "waiting    " + waiting in shown
    held = cli.ok("hold", first, second).stdout.splitlines()
    assert held == [f"{first}: pending (held)", f"{second}: pending (held)"]
    listed = cli.ok("jobs").stdout.splitlines()
    assert listed[0].split() == [
        "ID",
        "NAME",
        "STATE",
        "QUEUE",
        "USER",
        "GPUS",
        "AGE",
        "EST.",
        "LEFT",
        "PLACEMENT",
        "OR",
        "REASON",
    ]
    assert listed[1].split()[:4] == [first, "a", "pending", "(held)"]
    assert cli.ok("release", first).stdout.strip() == f"{first}: pending"

    agent = FakeAgent(cli.server, "dgx01", 8, "H100-80GB")
    agent.register()
    running = wait_for(lambda: (j := cli.json("show", first))["state"] == "starting" and j)
    assert running["placement"][0]["node"] == "dgx01"
    assert agent.report(first, 1, "running").status_code == 200
    assert f"{first}  a     running  research  admin  4" in cli.ok("jobs", "--queue", "research").stdout
    assert "dgx01:" in cli.ok("show", first).stdout

    cancelled = cli("cancel", second, "j404")  # one refused: the other is still cancelled
    assert cancelled.exit_code == 3 and cancelled.stdout.strip() == f"{second}: cancelled"
    assert "error: no job j404 that you may see" in cancelled.stderr
    again = cli("cancel", second)
    assert again.exit_code == 1 and f"job {second} is cancelled: nothing to cancel" in again.stderr
    stopping = cli.json("requeue", first)
    assert stopping["state"] == "stopping"
    assert [j["id"] for j in cli.json("jobs")["jobs"]] == [first]
    assert [j["id"] for j in cli.json("jobs", "--all")["jobs"]] == [first, second]
    assert [j["id"] for j in cli.json("jobs", "--state", "cancelled")["jobs"]] == [second]
    assert cli.json("jobs", "--user", "nobody")["jobs"] == []
    usage = cli.json("usage")["usage"]
    assert [(u["queue"], u["user"]) for u in usage] == [("research", "admin")] and usage[0]["gpu_hours"] > 0
    assert "research  admin" in cli.ok("usage", "--since", "1h").stdout
    agent.close()


def test_a_gang_of_one_gpu_replicas_prints_one_entry_per_node_and_a_pending_job_its_last_attempt(
    cli: Cli,
) -> None:
    agent = FakeAgent(cli.server, "dgx01", 8, "H100-80GB")
    agent.register()
    gang = cli.json("submit", "--queue", "research", "--replicas", 4, "--gpus-per-replica", 1, "--", "true")[
        "id"
    ]
    placed = wait_for(lambda: (j := cli.json("show", gang))["placement"] and j)
    assert [p["gpus"] for p in placed["placement"]] == [[0], [1], [2], [3]]
    assert "dgx01:0-3" in cli.ok("jobs").stdout and "placement:   dgx01:0-3\n" in cli.ok("show", gang).stdout
    assert agent.report(gang, 1, "running").status_code == 200
    assert "started:" in cli.ok("show", gang).stdout
    cli.ok("requeue", gang)
    cli.ok("admin", "pause")  # it stays pending, not started again at once
    assert agent.report(gang, 1, "exited", 143).status_code == 200
    wait_for(lambda: cli.json("show", gang)["state"] == "pending")
    shown = cli.ok("show", gang).stdout
    assert "started:" not in shown and "exit code:" not in shown  # they are not the next attempt's
    assert "attempt 1:   started " in shown and ", exit code 143" in shown, shown
    agent.close()


def test_show_and_jobs_print_the_estimates_of_a_pending_and_a_running_job(cli: Cli) -> None:
    """`corral show`: a pending job's estimated run time and the finished jobs it draws on, its
    reserved start, a running job's estimated end; `corral jobs`: the EST. LEFT column."""
    agent = FakeAgent(cli.server, "dgx01", 8, "H100-80GB")
    agent.register()

    def run(job_id: str) -> None:
        wait_for(lambda: cli.json("show", job_id)["state"] == "starting")
        assert agent.report(job_id, 1, "running").status_code == 200

    first = cli.json("submit", "--queue", "research", "--gpus", 6, "--", "true")["id"]
    run(first)
    assert "estimate:" not in cli.ok("show", first).stdout  # no history yet
    assert agent.report(first, 1, "exited", 0).status_code == 200
    wait_for(lambda: cli.json("show", first)["state"] == "finished")
    running = cli.json("submit", "--queue", "research", "--gpus", 6, "--time-limit", "1h", "--", "true")["id"]
    run(running)
    waiting = cli.json("submit", "--name", "eval", "--queue", "research", "--gpus", 4, "--", "true")["id"]
    wait_for(lambda: (j := cli.json("show", waiting))["reserved_start"] and j["estimate"] is not None, 15)
    pending = cli.ok("show", waiting).stdout
    assert "reserved:    to start at " in pending and "(in 59m)" in pending, pending  # the 1 h limit's end
    assert "estimate:    runs about " in pending, pending
    assert "(from 1 finished job of the cluster); not a limit" in pending, pending
    shown = wait_for(lambda: (j := cli.json("show", running))["estimate"] is not None and j, 15)
    assert shown["estimated_end"] is not None
    ending = cli.ok("show", running).stdout
    assert "estimate:    ends about " in ending and "; not a limit" in ending, ending
    assert "reserved:" not in ending
    rows = {line.split()[0]: line for line in cli.ok("jobs").stdout.splitlines()[1:]}
    assert " ~" in rows[waiting] and " ~" in rows[running], rows  # EST. LEFT
    agent.close()


def test_show_and_jobs_print_a_job_arrays_estimates(cli: Cli) -> None:
    """`corral show ARRAY`: what each task should run and when its running tasks should end;
    `corral jobs`: the array's line has an EST. LEFT (its longest task's)."""
    agent = FakeAgent(cli.server, "dgx01", 8, "H100-80GB")
    agent.register()
    first = cli.json("submit", "--queue", "research", "--gpus", 6, "--", "true")["id"]
    wait_for(lambda: cli.json("show", first)["state"] == "starting")
    assert agent.report(first, 1, "running").status_code == 200
    assert agent.report(first, 1, "exited", 0).status_code == 200
    wait_for(lambda: cli.json("show", first)["state"] == "finished")
    base = cli.json("submit", "--queue", "research", "--gpus", 6, "--array", "0-2%1", "--", "true")["id"]
    wait_for(lambda: cli.json("show", f"{base}_0")["state"] == "starting")
    assert agent.report(f"{base}_0", 1, "running").status_code == 200
    wait_for(
        lambda: (a := cli.json("show", base))["estimated_end"] is not None and a["estimate"] is not None, 15
    )
    shown = cli.ok("show", base).stdout
    assert "estimate:          each task runs about " in shown, shown
    assert "(from 1 finished job of the cluster); not a limit" in shown, shown
    assert "running tasks end: about " in shown and "(the last, estimated)" in shown, shown
    row = next(line for line in cli.ok("jobs").stdout.splitlines() if line.startswith(f"{base}["))
    assert " ~" in row, row  # EST. LEFT
    agent.close()


def test_events_as_json_lines_with_increasing_seq(cli: Cli) -> None:
    for queue in ("research", "prod"):
        cli.ok("submit", "--queue", queue, "--gpus", 1, "--", "true")
    lines = cli.ok("events", "--json").stdout.splitlines()
    events = [json.loads(line) for line in lines]
    seqs = [e["seq"] for e in events]
    assert seqs == sorted(set(seqs)) and events[0]["event"] == "cluster"
    assert [e["event"] for e in events if e["event"] != "cluster"] == ["submit", "submit"]
    with cli.server.client() as c:
        assert events == c.get("/v1/events").json()  # exactly the API's objects
    later = [json.loads(line) for line in cli.ok("events", "--json", "--after", seqs[-2]).stdout.splitlines()]
    assert later == events[-1:]
    readable = cli.ok("events").stdout.splitlines()
    assert (
        readable[-1].split()[0] == str(seqs[-1]) and "submit" in readable[-1] and "queue prod" in readable[-1]
    )


def test_events_follow_prints_new_events_until_interrupted(cli: Cli) -> None:
    env = dict(os.environ, CORRAL_SERVER=cli.server.url, CORRAL_TOKEN=cli.server.admin_token)
    env["CORRAL_CONFIG"] = str(cli.config)
    follow = subprocess.Popen(
        [*CLI, "events", "--follow", "--json"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert follow.stdout is not None
        assert json.loads(follow.stdout.readline())["event"] == "cluster"
        job = cli.json("submit", "--queue", "research", "--gpus", 1, "--", "true")["id"]
        submitted = json.loads(follow.stdout.readline())
        assert (submitted["event"], submitted["job"]) == ("submit", job)
    finally:
        follow.send_signal(signal.SIGINT)
        _, err = follow.communicate(timeout=20)
    assert follow.returncode == 0, err
    # the server's side of the interrupted long poll waits for an event (or its 30 s) and holds
    # up the server's shutdown meanwhile: give it one
    cli.ok("cancel", job)


def test_an_unreachable_server_exits_4_and_says_how_to_start_one(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    env = dict(os.environ, CORRAL_SERVER=url, CORRAL_CONFIG=str(tmp_path / "none.json"))
    started = time.monotonic()
    proc = subprocess.run([*CLI, "jobs"], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 4, proc.stderr
    assert proc.stderr.startswith(f"error: the Corral server at {url} is not reachable")
    assert "(fix: start one with `corral up`" in proc.stderr and proc.stdout == ""
    assert time.monotonic() - started < 30
